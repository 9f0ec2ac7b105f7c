#include "runtime/trace_writer.h"

#include <cstdio>

namespace substrate {
namespace {
constexpr size_t kFlushBytes = 1 << 18;
}  // namespace

std::string JsonQuote(const std::string& s) {
  std::string out = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (static_cast<unsigned char>(c) < 0x20) {
      char b[8];
      std::snprintf(b, sizeof b, "\\u%04x", c);
      out += b;
    } else {
      out += c;
    }
  }
  return out + "\"";
}

Expected<std::unique_ptr<TraceWriter>> TraceWriter::Open(const std::string& path, Env* env) {
  auto file = (env ? env : Env::Default())->NewWritableFile(path);
  if (!file.ok()) return file.status().WithContext("trace");
  std::unique_ptr<TraceWriter> w(new TraceWriter(path, std::move(*file)));
  w->thread_ = std::thread([p = w.get()] { p->WriterLoop(); });
  return w;
}

TraceWriter::~TraceWriter() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
  (void)file_->Close();
}

Status TraceWriter::WriteAll(const std::string& buf) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!error_.ok()) return error_;  // the disk filled: the log stops, the run goes on
  }
  std::lock_guard<std::mutex> write_lock(write_mu_);  // Flush and the writer thread
  Status st = file_->Append(buf.data(), buf.size());
  return st.ok() ? st : st.WithContext("trace");
}

void TraceWriter::WriterLoop() {
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    cv_.wait(lock, [&] { return stop_ || buf_.size() >= kFlushBytes; });
    pending_.swap(buf_);
    buf_.clear();
    if (!pending_.empty()) {
      lock.unlock();
      Status st = WriteAll(pending_);
      lock.lock();
      if (!st.ok() && error_.ok()) error_ = st;
      pending_.clear();
    }
    if (stop_ && buf_.empty()) return;
  }
}

void TraceWriter::Append(const std::string& line) {
  bool wake;
  {
    std::lock_guard<std::mutex> lock(mu_);
    buf_ += line;
    wake = buf_.size() >= kFlushBytes;
  }
  if (wake) cv_.notify_one();
}

Status TraceWriter::Flush() {
  std::string out;
  {
    std::lock_guard<std::mutex> lock(mu_);
    out.swap(buf_);
  }
  Status st = WriteAll(out);
  std::lock_guard<std::mutex> lock(mu_);
  return error_.ok() ? st : error_;
}

void TraceWriter::Op(const OpEvent& e) {
  char tail[256];
  std::snprintf(tail, sizeof tail,
                ",\"where\":\"%s\",\"tier\":%d,\"bytes\":%llu,\"start_us\":%lld,\"end_us\":%lld,"
                "\"hit\":%s,\"stall_us\":%lld%s}\n",
                e.where, e.tier, static_cast<unsigned long long>(e.bytes),
                static_cast<long long>(e.start_us), static_cast<long long>(e.end_us),
                e.hit ? "true" : "false", static_cast<long long>(e.stall_us),
                e.skip ? ",\"skip\":true" : "");
  Append("{\"ev\":\"op\",\"op\":" + JsonQuote(*e.op) + tail);
}

void TraceWriter::Read(const ReadEvent& e) {
  char tail[256];
  std::snprintf(tail, sizeof tail,
                ",\"offset\":%llu,\"bytes\":%llu,\"start_us\":%lld,\"end_us\":%lld,"
                "\"direct\":%s,\"uring\":%s,\"issue_us\":%lld,\"during\":",
                static_cast<unsigned long long>(e.offset), static_cast<unsigned long long>(e.bytes),
                static_cast<long long>(e.start_us), static_cast<long long>(e.end_us),
                e.direct ? "true" : "false", e.uring ? "true" : "false",
                static_cast<long long>(e.issue_us));
  Append("{\"ev\":\"read\",\"op\":" + JsonQuote(*e.op) + ",\"file\":" + JsonQuote(*e.file) + tail +
         JsonQuote(e.during ? *e.during : std::string()) + "}\n");
}

void TraceWriter::Runtime(const char* ev, const std::string& fields, int64_t at_us) {
  const std::string at = std::to_string(at_us);
  Append(std::string("{\"ev\":\"") + ev + "\"," + fields + ",\"start_us\":" + at +
         ",\"end_us\":" + at + "}\n");
}

}  // namespace substrate
