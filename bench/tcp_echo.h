// The raw TCP baseline of the distributed benchmarks: length-prefixed messages (u64 byte
// count, then the bytes) echoed by one rank over plain loopback connections (TCP_NODELAY).
// A message may ask to be handed off (kHandOff): then the thread that read it passes it to a
// second thread, which writes the echo, as an RPC member's I/O thread passes a request to a
// handler; HandOffReader does the same on the calling side. These give the round trip of a
// raw echo with as many thread wake-ups as an RPC has (each thread sleeping while it waits),
// the floor of a design with them. A connection that hands off carries one message at a
// time: the echo's two threads would otherwise write to it at once.
#pragma once

#include <push/dist/store.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <unistd.h>

#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <deque>
#include <memory>
#include <mutex>
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

/// Bit 63 of a message's byte count: hand it to a second thread, which writes the echo.
constexpr uint64_t kHandOff = uint64_t{1} << 63;

/// A thread that writes the echoes handed to it, in order; the reading thread goes back to
/// reading at once, as an RPC member's I/O thread does.
class EchoWriter {
 public:
  explicit EchoWriter(int fd) : fd_(fd), thread_([this] { run(); }) {}
  ~EchoWriter() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      done_ = true;
    }
    ready_.notify_one();
    thread_.join();
  }
  void hand(std::vector<char> bytes) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      queue_.push_back(std::move(bytes));
    }
    ready_.notify_one();
  }

 private:
  void run() {
    std::unique_lock<std::mutex> lock(mutex_);
    for (;;) {
      ready_.wait(lock, [&] { return done_ || !queue_.empty(); });
      // Done: the connection ended, and its peer takes no more echoes.
      if (done_) return;
      auto bytes = std::move(queue_.front());
      queue_.pop_front();
      lock.unlock();
      write_all(fd_, bytes.data(), bytes.size());
      lock.lock();
    }
  }
  const int fd_;
  std::mutex mutex_;
  std::condition_variable ready_;
  std::deque<std::vector<char>> queue_;
  bool done_ = false;
  std::thread thread_;
};

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
        {
          std::unique_ptr<EchoWriter> writer;  // started by the first message handed off
          while (read_all(fd, &n, sizeof(n))) {
            const bool hand_off = (n & kHandOff) != 0;
            n &= ~kHandOff;
            buffer.resize(n);
            read_all(fd, buffer.data(), n);
            if (!hand_off) {
              write_all(fd, buffer.data(), n);
              continue;
            }
            if (!writer) writer = std::make_unique<EchoWriter>(fd);
            writer->hand(buffer);
          }
        }
        close(fd);
      });
    }
    for (auto& t : echoes) t.join();
    close(listener);
  });
}

/// The calling side's hand-off: a thread reads the echoes of `bytes` bytes from `fd` and
/// wakes the caller, as an RPC member's I/O thread completes a caller's future. One
/// message at a time (round_trip waits for its echo); the connection is this reader's.
class HandOffReader {
 public:
  HandOffReader(int fd, uint64_t bytes) : fd_(fd), out_(bytes, 1), thread_([this] { run(); }) {}
  /// Ends the connection for reading and writing, so the reading thread ends (also when an
  /// exit() runs this destructor while the thread waits for bytes); the owner closes fd.
  ~HandOffReader() {
    ::shutdown(fd_, SHUT_RDWR);
    if (thread_.get_id() == std::this_thread::get_id()) {
      thread_.detach();  // exit() from the reading thread itself
    } else {
      thread_.join();
    }
  }
  /// One round trip of `bytes` bytes: the message (handed off by the echo when
  /// `echo_hands_off`), then the wait for the reading thread to have its echo.
  void round_trip(bool echo_hands_off) {
    const uint64_t n = out_.size() | (echo_hands_off ? kHandOff : 0);
    std::unique_lock<std::mutex> lock(mutex_);
    const uint64_t want = got_ + 1;
    lock.unlock();
    write_all(fd_, &n, sizeof(n));
    write_all(fd_, out_.data(), out_.size());
    lock.lock();
    arrived_.wait(lock, [&] { return got_ >= want || ended_; });
    if (got_ < want) {
      std::fprintf(stderr, "push bench: the echo's connection ended\n");
      std::exit(1);
    }
  }

 private:
  void run() {
    std::vector<char> back(out_.size());
    for (;;) {
      // Not read_all: an error here ends this thread, not the process.
      size_t got = 0;
      while (got < back.size()) {
        const ssize_t k = ::read(fd_, back.data() + got, back.size() - got);
        if (k <= 0) break;
        got += static_cast<size_t>(k);
      }
      {
        std::lock_guard<std::mutex> lock(mutex_);
        if (got < back.size()) {
          ended_ = true;
        } else {
          ++got_;
        }
      }
      arrived_.notify_one();
      if (got < back.size()) return;
    }
  }
  const int fd_;
  const std::vector<char> out_;
  std::mutex mutex_;
  std::condition_variable arrived_;
  uint64_t got_ = 0;
  bool ended_ = false;
  std::thread thread_;
};

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
