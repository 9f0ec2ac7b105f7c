#include "serve/connection.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "core/log.h"

namespace substrate::serve {
namespace {

using Clock = std::chrono::steady_clock;

// The connection the calling worker serves, for ClientGone / CloseAfterResponse.
thread_local int tl_fd = -1;
thread_local bool tl_close = false;

int Ms(Clock::duration d) {
  return static_cast<int>(std::chrono::duration_cast<std::chrono::milliseconds>(d).count());
}

void CloseSocket(int fd) {
  ::shutdown(fd, SHUT_RDWR);
  ::close(fd);
}

bool HeadersComplete(const std::string& b) {
  return b.find("\r\n\r\n") != std::string::npos;
}

// httplib refuses a line over CPPHTTPLIB_HEADER_MAX_LENGTH (8 KB) with a 400; the whole header
// block is bounded here too. Either is 431, as RFC 6585 has it.
bool HeadersTooLarge(const std::string& b, size_t max_block) {
  const size_t end = b.find("\r\n\r\n");
  const size_t block = end == std::string::npos ? b.size() : end;
  if (block > max_block) return true;
  size_t line_start = 0;
  for (;;) {
    const size_t nl = b.find("\r\n", line_start);
    const size_t line_end = std::min(nl == std::string::npos ? b.size() : nl, block);
    if (line_end - line_start > CPPHTTPLIB_HEADER_MAX_LENGTH - 2) return true;
    if (nl == std::string::npos || nl >= block) return false;
    line_start = nl + 2;
  }
}

void PeerAddress(int fd, bool local, std::string& ip, int& port) {
  sockaddr_storage a{};
  socklen_t n = sizeof a;
  const int rc = local ? ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &n)
                       : ::getpeername(fd, reinterpret_cast<sockaddr*>(&a), &n);
  ip.clear();
  port = 0;
  if (rc != 0) return;
  char text[INET6_ADDRSTRLEN] = {0};
  if (a.ss_family == AF_INET) {
    const auto* in = reinterpret_cast<const sockaddr_in*>(&a);
    ::inet_ntop(AF_INET, &in->sin_addr, text, sizeof text);
    port = ntohs(in->sin_port);
  } else if (a.ss_family == AF_INET6) {
    const auto* in = reinterpret_cast<const sockaddr_in6*>(&a);
    ::inet_ntop(AF_INET6, &in->sin6_addr, text, sizeof text);
    port = ntohs(in->sin6_port);
  }
  ip = text;
}

// A request's socket for httplib's parser: the bytes the waiter already received first, then
// the socket, each read under the request's overall deadline and the per-read timeout.
class ConnStream : public httplib::Stream {
 public:
  ConnStream(int fd, std::string buf, Clock::time_point request_deadline, const ConnectionLimits& l,
             const std::atomic<bool>& stopping)
      : fd_(fd),
        buf_(std::move(buf)),
        deadline_(request_deadline),
        limits_(l),
        stopping_(stopping) {}

  bool is_readable() const override {
    return pos_ < buf_.size() || Poll(POLLIN, limits_.read_timeout_ms);
  }
  bool is_writable() const override { return Poll(POLLOUT, limits_.write_timeout_ms); }

  ssize_t read(char* ptr, size_t size) override {
    if (pos_ < buf_.size()) {
      const size_t n = std::min(size, buf_.size() - pos_);
      std::memcpy(ptr, buf_.data() + pos_, n);
      pos_ += n;
      return static_cast<ssize_t>(n);
    }
    const Clock::time_point read_end =
        Clock::now() + std::chrono::milliseconds(limits_.read_timeout_ms);
    for (;;) {
      const Clock::time_point now = Clock::now();
      const Clock::time_point end = std::min(read_end, deadline_);
      if (now >= end || stopping_.load()) return Broken();
      pollfd p{fd_, POLLIN, 0};
      const int r = ::poll(&p, 1, std::min(200, std::max(1, Ms(end - now))));
      if (r < 0 && errno != EINTR) return Broken();
      if (r <= 0) continue;
      const ssize_t n = ::recv(fd_, ptr, size, MSG_DONTWAIT);
      if (n >= 0) return n;
      if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) return Broken();
    }
  }

  ssize_t write(const char* ptr, size_t size) override {
    const Clock::time_point end =
        Clock::now() + std::chrono::milliseconds(limits_.write_timeout_ms);
    for (;;) {
      const ssize_t n = ::send(fd_, ptr, size, MSG_NOSIGNAL | MSG_DONTWAIT);
      if (n >= 0) return n;
      if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) return Broken();
      const Clock::time_point now = Clock::now();
      if (now >= end || stopping_.load()) return Broken();
      pollfd p{fd_, POLLOUT, 0};
      (void)::poll(&p, 1, std::min(200, std::max(1, Ms(end - now))));
    }
  }

  void get_remote_ip_and_port(std::string& ip, int& port) const override {
    PeerAddress(fd_, false, ip, port);
  }
  void get_local_ip_and_port(std::string& ip, int& port) const override {
    PeerAddress(fd_, true, ip, port);
  }
  socket_t socket() const override { return fd_; }

  bool broken() const { return broken_; }
  // Bytes received past this request (a pipelined next one).
  std::string Leftover() { return buf_.substr(pos_); }

 private:
  bool Poll(short events, int timeout_ms) const {
    pollfd p{fd_, events, 0};
    return ::poll(&p, 1, timeout_ms) > 0 && (p.revents & events);
  }
  ssize_t Broken() {
    broken_ = true;
    return -1;
  }

  int fd_;
  std::string buf_;
  size_t pos_ = 0;
  Clock::time_point deadline_;
  const ConnectionLimits& limits_;
  const std::atomic<bool>& stopping_;
  bool broken_ = false;
};

}  // namespace

