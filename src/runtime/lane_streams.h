#pragma once
// The CUDA streams of one device lane. A GPU lane runs the handlers of its particles on a
// compute stream of its own, not the device's default stream (which every lane and thread
// of the process would share), and its particle cache copies on a second stream, so that
// a swap overlaps the compute queued before it. The two are ordered with events and
// per-stream waits; nothing here synchronizes the whole device.
//
// What a lane hands to another thread (a handler's result, a message's arguments, a view)
// must be complete there, as the default stream used to make it: finish_current() blocks
// the lane's thread until its own stream has run what it queued, and nothing more.
//
// On a CPU lane, or against a LibTorch built without CUDA, copies are plain synchronous
// copies and the rest does nothing.
#include <torch/types.h>

#include <memory>
#include <vector>

namespace push::detail {

/// Copies queued on a lane's copy stream. Copyable; default: nothing in flight.
class CopiesDone {
 public:
  /// Blocks the calling thread until the copies are done.
  void wait() const;

 private:
  friend class LaneStreams;
  std::shared_ptr<void> event_;  // a compat::CudaEvent when copies were queued on a GPU
};

class LaneStreams {
 public:
  explicit LaneStreams(const torch::Device& device);
  ~LaneStreams();
  LaneStreams(const LaneStreams&) = delete;
  LaneStreams& operator=(const LaneStreams&) = delete;

  /// On the lane's thread, once it starts: the compute stream becomes the thread's current
  /// stream of the lane's device.
  void enter();

  /// Copies `from[i]` into `to[i]` (same sizes; `to` on the host is pinned) on the copy
  /// stream, after the work queued so far on the calling thread's current stream. Every
  /// storage involved is marked as in use by the copy stream, so the caching allocator does
  /// not hand it out again before the copy has run, even if its tensor is released now.
  CopiesDone copy(const std::vector<torch::Tensor>& from, const std::vector<torch::Tensor>& to);

  /// Makes the calling thread's current stream wait for `done` on the device: the host
  /// does not block.
  void order_after(const CopiesDone& done) const;

  /// Blocks until the work this thread queued on `device` (its current stream) has run.
  static void finish_current(const torch::Device& device);

 private:
  torch::Device device_;
  struct Cuda;
  std::unique_ptr<Cuda> cuda_;  // GPU lanes only
};

}  // namespace push::detail
