#pragma once
// The c10d side of push::dist: the state behind World and CollectiveGroup handles, on
// push's own store (c10d's TCPStore under a launcher that hosts one) and c10d's
// ProcessGroupGloo. Only src/dist includes it.
// c10d's Gloo headers are guarded by USE_C10D_GLOO, which Debian's libtorch (built with
// Gloo) does not export through its CMake config. The symbols are in libtorch_cpu.
#ifndef USE_C10D_GLOO
#define USE_C10D_GLOO 1
#endif
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include "core/torch_compat.h"
#include "dist/rendezvous/job_store.h"
#include "dist/rendezvous/store_barrier.h"
#include "dist/rendezvous/store_server.h"
#include "dist/transport/handshake.h"

#include <push/dist/collective.h>
#include <push/dist/rpc.h>
#include <push/dist/world.h>

#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <vector>

namespace push::dist::detail {

struct WorldState {
  WorldOptions options;
  std::vector<std::string> names;
  handshake::Bytes secret{};            // the job's (world_join.h): RPC group keys derive from it
  std::string secret_file;              // where rank 0 handed a secret it drew to the others (secret_file.h)
  std::unique_ptr<StoreServer> server;  // rank 0's, when push hosts the store (not a launcher)
  c10::intrusive_ptr<c10d::Store> store;
  std::shared_ptr<::gloo::transport::Device> device;
  std::unique_ptr<StoreBarrier> barrier;
  bool joined = false;  // the constructor finished: leaving is coordinated with the others
  std::mutex mutex;     // guards the members below
  c10::intrusive_ptr<c10d::ProcessGroupGloo> world_gloo;  // built on first use
  std::map<std::string, int> group_counts;                // groups created per rank set
  /// Ranks an RPC group lost (died, stopped, cut off; not a member closing its connections
  /// after the group's shutdown barrier) and has not heard from since: rank 0 does not
  /// wait for them to leave. Its own mutex: RPC I/O threads write it, and must not
  /// wait behind `mutex`, which a group's creation holds for as long as it connects.
  std::mutex lost_mutex;
  std::set<int> lost_ranks;
  /// Rank `rank` was lost (true) or heard from again (false): lost_ranks under lost_mutex.
  void mark_lost(int rank, bool lost);

  ~WorldState();
  /// The key of push's own store (JobStore::key_for).
  handshake::Bytes store_key() const { return JobStore::key_for(secret, options.job_id()); }
  /// How this rank's clients reach push's own store (MASTER_ADDR, MASTER_PORT, job, rank).
  JobStore::Options store_client() const;
  /// A fresh client of the job's store (for blocking waits).
  c10::intrusive_ptr<c10d::Store> new_client() const;
  /// A Gloo process group over `ranks` (this rank included), keyed under `prefix`.
  c10::intrusive_ptr<c10d::ProcessGroupGloo> make_gloo(const std::string& prefix, const std::vector<int>& ranks,
                                                       Milliseconds timeout) const;
};

struct GroupState {
  explicit GroupState(World w) : world(std::move(w)) {}
  World world;
  std::vector<int> ranks;
  int group_rank = -1;
  Milliseconds timeout{0};
  c10::intrusive_ptr<c10d::ProcessGroupGloo> gloo;
  std::string nccl_prefix;
#if PUSH_WITH_NCCL
  std::mutex nccl_mutex;
  c10::intrusive_ptr<push::compat::NcclGroup> nccl;  // built on the first CUDA tensor
#endif
};

std::string bytes_to_string(const std::vector<uint8_t>& bytes);
std::vector<uint8_t> string_to_bytes(const std::string& text);
/// The message of the current exception without LibTorch's backtrace.
std::string current_message();

}  // namespace push::dist::detail
