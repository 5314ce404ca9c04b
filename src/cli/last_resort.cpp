// A std::terminate handler that reports in one line and cleans up.
#include "last_resort.h"

#include <c10/util/Exception.h>

#include <pthread.h>
#include <unistd.h>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <exception>

#include "core/staged_folder.h"

namespace push::cli {
namespace {

const char* g_tool = "push";
char g_activity[512] = "";
std::atomic<bool> g_has_activity{false};
std::atomic<bool> g_terminating{false};
std::atomic<pthread_t> g_terminator{};

std::string first_line(const std::string& text) { return text.substr(0, text.find('\n')); }

[[noreturn]] void on_terminate() {
  const int err = errno;  // the failed write's, when a writer threw on it
  if (g_terminating.exchange(true)) {
    // A recursive terminate ends at once; another thread waits for the first to clean up.
    if (pthread_equal(g_terminator.load(), pthread_self())) ::_exit(1);
    for (;;) ::pause();
  }
  g_terminator.store(pthread_self());
  std::string what = "an unexpected error";
  if (auto e = std::current_exception()) {
    try {
      std::rethrow_exception(e);
    } catch (const c10::Error& x) {
      what = first_line(x.what_without_backtrace());
    } catch (const std::exception& x) {
      what = first_line(x.what());
    } catch (...) {
    }
  }
  std::string line = std::string(g_tool) + ": ";
  if (g_has_activity.load()) line += std::string(g_activity) + ": ";
  if (err != 0)
    line += std::string(std::strerror(err)) + " (" + what + ")\n";
  else
    line += what + "\n";
  ssize_t ignored = ::write(STDERR_FILENO, line.data(), line.size());
  (void)ignored;
  push::detail::StagedFolder::abandon_all();
  ::_exit(1);
}

}  // namespace

void install_last_resort(const char* tool) {
  g_tool = tool;
  std::set_terminate(on_terminate);
}

Activity::Activity(const std::string& what) {
  std::snprintf(g_activity, sizeof(g_activity), "%s", what.c_str());
  g_has_activity.store(true);
}

Activity::~Activity() { g_has_activity.store(false); }

}  // namespace push::cli
