#pragma once
// Work that draws from LibTorch's one global CPU generator (module initializers do) under a
// seed of its own, without disturbing anyone's random stream: the generator is seeded, the
// work runs, and the generator's state is put back, even when the work throws. Calls are
// serialized with each other (not with other users of the generator).
#include <ATen/CPUGeneratorImpl.h>
#include <torch/torch.h>

#include <cstdint>
#include <mutex>
#include <utility>

namespace push::detail {

/// The lock every under_seed call holds while it runs.
std::mutex& seeded_work_mutex();

template <class F>
auto under_seed(uint64_t seed, F&& work) -> decltype(work()) {
  std::lock_guard<std::mutex> serial(seeded_work_mutex());
  auto generator = at::detail::getDefaultCPUGenerator();
  torch::Tensor saved;
  {
    std::lock_guard<std::mutex> lock(generator.mutex());
    saved = generator.get_state();
    generator.set_current_seed(seed);
  }
  struct Restore {
    at::Generator& generator;
    torch::Tensor& saved;
    ~Restore() {
      std::lock_guard<std::mutex> lock(generator.mutex());
      generator.set_state(saved);
    }
  } restore{generator, saved};
  return std::forward<F>(work)();
}

}  // namespace push::detail
