// How the server reads requests off its sockets, under httplib's parser and router. httplib
// gives every connection a thread from accept to close, and its read timeout applies per read:
// a few clients sending one header byte every few seconds, or idling between requests, held
// every thread and starved /health. Here a connection holds a worker only while one complete
// request is served. Until its headers are complete (and between keep-alive requests) it waits
// in one epoll thread, under an overall deadline: the headers must arrive within
// header_timeout_ms of their first byte (else 408 and close), the body within
// request_timeout_ms, an idle connection is closed after keep_alive_ms.
//
// Handlers can ask, on the thread serving their request, whether its client has gone
// (ClientGone), so that a long non-streaming generation frees its slot when nobody waits.
#pragma once

#include <httplib.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

namespace substrate::serve {

struct ConnectionLimits {
  int workers = 8;                 // requests served at once (each holds a thread)
  int header_timeout_ms = 10000;   // a request's first byte to the end of its headers
  int request_timeout_ms = 60000;  // its first byte to the end of its body
  int keep_alive_ms = 5000;        // an idle connection waits this long for a next request
  int read_timeout_ms = 30000;     // one read of a body
  int write_timeout_ms = 10000;    // one write of a response
  int max_connections = 4096;      // waiting for a request (idle or in headers); more are closed
  int max_header_bytes = 65536;    // request line and headers; more: 431
  int keep_alive_max = 1000;       // requests per connection
};

struct ConnectionCounters {
  std::atomic<uint64_t> header_timeouts{0};  // 408: headers not complete in time
  std::atomic<uint64_t> refused{0};          // closed at once: max_connections waiting
  std::atomic<uint64_t> too_large{0};        // 431: headers over max_header_bytes
};

class ConnectionServer : public httplib::Server {
 public:
  explicit ConnectionServer(const ConnectionLimits& limits);
  ~ConnectionServer() override;

  // Listening again on the bound socket raises httplib's fixed backlog of 5.
  bool RaiseBacklog(int backlog);
  // After httplib's stop(): closes the waiting connections and joins the workers (a request
  // being served ends first; its reads give up within 200 ms). Idempotent.
  void Shutdown();
  const ConnectionCounters& counters() const { return counters_; }

  // On the thread serving a request: whether its client has closed the connection (EOF or
  // reset), without consuming anything it sent. False elsewhere.
  static bool ClientGone();
  // On the thread serving a request: close the connection after this response (a request
  // answered before its body was read leaves that body unread).
  static void CloseAfterResponse();

 private:
  using Clock = std::chrono::steady_clock;
  struct Conn {
    int fd = -1;
    std::string buf;                 // bytes received and not yet parsed
    Clock::time_point deadline;      // keep-alive, or header deadline once started
    Clock::time_point first_byte{};  // of the request now arriving (set once started)
    bool started = false;
    int served = 0;  // requests answered on this connection
    // Answered and shut for writing, with input the server did not read (a rejected body): the
    // input is drained until the client closes or 2 s pass, since closing a socket with unread
    // input resets the connection and can lose the answer before the client reads it.
    bool linger = false;
  };

  bool process_and_close_socket(socket_t sock) override;
  void Wait(Conn c);  // hands a connection to the waiter (any thread)
  void WaiterLoop();
  void WorkerLoop();
  void Serve(Conn c);
  void Dispatch(Conn c);  // a complete header block: to the workers
  void Reject(Conn& c, const char* status_line);  // answers, then lingers
  void Linger(Conn c);

  ConnectionLimits limits_;
  ConnectionCounters counters_;
  int epoll_fd_ = -1, wake_fd_ = -1;
  std::atomic<bool> stopping_{false};
  std::mutex add_mu_;
  std::vector<Conn> adds_;                 // for the waiter to take
  std::unordered_map<int, Conn> waiting_;  // the waiter's own
  std::mutex work_mu_;
  std::condition_variable work_cv_;
  std::deque<Conn> ready_;
  std::thread waiter_;
  std::vector<std::thread> workers_;
  bool shut_down_ = false;
};

}  // namespace substrate::serve
