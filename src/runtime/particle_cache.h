#pragma once
// The particle cache of one device lane: at most `capacity` particles resident; the rest
// in a host store (pinned memory on CUDA) with their gradients and optimizer state.
// Least recently used goes first; a pinned particle (its handler is running, or an
// operation holds it) is never evicted. Lane thread only, except the stats.
//
// Eviction copies every tensor of the particle (parameters, buffers, gradients,
// optimizer state) into the host store and swaps an empty tensor into the *same*
// TensorImpl (Tensor::set_data); restoring swaps a device copy back. On a GPU lane both
// copies run on the lane's copy stream (lane_streams.h): an eviction queues its copies
// behind the compute queued so far and returns without waiting; a restore makes the
// compute stream wait for its copies on the device. Only a read of an evicted particle's
// host copies (parameters(), gradients()) waits for them, and only for them. Identity is
// preserved, so the optimizer's state keys and any handle the user holds stay valid,
// and the copies are exact, so training is bitwise the same at any cache size.
#include <torch/types.h>

#include <atomic>
#include <list>
#include <unordered_set>
#include <vector>

#include "runtime/lane_streams.h"

namespace push::detail {

struct ParticleRecord;

class ParticleCache {
 public:
  ParticleCache(LaneStreams& streams, torch::Device device, int capacity)
      : streams_(streams), device_(device), capacity_(capacity) {}

  /// A newly created particle, already on the device: becomes resident (MRU).
  void insert(ParticleRecord& record);
  /// Makes `record` resident and most recently used, and pins it.
  void pin(ParticleRecord& record);
  void unpin(ParticleRecord& record);

  /// The particle's parameters / gradients wherever they are now (device or host store),
  /// without materializing it. Read-only: callers copy.
  std::vector<torch::Tensor> parameters(ParticleRecord& record) const;
  std::vector<torch::Tensor> gradients(ParticleRecord& record) const;
  std::vector<torch::Tensor> buffers(ParticleRecord& record) const;

  /// The storages of every tensor of the resident particles (parameters, buffers,
  /// gradients, optimizer state): a tensor sharing one of them changes when its particle
  /// trains and is emptied when it is evicted.
  std::unordered_set<const void*> resident_storages() const;

  int64_t resident() const { return resident_.load(std::memory_order_relaxed); }
  int64_t evictions() const { return evictions_.load(std::memory_order_relaxed); }
  int64_t restores() const { return restores_.load(std::memory_order_relaxed); }

  // Exposed for the swap benchmark.
  void evict(ParticleRecord& record);
  void restore(ParticleRecord& record);

 private:
  void make_room();
  // CPU lanes: device storage freed by an eviction is kept for the next restore, so a
  // swap costs two copies and no allocation (a fresh large allocation page-faults).
  torch::Tensor take_buffer(const torch::Tensor& like);
  void keep_buffer(torch::Tensor buffer);

  LaneStreams& streams_;
  torch::Device device_;
  int capacity_;
  std::list<ParticleRecord*> lru_;    // front: least recently used
  std::vector<torch::Tensor> spare_;  // CPU only: the last evicted particle's storage
  std::atomic<int64_t> resident_{0};
  std::atomic<int64_t> evictions_{0};
  std::atomic<int64_t> restores_{0};
};

}  // namespace push::detail
