#pragma once
// c10d's Gloo headers are guarded by USE_C10D_GLOO, which Debian's libtorch (built with
// Gloo) does not export through its CMake config. The symbols are in libtorch_cpu.
#ifndef USE_C10D_GLOO
#define USE_C10D_GLOO 1
#endif
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include "core/torch_compat.h"
#include <push/dist/collective.h>
#include <push/dist/rpc.h>
#include <push/dist/world.h>

#include <atomic>
#include <map>
#include <mutex>
#include <set>
#include <functional>
#include <string>
#include <vector>

namespace push::dist::detail {

/// A barrier on the store that works any number of times in a row: generation g uses its
/// own keys, so a fast rank entering g+1 can never be confused with a slow one leaving g.
/// Blocking waits use a store client of their own, so they never hold up other store users.
class StoreBarrier {
 public:
  StoreBarrier(c10::intrusive_ptr<c10d::Store> waiter, std::string prefix, int size)
      : waiter_(std::move(waiter)), prefix_(std::move(prefix)), size_(size) {}
  /// `origin` names the caller in the error thrown when `timeout` runs out.
  void arrive_and_wait(Milliseconds timeout, const char* origin);
  /// Like arrive_and_wait for member `rank`, but it does not wait for the members `lost()`
  /// names (asked again while waiting: a member may be found lost meanwhile): it returns
  /// once every other member has arrived.
  void arrive_and_wait_for_live(int rank, Milliseconds timeout, const char* origin,
                                const std::function<std::set<int>()>& lost);

 private:
  std::mutex mutex_;  // one barrier at a time per object: generations stay in order
  c10::intrusive_ptr<c10d::Store> waiter_;
  std::string prefix_;
  int size_;
  int64_t generation_ = 0;
};

struct WorldState {
  WorldOptions options;
  std::vector<std::string> names;
  c10::intrusive_ptr<c10d::TCPStore> store;
  std::shared_ptr<::gloo::transport::Device> device;
  std::unique_ptr<StoreBarrier> barrier;
  bool joined = false;  // the constructor finished: leaving is coordinated with the others
  std::mutex mutex;                      // guards the members below
  c10::intrusive_ptr<c10d::ProcessGroupGloo> world_gloo;  // built on first use
  std::map<std::string, int> group_counts;  // groups created per rank set

  ~WorldState();
  /// A fresh client of the job's store (for blocking waits).
  c10::intrusive_ptr<c10d::Store> new_client() const;
  /// A Gloo process group over `ranks` (this rank included), keyed under `prefix`.
  c10::intrusive_ptr<c10d::ProcessGroupGloo> make_gloo(const std::string& prefix,
                                                       const std::vector<int>& ranks,
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
