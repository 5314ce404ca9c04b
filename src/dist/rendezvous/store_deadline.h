#pragma once
// A deadline for store calls that c10d cannot bound itself. LibTorch 1.13's TCPStore client
// waits for an answer without a timeout: a store port that accepts but never answers (rank 0
// stopped with SIGSTOP, an unrelated program listening on MASTER_PORT) would hold a joining
// rank forever. While a StoreDeadline lives, a thread of its own waits for the deadline; if
// it passes first, every socket of this process connected to the store's address is shut
// down, which fails the blocked call at once.
//   StoreDeadline bound(host, port, deadline);
//   ... store calls ...
//   if (bound.fired()) throw ...;   // in the handler of their failure
#include <condition_variable>
#include <functional>
#include <mutex>
#include <string>
#include <thread>

#include "core/clock.h"

namespace push::dist::detail {

class StoreDeadline {
 public:
  /// `give_up`, when given, is asked every 50 ms: true cuts the connections before the
  /// deadline (the store's host is known to be lost).
  StoreDeadline(std::string host, int port, push::detail::Clock::time_point deadline,
                std::function<bool()> give_up = nullptr);
  /// Stops the thread (joined) without touching the sockets.
  ~StoreDeadline();
  StoreDeadline(const StoreDeadline&) = delete;
  StoreDeadline& operator=(const StoreDeadline&) = delete;

  /// Whether the deadline passed and at least one open connection to the store was shut down.
  bool fired();

 private:
  void run(push::detail::Clock::time_point deadline, const std::function<bool()>& give_up);

  std::string host_;
  int port_;
  std::mutex mutex_;
  std::condition_variable cv_;
  bool done_ = false;
  bool fired_ = false;
  std::thread thread_;
};

/// Shuts down every socket of this process whose peer is `host` (any of its addresses)
/// port `port`; returns how many.
int shutdown_sockets_to(const std::string& host, int port);

}  // namespace push::dist::detail
