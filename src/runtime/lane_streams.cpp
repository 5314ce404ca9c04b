#include "runtime/lane_streams.h"

#include "core/torch_compat.h"

namespace push::detail {

#if PUSH_WITH_CUDA

struct LaneStreams::Cuda {
  c10::cuda::CUDAStream compute;
  c10::cuda::CUDAStream copies;
};

LaneStreams::LaneStreams(const torch::Device& device) : device_(device) {
  if (!device.is_cuda()) return;
  const c10::DeviceIndex index = device.index();
  cuda_ = std::make_unique<Cuda>(Cuda{c10::cuda::getStreamFromPool(/*isHighPriority=*/false, index),
                                      c10::cuda::getStreamFromPool(/*isHighPriority=*/false, index)});
}

void LaneStreams::enter() {
  if (cuda_) c10::cuda::setCurrentCUDAStream(cuda_->compute);
}

CopiesDone LaneStreams::copy(const std::vector<torch::Tensor>& from, const std::vector<torch::Tensor>& to) {
  CopiesDone done;
  if (!cuda_) {
    for (size_t i = 0; i < from.size(); ++i) to[i].copy_(from[i]);
    return done;
  }
  const c10::cuda::CUDAStream current = c10::cuda::getCurrentCUDAStream(device_.index());
  compat::CudaEvent before;
  before.record(current);
  before.block(cuda_->copies);
  {
    c10::cuda::CUDAStreamGuard on_copies(cuda_->copies);
    for (size_t i = 0; i < from.size(); ++i) {
      to[i].copy_(from[i], /*non_blocking=*/true);
      for (const torch::Tensor* t : {&from[i], &to[i]}) {
        if (t->is_cuda()) t->record_stream(cuda_->copies);
      }
    }
  }
  auto event = std::make_shared<compat::CudaEvent>();
  event->record(cuda_->copies);
  done.event_ = std::move(event);
  return done;
}

void LaneStreams::order_after(const CopiesDone& done) const {
  if (!cuda_ || !done.event_) return;
  static_cast<compat::CudaEvent*>(done.event_.get())->block(c10::cuda::getCurrentCUDAStream(device_.index()));
}

void LaneStreams::finish_current(const torch::Device& device) {
  if (device.is_cuda()) c10::cuda::getCurrentCUDAStream(device.index()).synchronize();
}

void CopiesDone::wait() const {
  if (event_) static_cast<const compat::CudaEvent*>(event_.get())->synchronize();
}

#else  // LibTorch without CUDA: every lane is a CPU lane.

struct LaneStreams::Cuda {};

LaneStreams::LaneStreams(const torch::Device& device) : device_(device) {}

void LaneStreams::enter() {}

CopiesDone LaneStreams::copy(const std::vector<torch::Tensor>& from, const std::vector<torch::Tensor>& to) {
  for (size_t i = 0; i < from.size(); ++i) to[i].copy_(from[i]);
  return {};
}

void LaneStreams::order_after(const CopiesDone&) const {}

void LaneStreams::finish_current(const torch::Device&) {}

void CopiesDone::wait() const {}

#endif

LaneStreams::~LaneStreams() = default;

}  // namespace push::detail
