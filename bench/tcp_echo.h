// The raw TCP baseline of the distributed benchmarks: length-prefixed messages (u64 byte
// count, then the bytes) echoed by one rank over plain loopback connections (TCP_NODELAY).
#pragma once

#include <push/dist/store.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

namespace push_bench {

inline void check_io(bool ok, const char* what) {
  if (!ok) {
    std::perror(what);
    std::exit(1);
  }
}

inline void write_all(int fd, const void* data, size_t n) {
  auto* p = static_cast<const char*>(data);
  while (n > 0) {
    const ssize_t k = ::write(fd, p, n);
    check_io(k > 0, "push bench: tcp write");
    p += k;
    n -= static_cast<size_t>(k);
  }
}

/// False on a clean end of stream before the first byte.
inline bool read_all(int fd, void* data, size_t n) {
  auto* p = static_cast<char*>(data);
  size_t got = 0;
  while (got < n) {
    const ssize_t k = ::read(fd, p + got, n - got);
    if (k == 0 && got == 0) return false;
    check_io(k > 0, "push bench: tcp read");
    got += static_cast<size_t>(k);
  }
  return true;
}

inline void no_delay(int fd) {
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
}

/// The echoing rank: listens on a free loopback port, publishes it in the store, accepts
/// `clients` connections and echoes each on a thread of its own until it closes.
inline std::thread serve_tcp_echo(const push::dist::Store& store, int clients = 1) {
  const int listener = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(addr);
  check_io(bind(listener, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0 && listen(listener, clients) == 0 &&
               getsockname(listener, reinterpret_cast<sockaddr*>(&addr), &len) == 0,
           "push bench: tcp listen");
  const std::string port = std::to_string(ntohs(addr.sin_port));
  store.set("bench/tcp_port", std::vector<uint8_t>(port.begin(), port.end()));
  return std::thread([listener, clients] {
    std::vector<std::thread> echoes;
    for (int client = 0; client < clients; ++client) {
      const int fd = accept(listener, nullptr, nullptr);
      check_io(fd >= 0, "push bench: tcp accept");
      no_delay(fd);
      echoes.emplace_back([fd] {
        std::vector<char> buffer;
        uint64_t n = 0;
        while (read_all(fd, &n, sizeof(n))) {
          buffer.resize(n);
          read_all(fd, buffer.data(), n);
          write_all(fd, buffer.data(), n);
        }
        close(fd);
      });
    }
    for (auto& t : echoes) t.join();
    close(listener);
  });
}

/// A client's connection to the echo.
inline int connect_tcp_echo(const push::dist::Store& store) {
  const auto bytes = store.get("bench/tcp_port");
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = htons(static_cast<uint16_t>(std::stoi(std::string(bytes.begin(), bytes.end()))));
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  check_io(connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0, "push bench: tcp connect");
  no_delay(fd);
  return fd;
}

}  // namespace push_bench