ConnectionServer::ConnectionServer(const ConnectionLimits& limits) : limits_(limits) {
  // httplib's own pool only hands accepted sockets over (process_and_close_socket returns at
  // once); requests are served by this class's workers.
  new_task_queue = [] { return new httplib::ThreadPool(2); };
  epoll_fd_ = ::epoll_create1(EPOLL_CLOEXEC);
  wake_fd_ = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.fd = wake_fd_;
  ::epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, wake_fd_, &ev);
  waiter_ = std::thread([this] { WaiterLoop(); });
  for (int i = 0; i < std::max(1, limits_.workers); ++i)
    workers_.emplace_back([this] { WorkerLoop(); });
}

ConnectionServer::~ConnectionServer() {
  Shutdown();
  ::close(epoll_fd_);
  ::close(wake_fd_);
}

bool ConnectionServer::RaiseBacklog(int backlog) {
  return ::listen(svr_sock_, backlog) == 0;
}

void ConnectionServer::Shutdown() {
  if (shut_down_) return;
  shut_down_ = true;
  stopping_.store(true);
  const uint64_t one = 1;
  (void)!::write(wake_fd_, &one, sizeof one);
  waiter_.join();
  work_cv_.notify_all();
  for (auto& w : workers_) w.join();
  for (auto& [fd, c] : waiting_) CloseSocket(fd);
  waiting_.clear();
  for (Conn& c : adds_) CloseSocket(c.fd);
  adds_.clear();
  for (Conn& c : ready_) CloseSocket(c.fd);
  ready_.clear();
}

bool ConnectionServer::ClientGone() {
  if (tl_fd < 0) return false;
  pollfd p{tl_fd, POLLIN | POLLRDHUP, 0};
  if (::poll(&p, 1, 0) <= 0) return false;
  if (p.revents & (POLLRDHUP | POLLHUP | POLLERR)) return true;
  char c;
  const ssize_t n = ::recv(tl_fd, &c, 1, MSG_PEEK | MSG_DONTWAIT);
  return n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR);
}

void ConnectionServer::CloseAfterResponse() {
  tl_close = true;
}

bool ConnectionServer::process_and_close_socket(socket_t sock) {
  Conn c;
  c.fd = sock;
  c.deadline = Clock::now() + std::chrono::milliseconds(limits_.header_timeout_ms);
  Wait(std::move(c));
  return true;
}

void ConnectionServer::Wait(Conn c) {
  if (stopping_.load()) return CloseSocket(c.fd);
  {
    std::lock_guard<std::mutex> lock(add_mu_);
    adds_.push_back(std::move(c));
  }
  const uint64_t one = 1;
  (void)!::write(wake_fd_, &one, sizeof one);
}

