#pragma once
// The process's OS threads, counted from /proc: what the tests of bounded threads (event
// loops, lanes, their pools) measure.
#include <dirent.h>

#include "test_util.h"

#include <chrono>
#include <fstream>
#include <string>
#include <thread>

namespace push::testing {

inline int count_threads() {
  int n = 0;
  if (DIR* dir = ::opendir("/proc/self/task")) {
    while (dirent* e = ::readdir(dir)) n += e->d_name[0] != '.';
    ::closedir(dir);
  }
  return n;
}

// A thread that was joined can stay listed in /proc for a moment (the kernel reaps it after
// waking the joiner): wait, at most 5 s, until no more than `limit` threads remain.
inline int settled_thread_count(int limit) {
  eventually([&] { return count_threads() <= limit; }, std::chrono::seconds(5));
  return count_threads();
}

// Threads whose name starts with `prefix` (a thread inherits its creator's name).
inline int threads_named(const std::string& prefix) {
  int n = 0;
  if (DIR* dir = ::opendir("/proc/self/task")) {
    while (dirent* e = ::readdir(dir)) {
      if (e->d_name[0] == '.') continue;
      std::ifstream comm(std::string("/proc/self/task/") + e->d_name + "/comm");
      std::string name;
      n += std::getline(comm, name) && name.rfind(prefix, 0) == 0;
    }
    ::closedir(dir);
  }
  return n;
}

}  // namespace push::testing
