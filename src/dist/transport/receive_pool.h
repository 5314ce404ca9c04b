#pragma once
// Buffers for the large tensors a transport receives, kept for reuse once their tensors
// are freed. A fresh 64 MiB allocation is a fresh mapping whose 16,384 pages the kernel
// faults in and zeroes while recv fills them: on loopback that costs about as much as the
// transfer itself, so a member that receives large tensors again and again would run at
// half the speed of its socket. A pooled buffer is written over, never zeroed.
//
// Tensors from the pool are ordinary CPU tensors: their storage is resizable (a resize
// moves the bytes to the CPU allocator and gives the pooled buffer back), and they may
// outlive the pool's transport (each holds the pool).
#include <ATen/core/Tensor.h>

#include <cstddef>
#include <map>
#include <memory>
#include <mutex>

namespace push::dist::detail {

class ReceivePool : public std::enable_shared_from_this<ReceivePool> {
 public:
  /// Tensors smaller than this come from the CPU allocator (malloc's own free lists keep
  /// their pages).
  static constexpr std::size_t kMinBytes = std::size_t{1} << 20;

  /// Keeps at most `max_cached_bytes` of freed buffers; 0 turns pooling off.
  explicit ReceivePool(std::size_t max_cached_bytes) : max_cached_(max_cached_bytes) {}
  ~ReceivePool();
  ReceivePool(const ReceivePool&) = delete;
  ReceivePool& operator=(const ReceivePool&) = delete;

  /// An uninitialised contiguous CPU tensor.
  at::Tensor empty(at::IntArrayRef sizes, at::ScalarType dtype);

  /// Bytes of freed buffers held now (tests).
  std::size_t cached_bytes() const;

 private:
  struct Lease;
  static void release(void* lease);
  void give_back(void* data, std::size_t capacity);

  const std::size_t max_cached_;
  mutable std::mutex mutex_;
  std::multimap<std::size_t, void*> free_;  // by capacity
  std::size_t cached_ = 0;
};

}  // namespace push::dist::detail
