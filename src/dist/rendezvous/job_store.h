#pragma once
// A rank's client of push's own store (store_server.h, store_wire.h): a c10d::Store, so
// that World, RPC groups and c10d's Gloo groups all meet through it. Every call has a
// deadline from the moment it is made: the store's timeout (a get or a wait: the timeout it
// asks for, and a little more), after which the call fails naming the store and the
// connection is dropped; a call after that connects again, and fails at once when nothing
// listens any more.
#include <torch/csrc/distributed/c10d/Store.hpp>

#include <chrono>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include <push/core/errors.h>

#include "dist/transport/handshake.h"

namespace push::dist::detail {

class FrameSeal;

class JobStore : public c10d::Store {
 public:
  struct Options {
    std::string host;  // MASTER_ADDR
    int port = 0;      // MASTER_PORT
    std::string job_id;
    int rank = 0;
    int world_size = 1;
    std::chrono::milliseconds timeout{300000};  // each call's
  };

  /// The store's key from the job's secret and id.
  static handshake::Bytes key_for(const handshake::Bytes& secret, const std::string& job_id);

  /// Connects and proves `key`, waiting for the store to listen until `deadline`. Throws
  /// push::Error: a store of another job (its banner, at once), one that did not prove the
  /// key (WrongKey), or none that answered by the deadline.
  JobStore(Options options, const handshake::Bytes& key, std::chrono::steady_clock::time_point deadline);
  ~JobStore() override;

  /// Waits until a store of this job answers at options.host:port, by `deadline`: connects
  /// and reads the banner only (no key needed). Throws push::Error when it serves another
  /// job or none answered.
  static void expect_this_job(const Options& options, std::chrono::steady_clock::time_point deadline);

  /// The store did not prove the key (it holds another): a rank of another job, or a rank
  /// given another PUSH_JOB_SECRET, hosts it.
  struct WrongKey : push::Error {
    using push::Error::Error;
  };

  /// A get or wait whose keys did not come within its timeout.
  struct Timeout : push::Error {
    using push::Error::Error;
  };

  /// Another client of the same store (its own connection). Overrides c10d's clone() where
  /// it has one (LibTorch 2.x).
  c10::intrusive_ptr<c10d::Store> clone();

  void set(const std::string& key, const std::vector<uint8_t>& value) override;
  std::vector<uint8_t> compareSet(const std::string& key, const std::vector<uint8_t>& expected,
                                  const std::vector<uint8_t>& desired) override;
  std::vector<uint8_t> get(const std::string& key) override;
  int64_t add(const std::string& key, int64_t value) override;
  bool deleteKey(const std::string& key) override;
  bool check(const std::vector<std::string>& keys) override;
  int64_t getNumKeys() override;
  void wait(const std::vector<std::string>& keys) override;
  void wait(const std::vector<std::string>& keys, const std::chrono::milliseconds& timeout) override;

 private:
  struct Link;
  /// Sends `body` and returns the reply's fields (after its status), with the connection's
  /// I/O bounded by `io_timeout`; `what` names the call in errors. A timeout reply throws.
  std::string call(const std::string& body, std::chrono::milliseconds io_timeout, const char* what);
  /// `patient`: retry while nothing listens (at start, rank 0 may come later); else a store
  /// that is gone fails at once.
  void connect(std::chrono::steady_clock::time_point deadline, bool patient);
  /// `timeout` as this client waits it: c10d's kNoTimeout (0) is the store's timeout, and
  /// no wait is longer than store_wire.h's kMaxWaitMs.
  std::chrono::milliseconds bounded(std::chrono::milliseconds timeout) const;
  std::string where() const;

  Options options_;
  handshake::Bytes key_;
  // One call at a time on the connection: the turn is taken (turn_taken_, under mutex_)
  // by a call and given back when it ends; a call waits for it until its own deadline.
  std::mutex mutex_;
  std::condition_variable turn_free_;
  bool turn_taken_ = false;
  std::unique_ptr<Link> link_;
};

}  // namespace push::dist::detail
