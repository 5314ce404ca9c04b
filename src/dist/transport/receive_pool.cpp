#include "dist/transport/receive_pool.h"

#include <ATen/ATen.h>
#include <c10/core/CPUAllocator.h>
#include <c10/core/Storage.h>

#include <cstdlib>
#include <new>

namespace push::dist::detail {

namespace {
constexpr std::size_t kAlignment = 64;                   // as LibTorch's CPU allocator
constexpr std::size_t kGranule = std::size_t{64} << 10;  // capacities are multiples of this
}  // namespace

struct ReceivePool::Lease {
  std::shared_ptr<ReceivePool> pool;
  void* data;
  std::size_t capacity;
};

ReceivePool::~ReceivePool() {
  for (auto& [capacity, data] : free_) std::free(data);
}

void ReceivePool::release(void* lease) {
  std::unique_ptr<Lease> l(static_cast<Lease*>(lease));
  l->pool->give_back(l->data, l->capacity);
}

void ReceivePool::give_back(void* data, std::size_t capacity) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (cached_ + capacity <= max_cached_) {
      free_.emplace(capacity, data);
      cached_ += capacity;
      return;
    }
  }
  std::free(data);
}

std::size_t ReceivePool::cached_bytes() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return cached_;
}

at::Tensor ReceivePool::empty(at::IntArrayRef sizes, at::ScalarType dtype) {
  const auto options = at::TensorOptions().dtype(dtype);
  std::size_t bytes = c10::elementSize(dtype);
  for (auto s : sizes) bytes *= static_cast<std::size_t>(s);
  if (bytes < kMinBytes || max_cached_ == 0) return at::empty(sizes, options);
  void* data = nullptr;
  std::size_t capacity = 0;
  {
    // The smallest free buffer that fits, unless it would waste more than it holds.
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = free_.lower_bound(bytes);
    if (it != free_.end() && it->first / 2 <= bytes) {
      capacity = it->first;
      data = it->second;
      cached_ -= capacity;
      free_.erase(it);
    }
  }
  if (data == nullptr) {
    capacity = (bytes + kGranule - 1) / kGranule * kGranule;
    if (posix_memalign(&data, kAlignment, capacity) != 0) throw std::bad_alloc();
  }
  auto lease = std::make_unique<Lease>();
  lease->data = data;
  lease->capacity = capacity;
  try {
    lease->pool = shared_from_this();
  } catch (...) {
    std::free(data);
    throw;
  }
  c10::DataPtr ptr(data, lease.release(), &ReceivePool::release, c10::Device(c10::kCPU));
  c10::Storage storage(c10::Storage::use_byte_size_t(), static_cast<int64_t>(bytes), std::move(ptr),
                       c10::GetCPUAllocator(), /*resizable=*/true);
  return at::empty({0}, options).set_(std::move(storage), 0, sizes);
}

}  // namespace push::dist::detail
