// Status and Expected<T>: how library code reports failure (no exceptions across modules).
//
// A Status is a code plus a message that names the problem ("gguf: tensor 'blk.0.attn_q.weight'
// offset 123 past end of file (size 100)"). The CLI turns a failed Status into that message on
// stderr and a non-zero exit.
#pragma once

#include <cassert>
#include <optional>
#include <string>
#include <utility>
#include <variant>

namespace substrate {

enum class StatusCode {
  kOk = 0,
  kInvalidArgument,  // the caller (user input, flags, request) is wrong
  kNotFound,         // a file, tensor, key or op that does not exist
  kCorruption,       // a file whose contents are malformed or fail a checksum
  kIOError,          // the OS refused a read/write/open
  kOutOfMemory,      // the memory ledger (or the OS) refused an allocation
  kInfeasible,       // a plan or budget that cannot be met
  kUnimplemented,    // a format or architecture we do not support (yet)
  kInternal,         // a bug: an invariant of our own was broken
  kCancelled,        // the work was stopped on purpose (client gone, signal)
};

const char* StatusCodeName(StatusCode code);

class [[nodiscard]] Status {
 public:
  Status() = default;
  Status(StatusCode code, std::string message) : code_(code), message_(std::move(message)) {}

  static Status Ok() { return Status(); }
  bool ok() const { return code_ == StatusCode::kOk; }
  StatusCode code() const { return code_; }
  const std::string& message() const { return message_; }
  // "Corruption: gguf: ..." — for logs and the CLI.
  std::string ToString() const;

  // Prefixes context to the message: "loading model.gguf: " + message.
  Status WithContext(const std::string& context) const;

 private:
  StatusCode code_ = StatusCode::kOk;
  std::string message_;
};

inline Status InvalidArgument(std::string m) { return {StatusCode::kInvalidArgument, std::move(m)}; }
inline Status NotFound(std::string m) { return {StatusCode::kNotFound, std::move(m)}; }
inline Status Corruption(std::string m) { return {StatusCode::kCorruption, std::move(m)}; }
inline Status IOError(std::string m) { return {StatusCode::kIOError, std::move(m)}; }
inline Status OutOfMemory(std::string m) { return {StatusCode::kOutOfMemory, std::move(m)}; }
inline Status Infeasible(std::string m) { return {StatusCode::kInfeasible, std::move(m)}; }
inline Status Unimplemented(std::string m) { return {StatusCode::kUnimplemented, std::move(m)}; }
inline Status Internal(std::string m) { return {StatusCode::kInternal, std::move(m)}; }
inline Status Cancelled(std::string m) { return {StatusCode::kCancelled, std::move(m)}; }

// Either a value or a non-ok Status.
template <typename T>
class [[nodiscard]] Expected {
 public:
  Expected(T value) : value_(std::move(value)) {}  // NOLINT: implicit by design
  Expected(Status status) : status_(std::move(status)) {  // NOLINT: implicit by design
    assert(!status_.ok() && "Expected<T> built from an ok Status has no value");
    if (status_.ok()) status_ = Internal("Expected<T> built from an ok Status");
  }

  bool ok() const { return value_.has_value(); }
  const Status& status() const { return status_; }
  T& value() & { return *value_; }
  const T& value() const& { return *value_; }
  T&& value() && { return std::move(*value_); }
  T* operator->() { return &*value_; }
  const T* operator->() const { return &*value_; }
  T& operator*() & { return *value_; }
  const T& operator*() const& { return *value_; }

 private:
  std::optional<T> value_;
  Status status_;
};

}  // namespace substrate

#define SUBSTRATE_CONCAT_INNER(a, b) a##b
#define SUBSTRATE_CONCAT(a, b) SUBSTRATE_CONCAT_INNER(a, b)

// Returns the Status from the enclosing function if `expr` is not ok.
#define RETURN_IF_ERROR(expr)                      \
  do {                                             \
    ::substrate::Status _st = (expr);              \
    if (!_st.ok()) return _st;                     \
  } while (0)

// ASSIGN_OR_RETURN(auto x, MakeX()); declares x from an Expected or returns its Status.
#define ASSIGN_OR_RETURN(lhs, expr) \
  ASSIGN_OR_RETURN_IMPL(SUBSTRATE_CONCAT(_expected_, __LINE__), lhs, expr)
#define ASSIGN_OR_RETURN_IMPL(tmp, lhs, expr) \
  auto tmp = (expr);                          \
  if (!tmp.ok()) return tmp.status();         \
  lhs = std::move(tmp).value()
