// A std::terminate handler that reports in one line and cleans up.
#include "last_resort.h"

#include <c10/util/Exception.h>

#include <pthread.h>
#include <sys/resource.h>
#include <unistd.h>
#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <exception>
#include <new>

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
  const std::exception_ptr e = std::current_exception();
  if (e) {
    try {
      std::rethrow_exception(e);
    } catch (const std::bad_alloc&) {
      // Out of memory, perhaps before main (LibTorch's static initialisers under a small
      // ulimit -v): the line is made without allocating, where even a short string fails.
      char line[256];
      rlimit as{};
      const bool limited = ::getrlimit(RLIMIT_AS, &as) == 0 && as.rlim_cur != RLIM_INFINITY;
      const int n = limited ? std::snprintf(line, sizeof(line),
                                            "%s: out of memory (std::bad_alloc) under the address-space limit "
                                            "(ulimit -v %llu): raise it\n",
                                            g_tool, static_cast<unsigned long long>(as.rlim_cur / 1024))
                            : std::snprintf(line, sizeof(line), "%s: out of memory (std::bad_alloc)\n", g_tool);
      ssize_t ignored = ::write(STDERR_FILENO, line, static_cast<size_t>(std::max(n, 0)));
      (void)ignored;
      push::detail::StagedFolder::abandon_all();
      ::_exit(1);
    } catch (...) {
    }
  }
  std::string what = "an unexpected error";
  if (e) {
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

/// Before any shared library's initialisers (.preinit_array runs first): LibTorch's
/// static initialisers throw std::bad_alloc under a small ulimit -v, before main.
void install_early(int argc, char** argv, char**) {
  static char tool[32] = "push";
  bool word = argc > 1 && argv[1][0] != '\0' && std::strlen(argv[1]) < 20;
  for (const char* c = word ? argv[1] : ""; *c != '\0'; ++c) word = word && *c >= 'a' && *c <= 'z';
  if (word) std::snprintf(tool, sizeof(tool), "push %s", argv[1]);
  g_tool = tool;
  std::set_terminate(on_terminate);
}

__attribute__((section(".preinit_array"), used)) void (*const g_install_early)(int, char**, char**) = install_early;

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
