// Per-thread LibTorch state across fiber switches: what one handler sets before it waits
// stays its own (autocast), and what cannot be switched (the autograd engine's state
// during a backward pass) makes wait() a clear error instead of undefined behaviour.
#include <push/push.h>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "core/torch_compat.h"

#include <ATen/autocast_mode.h>

#include <chrono>

#include "test_util.h"

namespace push {
namespace {

using namespace std::chrono_literals;
using testing::scalar_module;

c10::IValue name(at::ScalarType dtype) { return std::string(c10::toString(dtype)); }

// LibTorch 1.13 accepts only bfloat16 as the CPU autocast dtype: the CUDA one (a plain
// thread_local on CPU builds too) shows whether dtypes leak.
using Autocast = compat::AutocastState;
constexpr auto kCuda = c10::DeviceType::CUDA;

class ThreadState : public ::testing::TestWithParam<int> {};

TEST_P(ThreadState, AutocastIsPerHandler) {
  // "mixed" enables CPU autocast and picks a CUDA autocast dtype, then waits; "plain", on
  // the same lane meanwhile, must see none of it, and what "plain" changes and leaves
  // changed must reach neither "mixed" nor later handlers.
  Push dist(scalar_module, PushOptions().devices(GetParam()));
  auto gate = std::make_shared<Promise<c10::IValue>>();
  PFuture opened = gate->future();
  const auto a = torch::randn({8, 8});
  const auto lane_dtype = Autocast::dtype(kCuda);
  Pid mixed = dist.p_create(ParticleOptions().device(0).on("mixed", [opened, a](Particle&, const Args&) {
    Autocast::set_enabled(c10::DeviceType::CPU, true);
    Autocast::set_dtype(kCuda, at::kBFloat16);
    opened.wait();
    auto out = c10::ivalue::Tuple::create({c10::IValue(Autocast::is_enabled(c10::DeviceType::CPU)),
                                           name(torch::mm(a, a).scalar_type()), name(Autocast::dtype(kCuda)),
                                           c10::IValue(at::autocast::is_autocast_cache_enabled())});
    Autocast::set_enabled(c10::DeviceType::CPU, false);
    at::autocast::clear_cache();
    return out;
  }));
  Pid plain = dist.p_create(ParticleOptions().device(0).on("plain", [gate, a](Particle&, const Args&) {
    auto out = c10::ivalue::Tuple::create({c10::IValue(Autocast::is_enabled(c10::DeviceType::CPU)),
                                           name(torch::mm(a, a).scalar_type()), name(Autocast::dtype(kCuda))});
    Autocast::set_dtype(kCuda, at::kDouble);
    at::autocast::set_autocast_cache_enabled(false);
    gate->set_value(c10::IValue());
    return out;
  }));
  PFuture fm = dist.p_launch(mixed, "mixed");
  PFuture fp = dist.p_launch(plain, "plain");
  const auto p = fp.wait().toTuple()->elements().vec(), m = fm.wait().toTuple()->elements().vec();
  EXPECT_FALSE(p.at(0).toBool()) << "the suspended handler's autocast leaked";
  EXPECT_EQ(p.at(1).toStringRef(), "Float");
  EXPECT_EQ(p.at(2).toStringRef(), name(lane_dtype).toStringRef()) << "the suspended handler's autocast dtype leaked";
  EXPECT_TRUE(m.at(0).toBool());
  EXPECT_EQ(m.at(1).toStringRef(), "BFloat16");
  EXPECT_EQ(m.at(2).toStringRef(), "BFloat16") << "another handler's autocast dtype leaked in";
  EXPECT_TRUE(m.at(3).toBool()) << "another handler's autocast cache setting leaked in";
  // A later handler on the lane starts from the lane's own state.
  Pid later = dist.p_create(ParticleOptions().device(0).on("check", [](Particle&, const Args&) {
    return c10::IValue(name(Autocast::dtype(kCuda)).toStringRef() +
                       (at::autocast::is_autocast_cache_enabled() ? "/cache" : "/nocache"));
  }));
  EXPECT_EQ(dist.p_launch(later, "check").wait().toStringRef(), name(lane_dtype).toStringRef() + "/cache");
}

TEST_P(ThreadState, WaitInsideABackwardHookIsAClearError) {
  Push dist(scalar_module, PushOptions().devices(GetParam()));
  auto never = std::make_shared<Promise<c10::IValue>>();
  PFuture pending = never->future();
  PFuture done = PFuture::ready(int64_t{2});
  Pid pid = dist.p_create(ParticleOptions().on("backward", [=](Particle&, const Args& args) {
    const bool wait_pending = args[0].toBool();
    auto x = torch::ones({3}, torch::requires_grad());
    x.register_hook([&](const torch::Tensor& grad) {
      // A ready future does not suspend: allowed. A pending one would switch fibers mid-backward.
      return grad * (wait_pending ? pending : done).wait().toInt();
    });
    try {
      (x * 3).sum().backward();
    } catch (const std::exception& e) {
      return c10::IValue(std::string(e.what()));
    }
    return c10::IValue(std::string("grad ") + std::to_string(x.grad()[0].item<int64_t>()));
  }));
  EXPECT_EQ(dist.p_launch(pid, "backward", false).wait().toStringRef(), "grad 6");
  PFuture f = dist.p_launch(pid, "backward", true);
  if (!f.wait_for(5s)) never->set_value(int64_t{1});  // before the check: it suspended
  EXPECT_NE(f.wait().toStringRef().find("[push::Future::wait] cannot wait inside a backward pass"), std::string::npos)
      << f.wait().toStringRef();
  // The lane and the engine are fine afterwards.
  EXPECT_EQ(dist.p_launch(pid, "backward", false).wait().toStringRef(), "grad 6");
}

INSTANTIATE_TEST_SUITE_P(Runtime, ThreadState, ::testing::ValuesIn(testing::lane_counts()),
                         [](const auto& info) { return std::to_string(info.param) + "lanes"; });

}  // namespace
}  // namespace push
