// Environment variables that the shared libraries read in their own initialisers, before
// main could look at them, checked before those initialisers run (.preinit_array comes
// first): OMP_NUM_THREADS=abc made libgomp and LibTorch print three lines of warnings and
// carry on; OMP_NUM_THREADS=100000 hung the run while it started its threads. Each is
// refused in one line, exit status 2, by every push command.
//
// Only C functions here: C++'s runtime is not set up yet.
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace push::cli {
namespace {

/// Whether `text` is a whole number from 1 to `most`, or a comma-separated list of them
/// (OpenMP's threads per nesting level).
bool thread_counts(const char* text, long most) {
  if (*text == '\0') return false;
  for (const char* c = text;;) {
    long value = 0;
    const char* start = c;
    for (; *c >= '0' && *c <= '9'; ++c) {
      value = value * 10 + (*c - '0');
      if (value > most) return false;
    }
    if (c == start || value < 1) return false;
    if (*c == '\0') return true;
    if (*c++ != ',') return false;
  }
}

void check_early_environment(int, char**, char** envp) {
  constexpr char kName[] = "OMP_NUM_THREADS=";
  const char* value = nullptr;
  for (char** e = envp; e != nullptr && *e != nullptr; ++e) {
    if (std::strncmp(*e, kName, sizeof(kName) - 1) == 0) value = *e + sizeof(kName) - 1;
  }
  if (value == nullptr) return;
  const long cores = ::sysconf(_SC_NPROCESSORS_ONLN);
  const long most = 4 * (cores > 0 ? cores : 1);
  if (thread_counts(value, most)) return;
  // The value as it may be shown: printable bytes only, and not too many of them.
  char shown[48];
  std::size_t n = 0;
  for (const char* c = value; *c != '\0' && n + 1 < sizeof(shown); ++c, ++n) {
    shown[n] = *c >= 0x20 && *c < 0x7f ? *c : '?';
  }
  shown[n] = '\0';
  char line[256];
  const int length = std::snprintf(line, sizeof(line),
                                   "push: OMP_NUM_THREADS='%s%s' must be a whole number of threads from 1 to %ld (4 "
                                   "per core here): fix or unset it (push train's --threads sets its own)\n",
                                   shown, value[n] != '\0' ? "..." : "", most);
  ssize_t ignored = ::write(STDERR_FILENO, line, length > 0 ? static_cast<std::size_t>(length) : 0);
  (void)ignored;
  ::_exit(2);
}

__attribute__((section(".preinit_array"),
               used)) void (*const g_check_early_environment)(int, char**, char**) = check_early_environment;

}  // namespace
}  // namespace push::cli
