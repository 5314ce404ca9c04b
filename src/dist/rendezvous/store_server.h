#pragma once
// push's own store server, run by rank 0 on the socket it binds to MASTER_ADDR:MASTER_PORT
// (docs/distributed.md, "The store"). It serves the same keys as c10d's TCPStore (set, get,
// add, compare-and-set, check, delete, count, wait) to clients that prove the job's secret
// first (store_wire.h): a local user without the secret reads and writes nothing.
//
// One thread serves every connection (poll). What a connection costs before it proves
// itself is bounded: it has handshake_timeout to finish the handshake, reads at most the
// handshake's fixed-size frames into a fixed buffer, and at most max_pending such
// connections are kept (a new one past that closes one of them at random, preferring those
// that sent nothing yet, and clients retry with a random pause: a flood of connections slows
// a rank's join, it does not stop it).
#include <atomic>
#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "dist/transport/handshake.h"

struct pollfd;

namespace push::dist::detail {

class StoreServer {
 public:
  struct Options {
    int listen_fd = -1;  // bound and listening; the server owns it from here
    handshake::Bytes key{};
    std::string job_id;
    std::string address;  // MASTER_ADDR:MASTER_PORT as configured: what the proofs bind
    int world_size = 1;   // client ranks are 0 .. world_size-1
    std::chrono::milliseconds handshake_timeout{5000};
    std::size_t max_pending = 64;
  };
  explicit StoreServer(Options options);
  /// Stops serving: the thread is joined, every connection and the listening socket closed.
  ~StoreServer();
  StoreServer(const StoreServer&) = delete;
  StoreServer& operator=(const StoreServer&) = delete;

  /// Connections that ended in the handshake after the banner: a wrong proof, or a client
  /// that hung up on the server's proof (it holds another key: another job's rank, or a rank
  /// given another PUSH_JOB_SECRET).
  int refused() const { return refused_.load(); }
  /// Connections closed before they proved themselves because max_pending were waiting.
  int evicted() const { return evicted_.load(); }

  struct Connection;

 private:
  void run();
  /// One turn of the loop; false when the server is to stop.
  bool serve_once(std::vector<pollfd>& fds);
  /// Closes one connection still in its handshake (store_server.cpp says which); false when none is.
  bool evict_one_waiting();
  void accept_all();
  /// Reads what `c` sent and acts on it; false when `c` is to be closed.
  bool on_readable(Connection& c);
  bool on_handshake(Connection& c);
  bool on_message(Connection& c);
  /// Runs the request in `body`, or parks it (a get or wait of missing keys).
  void serve(Connection& c, const std::string& body);
  /// Serves `c`'s opened requests in order until one parks.
  void drain(Connection& c);
  void reply(Connection& c, const std::string& body);
  /// Answers parked requests whose keys are there now, or whose deadline passed: after
  /// every change to the keys (as c10d's TCPStore does), and at each turn of the loop.
  void answer_parked(std::chrono::steady_clock::time_point now);
  bool flush(Connection& c);

  Options options_;
  int stop_fd_ = -1;  // an eventfd: written by the destructor
  std::vector<std::unique_ptr<Connection>> connections_;
  std::map<std::string, std::string> data_;
  std::atomic<int> refused_{0};
  std::atomic<int> evicted_{0};
  std::chrono::steady_clock::time_point accept_paused_until_{};
  std::minstd_rand random_{std::random_device{}()};
  std::thread thread_;
};

}  // namespace push::dist::detail
