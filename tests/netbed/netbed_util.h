#pragma once
// What the test-bed tests share: a fixture that skips, with the reason, where a bed cannot
// be made (not root), and small socket and process tools that run inside a host.
#include <gtest/gtest.h>

#include "poll_real.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sched.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <fstream>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "dist/dist_test_util.h"
#include "netbed/netbed.h"

namespace push::testing {

class Hosts : public ::testing::Test {
 protected:
  void SetUp() override {
    if (const auto why = NetBed::unavailable(); !why.empty()) GTEST_SKIP() << "no test bed here: " << why;
  }
};

/// Enters host `h`'s network namespace (in a forked child): false when it cannot.
inline bool enter(const NetBed& bed, int h) {
  const int fd = ::open(("/run/netns/" + bed.name(h)).c_str(), O_RDONLY | O_CLOEXEC);
  return fd >= 0 && ::setns(fd, CLONE_NEWNET) == 0;
}

/// Runs `fn` in a child process inside host `h`; its return value is the child's exit code
/// (100: the namespace could not be entered).
inline int in_host(const NetBed& bed, int h, const std::function<int()>& fn) {
  const pid_t pid = ::fork();
  if (pid == 0) ::_exit(enter(bed, h) ? fn() : 100);
  int status = 0;
  ::waitpid(pid, &status, 0);
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

/// A TCP connection to address:port within `ms` milliseconds: the socket (>= 0), or -errno
/// (-ETIMEDOUT when nothing answered in time).
inline int dial(const std::string& address, int port, int ms) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  sockaddr_in to{};
  to.sin_family = AF_INET;
  to.sin_port = htons(static_cast<uint16_t>(port));
  ::inet_pton(AF_INET, address.c_str(), &to.sin_addr);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&to), sizeof(to)) != 0 && errno != EINPROGRESS) {
    const int e = errno;
    ::close(fd);
    return -e;
  }
  pollfd p{fd, POLLOUT, 0};
  if (::poll(&p, 1, ms) != 1) {
    ::close(fd);
    return -ETIMEDOUT;
  }
  int e = 0;
  socklen_t len = sizeof(e);
  ::getsockopt(fd, SOL_SOCKET, SO_ERROR, &e, &len);
  if (e != 0) {
    ::close(fd);
    return -e;
  }
  ::fcntl(fd, F_SETFL, 0);  // blocking from here on
  return fd;
}

/// 0 when address:port accepts a connection within `ms`, else the errno that stopped it.
inline int connect_within(const std::string& address, int port, int ms) {
  const int fd = dial(address, port, ms);
  if (fd < 0) return -fd;
  ::close(fd);
  return 0;
}

/// Connects and reads until the peer closes, at most `bytes`: the bytes read, or -1.
inline int64_t receive(const std::string& address, int port, int64_t bytes, int ms) {
  const int fd = dial(address, port, ms);
  if (fd < 0) return -1;
  std::vector<char> buffer(1 << 16);
  int64_t total = 0;
  for (ssize_t got; total < bytes && (got = ::read(fd, buffer.data(), buffer.size())) > 0;) total += got;
  ::close(fd);
  return total;
}

/// A child in host `h` that listens on its address:port, accepts one connection, runs
/// `serve(connection)` (its return value is the child's exit code) and exits; returns once
/// it listens. Reap it with reap().
inline pid_t serve_one_connection(const NetBed& bed, int h, int port, const std::function<int(int)>& serve) {
  int ready[2];
  if (::pipe(ready) != 0) throw std::runtime_error("pipe");
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::close(ready[0]);
    if (!enter(bed, h)) ::_exit(100);
    const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    const int one = 1;
    ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    sockaddr_in at{};
    at.sin_family = AF_INET;
    at.sin_port = htons(static_cast<uint16_t>(port));
    ::inet_pton(AF_INET, bed.address(h).c_str(), &at.sin_addr);
    if (::bind(fd, reinterpret_cast<sockaddr*>(&at), sizeof(at)) != 0 || ::listen(fd, 4) != 0) ::_exit(101);
    ::write(ready[1], "r", 1);
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, 20000) != 1) ::_exit(102);
    const int c = ::accept(fd, nullptr, nullptr);
    const int code = serve(c);
    ::close(c);
    ::_exit(code);
  }
  ::close(ready[1]);
  char r = 0;
  const ssize_t got = ::read(ready[0], &r, 1);
  ::close(ready[0]);
  if (got != 1) throw std::runtime_error("the server in the bed did not start");
  return pid;
}

