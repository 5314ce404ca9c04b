#pragma once
// Shared helpers of the test suite.
#include <push/push.h>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <ctime>
#include <string>

#include "core/clock.h"

namespace push::testing {

/// Whether `done()` holds within `limit`, checked every millisecond on push's clock: for an
/// event nobody can notify the test of (a thread that ends, a process that dies). Where a
/// future or a promise can say it, wait on that instead.
template <class Done>
bool eventually(Done done, std::chrono::milliseconds limit = std::chrono::seconds(10)) {
  return detail::Clock::poll_until(detail::Clock::deadline_after(limit), std::chrono::milliseconds(1), done);
}

/// CPU time the calling thread has used.
inline std::chrono::nanoseconds thread_cpu() {
  timespec ts{};
  ::clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return std::chrono::seconds(ts.tv_sec) + std::chrono::nanoseconds(ts.tv_nsec);
}

/// The small network most tests use: 1 -> 8 -> 1.
inline torch::nn::AnyModule tiny_mlp() {
  return to_any_module(torch::nn::Sequential(torch::nn::Linear(1, 8), torch::nn::Tanh(), torch::nn::Linear(8, 1)));
}

inline OptimizerFactory adam(double lr = 1e-2) {
  return [lr](std::vector<torch::Tensor> params) -> std::unique_ptr<torch::optim::Optimizer> {
    return std::make_unique<torch::optim::Adam>(std::move(params), torch::optim::AdamOptions(lr));
  };
}

/// SGD with momentum: an optimizer with per-parameter state.
inline OptimizerFactory sgd_momentum(double lr = 0.05) {
  return [lr](std::vector<torch::Tensor> ps) -> std::unique_ptr<torch::optim::Optimizer> {
    return std::make_unique<torch::optim::SGD>(std::move(ps), torch::optim::SGDOptions(lr).momentum(0.9));
  };
}

/// The smallest module: 1 -> 1.
inline torch::nn::AnyModule scalar_module() { return torch::nn::AnyModule(torch::nn::Linear(1, 1)); }

inline torch::Tensor mse(const torch::Tensor& out, const torch::Tensor& label) { return torch::mse_loss(out, label); }

/// The largest difference of a from b relative to b's largest magnitude, in float64.
inline double max_rel(const torch::Tensor& a, const torch::Tensor& b) {
  auto x = a.to(torch::kFloat64), y = b.to(torch::kFloat64);
  return ((x - y).abs().max() / (y.abs().max() + 1e-30)).item<double>();
}

/// Expects `statement` to throw a push::Error (or subclass) whose text contains `needle`.
#define EXPECT_PUSH_ERROR(statement, needle)                                                           \
  do {                                                                                                 \
    try {                                                                                              \
      statement;                                                                                       \
      ADD_FAILURE() << "expected a push::Error containing '" << (needle) << "'";                       \
    } catch (const ::push::Error& e) {                                                                 \
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << "message was: " << e.what(); \
    }                                                                                                  \
  } while (false)

/// True when this test binary is built with ThreadSanitizer or AddressSanitizer. Both run
/// push's code several times slower and TSan keeps shadow state for every access, so the
/// heavy tests shrink their work with scaled() rather than being skipped.
constexpr bool sanitized() {
#if defined(__SANITIZE_THREAD__) || defined(__SANITIZE_ADDRESS__)
  return true;
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer) || __has_feature(address_sanitizer)
  return true;
#else
  return false;
#endif
#else
  return false;
#endif
}

/// `n` in a plain build; under a sanitizer `n / divisor`, but at least `min` (the
/// smallest size at which the test still checks what it claims).
constexpr int64_t scaled(int64_t n, int64_t min, int64_t divisor = 10) {
  return sanitized() ? std::max(min, n / divisor) : n;
}

/// Lane counts the concurrency tests run at.
inline std::vector<int> lane_counts() { return {1, 2, 4}; }

}  // namespace push::testing
