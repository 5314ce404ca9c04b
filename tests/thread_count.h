#pragma once
// The process's OS threads, counted from /proc: what the tests of bounded threads (event
// loops, lanes, their pools) measure.
#include <dirent.h>
#include <sys/types.h>

#include "test_util.h"

#include <chrono>
#include <fstream>
#include <set>
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

// The ids of the process's OS threads now.
inline std::set<pid_t> thread_ids() {
  std::set<pid_t> ids;
  if (DIR* dir = ::opendir("/proc/self/task")) {
    while (dirent* e = ::readdir(dir)) {
      if (e->d_name[0] != '.') ids.insert(static_cast<pid_t>(std::stol(e->d_name)));
    }
    ::closedir(dir);
  }
  return ids;
}

// What /proc says of thread `tid` of this process now: its state letter (R, S, D, ...; '?'
// when gone) and how often it has gone to sleep (voluntary context switches).
struct ThreadSample {
  char state = '?';
  long sleeps = -1;
};

inline ThreadSample sample_thread(pid_t tid) {
  ThreadSample s;
  std::ifstream status("/proc/self/task/" + std::to_string(tid) + "/status");
  for (std::string line; std::getline(status, line);) {
    if (line.rfind("State:", 0) == 0 && line.size() > 7) s.state = line[7];
    if (line.rfind("voluntary_ctxt_switches:", 0) == 0) s.sleeps = std::stol(line.substr(24));
  }
  return s;
}

// Whether thread `tid` lies in one wait: asleep (S) at this look and at the one before
// (`last`, updated here), not woken between them. For a condition that a thread blocking
// shows and nothing else does (a join), looked at every millisecond (eventually).
inline bool asleep_in_one_wait(pid_t tid, ThreadSample& last) {
  const ThreadSample now = sample_thread(tid);
  const bool still = now.state == 'S' && last.state == 'S' && now.sleeps == last.sleeps;
  last = now;
  return still;
}

}  // namespace push::testing