/// Serves one connection `bytes` bytes (serve_one_connection).
inline pid_t serve_once(const NetBed& bed, int h, int port, int64_t bytes) {
  return serve_one_connection(bed, h, port, [bytes](int c) {
    std::vector<char> block(1 << 16, 'x');
    for (int64_t sent = 0; sent < bytes;) {
      const ssize_t put = ::write(c, block.data(), static_cast<size_t>(std::min<int64_t>(bytes - sent, 1 << 16)));
      if (put <= 0) return 103;
      sent += put;
    }
    return 0;
  });
}

/// Echoes one byte `rounds` times to one connection (serve_one_connection).
inline pid_t serve_echo(const NetBed& bed, int h, int port, int rounds) {
  return serve_one_connection(bed, h, port, [rounds](int c) {
    const int one = 1;
    ::setsockopt(c, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    char b = 0;
    for (int i = 0; i < rounds; ++i) {
      if (::read(c, &b, 1) != 1 || ::write(c, &b, 1) != 1) return 103;
    }
    return 0;
  });
}

/// Round trips of one byte to an echo server (serve_echo) at address:port, in
/// milliseconds, sorted; empty when the connection fails.
inline std::vector<double> round_trips(const std::string& address, int port, int rounds) {
  std::vector<double> ms;
  const int fd = dial(address, port, 5000);
  if (fd < 0) return ms;
  const int one = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  char b = 'x';
  for (int i = 0; i < rounds; ++i) {
    const auto start = std::chrono::steady_clock::now();
    if (::write(fd, &b, 1) != 1 || ::read(fd, &b, 1) != 1) break;
    ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count());
  }
  ::close(fd);
  std::sort(ms.begin(), ms.end());
  return ms;
}

/// Waits for child `pid` and expects it exited 0.
inline void reap(pid_t pid) {
  int status = 0;
  ASSERT_EQ(::waitpid(pid, &status, 0), pid);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "status " << status;
}

/// The round trips (ms, sorted) of `rounds` one-byte messages from host `from` to an echo
/// server on host `to`: the link's own round trip, as ping would give it.
inline std::vector<double> echo_round_trips(const NetBed& bed, int from, int to, int port, int rounds) {
  const pid_t server = serve_echo(bed, to, port, rounds);
  int results[2];
  if (::pipe(results) != 0) throw std::runtime_error("pipe");
  const int code = in_host(bed, from, [&] {
    const auto ms = round_trips(bed.address(to), port, rounds);
    const ssize_t bytes = static_cast<ssize_t>(ms.size() * sizeof(double));
    return ::write(results[1], ms.data(), static_cast<size_t>(bytes)) == bytes ? 0 : 1;
  });
  ::close(results[1]);
  std::vector<double> ms(static_cast<size_t>(rounds));
  const ssize_t got = ::read(results[0], ms.data(), ms.size() * sizeof(double));
  ::close(results[0]);
  reap(server);
  EXPECT_EQ(code, 0);
  ms.resize(got > 0 ? static_cast<size_t>(got) / sizeof(double) : 0);
  return ms;
}

/// Starts the shell command `command` (exec'd: the pid is the command's).
inline pid_t spawn(const std::string& command) {
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::execl("/bin/sh", "sh", "-c", ("exec " + command).c_str(), static_cast<char*>(nullptr));
    ::_exit(127);
  }
  return pid;
}

/// Polls `done` every 10 ms for at most `seconds`.
inline void wait_until(const std::function<bool()>& done, double seconds = 10) {
  push::testing::poll_real(
      done, std::chrono::duration_cast<std::chrono::steady_clock::duration>(std::chrono::duration<double>(seconds)));
}

/// A process's state letter from /proc/PID/stat (R, S, T, Z, ...), or '?' when gone.
inline char state_of(pid_t pid) {
  const auto fields = proc_stat(pid);
  return fields.empty() ? '?' : fields[0][0];
}

}  // namespace push::testing
