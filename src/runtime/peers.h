#pragma once
// The other ranks of a distribution built over a dist::World (PushOptions::world): how
// many lanes each rank has, the RPC group that carries particle messages, views and
// parameters between ranks, and the collectives every rank makes together (creation,
// save, load, leaving). The particle side of those calls is the Runtime's (remote.cpp);
// this file is plumbing: one RPC function ("push.particles") per process decodes each
// request (peer_messages.h) and dispatches it to its distribution by name. docs/distributed.md, "Particles across
// ranks".
#include <push/core/future.h>
#include <push/dist/rpc.h>
#include <push/dist/world.h>

#include <atomic>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "runtime/peer_messages.h"

namespace push::detail {

class Peers : public std::enable_shared_from_this<Peers> {
 public:
  /// What serves the particle ops of this rank (the Runtime), run in an RPC handler fiber.
  using Serve = std::function<c10::IValue(PeerRequest request)>;

  /// Collective: every rank builds its distribution's Peers in the same order (the name
  /// is derived from that order). Exchanges lane counts and hosts through the store and
  /// forms the RPC group. Throws push::Error when a rank does not come.
  static std::shared_ptr<Peers> create(const dist::World& world, int lanes);
  ~Peers();
  Peers(const Peers&) = delete;
  Peers& operator=(const Peers&) = delete;

  /// Starts answering particle ops with `serve`, then meets every rank (so no rank sends
  /// to one that cannot answer yet).
  void start(Serve serve);
  /// Collective: meets every rank (a rank lost meanwhile is skipped), then leaves the RPC
  /// group. Requests still arriving fail. Idempotent; never throws.
  void leave();

  int rank() const { return rank_; }
  int size() const { return static_cast<int>(lanes_.size()); }
  const std::string& name() const { return name_; }
  /// Ranks of the job on this rank's host (by host name), this one included.
  int ranks_on_host() const { return ranks_on_host_; }
  int lanes_of(int rank) const { return lanes_.at(static_cast<size_t>(rank)); }
  int total_lanes() const { return total_lanes_; }
  /// The global index of `rank`'s lane 0.
  int first_lane(int rank) const {
    int g = 0;
    for (int r = 0; r < rank; ++r) g += lanes_of(r);
    return g;
  }
  /// Global lane g (ranks' lanes numbered in rank order) as (rank, lane).
  std::pair<int, int> global_lane(int64_t g) const;
  /// "rank 1 (worker1)".
  std::string describe(int rank) const;
  /// Why `rank` was lost, if it was.
  std::optional<std::string> lost(int rank) const;

  /// `request` (for this distribution) to `rank`; its future fails at once when `rank` is
  /// lost, and never times out otherwise (a particle's handler may run for hours).
  Future<c10::IValue> call(int rank, PeerRequest request) const;

  /// Collective: every rank contributes `value` and gets every rank's, by rank. Rank 0
  /// collects; a rank lost before it contributed fails the round on every rank at once.
  /// `call` says which collective this is (and what must agree, e.g. the number of
  /// particles): ranks whose calls differ fail the round on every rank, naming both, and
  /// every later collective fails at once (the ranks are out of step for good). `origin`
  /// names the API in errors.
  std::vector<c10::IValue> all_gather(c10::IValue value, const std::string& call, const char* origin);

 private:
  Peers() = default;
  c10::IValue dispatch(PeerRequest request);
  c10::IValue collect(int64_t round, int from, const std::string& call, c10::IValue value);
  void on_lost(int rank, const std::string& why);
  void fail_rounds_missing(int rank, const std::string& why);
  void fail_all_rounds(const std::string& why);

  std::optional<dist::World> world_;
  dist::RpcGroup group_;
  std::string name_;
  int rank_ = 0;
  int ranks_on_host_ = 1;
  int total_lanes_ = 0;
  std::vector<int> lanes_;
  std::vector<std::string> names_;

  Promise<bool> started_;
  Future<bool> started_future_ = started_.future();
  Serve serve_;

  mutable std::mutex mutex_;
  std::map<int, std::string> lost_;
  struct Round {
    std::string call;  // what the first rank to arrive called
    int first = -1;    // that rank
    std::vector<std::optional<c10::IValue>> values;
    int arrived = 0;
    Promise<std::vector<c10::IValue>> done;
  };
  std::map<int64_t, Round> rounds_;  // rank 0: collectives being collected
  std::string out_of_step_;          // rank 0: why the ranks' collectives no longer match
  int64_t next_round_ = 0;
  bool left_ = false;
  // Every rank met at the end of start(): only then is leaving a collective of all ranks
  // (a rank whose construction failed leaves alone; the others then lose it).
  std::atomic<bool> met_{false};
};

}  // namespace push::detail