void ConnectionServer::Reject(Conn& c, const char* status_line) {
  const std::string r =
      std::string("HTTP/1.1 ") + status_line + "\r\nConnection: close\r\nContent-Length: 0\r\n\r\n";
  (void)::send(c.fd, r.data(), r.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
  Linger(std::move(c));
}

void ConnectionServer::Linger(Conn c) {
  ::shutdown(c.fd, SHUT_WR);
  c.linger = true;
  c.buf.clear();
  c.deadline = Clock::now() + std::chrono::milliseconds(2000);
  Wait(std::move(c));
}

void ConnectionServer::Dispatch(Conn c) {
  {
    std::lock_guard<std::mutex> lock(work_mu_);
    ready_.push_back(std::move(c));
  }
  work_cv_.notify_one();
}

void ConnectionServer::WaiterLoop() {
  std::vector<epoll_event> events(256);
  Clock::time_point next_sweep = Clock::now();
  while (!stopping_.load()) {
    const int n = ::epoll_wait(epoll_fd_, events.data(), static_cast<int>(events.size()), 100);
    if (n < 0 && errno != EINTR) {
      LOG_ERROR("serve: epoll_wait: %s", std::strerror(errno));
      break;
    }
    const Clock::time_point now = Clock::now();
    for (int i = 0; i < n; ++i) {
      const int fd = events[i].data.fd;
      if (fd == wake_fd_) {
        uint64_t v;
        (void)!::read(wake_fd_, &v, sizeof v);
        std::vector<Conn> adds;
        {
          std::lock_guard<std::mutex> lock(add_mu_);
          adds.swap(adds_);
        }
        for (Conn& c : adds) {
          if (!c.linger && !c.buf.empty() && HeadersComplete(c.buf)) {  // a pipelined request
            Dispatch(std::move(c));
            continue;
          }
          if (static_cast<int>(waiting_.size()) >= limits_.max_connections && !c.linger) {
            ++counters_.refused;
            CloseSocket(c.fd);
            continue;
          }
          ::fcntl(c.fd, F_SETFL, ::fcntl(c.fd, F_GETFL) | O_NONBLOCK);
          epoll_event ev{};
          ev.events = EPOLLIN | EPOLLRDHUP;
          ev.data.fd = c.fd;
          if (::epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, c.fd, &ev) != 0) {
            CloseSocket(c.fd);
            continue;
          }
          waiting_[c.fd] = std::move(c);
        }
        continue;
      }
      auto it = waiting_.find(fd);
      if (it == waiting_.end()) continue;
      Conn& c = it->second;
      bool gone = false;
      char chunk[16384];
      if (c.linger) {  // drain and drop what the client still sends, until it closes
        ssize_t got;
        while ((got = ::recv(fd, chunk, sizeof chunk, MSG_DONTWAIT)) > 0) {
        }
        if (got == 0 || (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) {
          ::epoll_ctl(epoll_fd_, EPOLL_CTL_DEL, fd, nullptr);
          CloseSocket(fd);
          waiting_.erase(it);
        }
        continue;
      }
      for (;;) {
        const ssize_t got = ::recv(fd, chunk, sizeof chunk, MSG_DONTWAIT);
        if (got > 0) {
          if (!c.started) {
            c.started = true;
            c.first_byte = now;
            c.deadline = now + std::chrono::milliseconds(limits_.header_timeout_ms);
          }
          c.buf.append(chunk, static_cast<size_t>(got));
          if (static_cast<int>(c.buf.size()) > limits_.max_header_bytes) break;
          continue;
        }
        if (got < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) break;
        if (got < 0 && errno == EINTR) continue;
        gone = true;  // EOF or an error: the client left before a whole request
        break;
      }
      if (HeadersTooLarge(c.buf, static_cast<size_t>(limits_.max_header_bytes))) {
        ++counters_.too_large;
        ::epoll_ctl(epoll_fd_, EPOLL_CTL_DEL, fd, nullptr);
        Conn rejected = std::move(c);
        waiting_.erase(it);
        Reject(rejected, "431 Request Header Fields Too Large");
      } else if (HeadersComplete(c.buf)) {
        ::epoll_ctl(epoll_fd_, EPOLL_CTL_DEL, fd, nullptr);
        Conn ready = std::move(c);
        waiting_.erase(it);
        Dispatch(std::move(ready));
      } else if (gone) {
        ::epoll_ctl(epoll_fd_, EPOLL_CTL_DEL, fd, nullptr);
        CloseSocket(fd);
        waiting_.erase(it);
      }
    }
    if (now < next_sweep) continue;
    next_sweep = now + std::chrono::milliseconds(50);
    for (auto it = waiting_.begin(); it != waiting_.end();) {
      Conn& c = it->second;
      if (c.deadline > now) {
        ++it;
        continue;
      }
      ::epoll_ctl(epoll_fd_, EPOLL_CTL_DEL, c.fd, nullptr);
      if (c.started && !c.linger) {
        ++counters_.header_timeouts;
        Conn late = std::move(c);
        it = waiting_.erase(it);
        Reject(late, "408 Request Timeout");
        continue;
      } else {
        CloseSocket(c.fd);  // idle keep-alive connection
      }
      it = waiting_.erase(it);
    }
  }
}

void ConnectionServer::WorkerLoop() {
  for (;;) {
    Conn c;
    {
      std::unique_lock<std::mutex> lock(work_mu_);
      work_cv_.wait(lock, [&] { return stopping_.load() || !ready_.empty(); });
      if (ready_.empty()) return;  // stopping
      c = std::move(ready_.front());
      ready_.pop_front();
    }
    Serve(std::move(c));
  }
}

void ConnectionServer::Serve(Conn c) {
  if (stopping_.load()) return CloseSocket(c.fd);
  const Clock::time_point start = c.started ? c.first_byte : Clock::now();
  ConnStream strm(c.fd, std::move(c.buf),
                  start + std::chrono::milliseconds(limits_.request_timeout_ms), limits_,
                  stopping_);
  tl_fd = c.fd;
  tl_close = false;
  bool closed = false;
  const bool last = c.served + 1 >= limits_.keep_alive_max;
  const bool ok = process_request(strm, last, closed, nullptr);
  tl_fd = -1;
  if (tl_close && !strm.broken() && !stopping_.load()) return Linger(std::move(c));
  if (!ok || closed || last || tl_close || strm.broken() || stopping_.load())
    return CloseSocket(c.fd);
  Conn next;
  next.fd = c.fd;
  next.served = c.served + 1;
  next.buf = strm.Leftover();
  const Clock::time_point now = Clock::now();
  next.started = !next.buf.empty();
  next.first_byte = now;
  next.deadline = now + std::chrono::milliseconds(next.started ? limits_.header_timeout_ms
                                                               : limits_.keep_alive_ms);
  Wait(std::move(next));
}

}  // namespace substrate::serve
