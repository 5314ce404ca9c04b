#pragma once
// Exceptions thrown by push. Every message names its origin and the offending value:
//   "[push::Push::p_launch] unknown particle id 42 (the distribution has ids 0..3)".
#include <c10/util/StringUtil.h>

#include <exception>
#include <stdexcept>
#include <string>

namespace push {

/// Base of every error push raises for bad input or a failed operation.
class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// An exception escaped particle code (a handler, forward, step, ...). `what()` names the
/// particle and the message; `cause()` is the original exception.
class ParticleError : public Error {
 public:
  ParticleError(int64_t pid, std::string message, const std::string& detail, std::exception_ptr cause)
      : Error(c10::str("[push] particle ", pid, ", message '", message, "': ", detail)),
        pid_(pid),
        message_(std::move(message)),
        cause_(std::move(cause)) {}
  int64_t pid() const { return pid_; }
  const std::string& message_name() const { return message_; }
  const std::exception_ptr& cause() const { return cause_; }

 private:
  int64_t pid_;
  std::string message_;
  std::exception_ptr cause_;
};

/// Work that the distribution dropped because it was shutting down.
class CancelledError : public Error {
 public:
  using Error::Error;
};

namespace detail {
/// The text of an exception without LibTorch's C++ backtrace.
std::string describe(const std::exception_ptr& error);
}  // namespace detail

}  // namespace push

/// Throws push::Error("[origin] message...") when `cond` is false.
#define PUSH_CHECK(cond, origin, ...)                                  \
  do {                                                                 \
    if (!(cond)) {                                                     \
      throw ::push::Error(::c10::str("[", origin, "] ", __VA_ARGS__)); \
    }                                                                  \
  } while (false)
