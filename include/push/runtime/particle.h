#pragma once
// Particle: what a receive handler sees of its own particle.
//
//   ParticleOptions().on("train", [](push::Particle& p, const push::Args& a) {
//     auto x = a[0].toTensor(), y = a[1].toTensor();
//     auto loss = p.step(mse, x, y).wait();          // runs at once on this device
//     auto peer = p.get(p.other_particles()[0]).wait();  // a copy of a peer's weights
//     p.send(peer.pid(), "hello", loss).wait();      // may suspend; never deadlocks
//     return loss;
//   });
//
// A Particle is handed to handlers only and is used on its own device's event loop:
// calling it from another thread throws. Operations on the particle itself (forward,
// step, zero_grad, scheduler_step) run at once and return completed futures; messages
// and views of other particles return futures that wait() suspends on.
#include <torch/nn/module.h>
#include <torch/optim/optimizer.h>

#include <push/core/future.h>
#include <push/runtime/types.h>
#include <push/runtime/view.h>

#include <functional>
#include <string>
#include <type_traits>
#include <vector>

namespace push {
namespace detail {
struct ParticleRecord;
class Runtime;
}  // namespace detail

class Particle {
 public:
  Particle(detail::Runtime& runtime, detail::ParticleRecord& record) : runtime_(&runtime), record_(&record) {}

  Pid pid() const;
  torch::Device device() const;
  /// The lane (device index) this particle lives on.
  int lane() const;

  torch::nn::Module& module();
  torch::nn::AnyModule& any_module();
  /// Throws if the particle was created without an optimizer factory.
  torch::optim::Optimizer& optimizer();
  State& state();

  /// module.forward(x, args...), run now. Tensors among x and args that live on another
  /// device are copied to this particle's first, as a message's tensors are.
  template <class... A>
  PFuture forward(const torch::Tensor& x, A&&... args) {
    return run_now("forward",
                   [&]() -> c10::IValue { return any_module().forward(here(x), here(std::forward<A>(args))...); });
  }

  /// The forward of the particle `view` was taken of, run now on this particle's device:
  /// this particle's module (the same architecture: one factory makes every particle)
  /// with the view's parameters and buffers in place of its own for the call, without
  /// copying them, in evaluation mode (dropout off, batch norm on the view's running
  /// statistics, left unchanged) and without a graph (the result is detached; gradients
  /// through another particle's function would reach tensors that are not its). Throws push::Error when
  /// the view's tensors do not match this module's in number, shape or type.
  template <class... A>
  PFuture forward_view(const ParticleView& view, const torch::Tensor& x, A&&... args) {
    return run_with_view(
        view, [&]() -> c10::IValue { return any_module().forward(here(x), here(std::forward<A>(args))...); });
  }

  /// zero grad, forward, loss_fn(output, label), backward, optimizer step, run now;
  /// the future holds the (detached) loss. Tensors on another device are copied to this
  /// particle's first, as in forward.
  template <class... A>
  PFuture step(const LossFn& loss_fn, const torch::Tensor& data, const torch::Tensor& label, A&&... args) {
    return run_now("step", [&]() -> c10::IValue {
      auto& opt = optimizer();
      opt.zero_grad();
      torch::Tensor out = any_module().forward(here(data), here(std::forward<A>(args))...);
      torch::Tensor loss = loss_fn(out, here(label));
      loss.backward();
      opt.step();
      return loss.detach();
    });
  }

  /// Clears the module's gradients (every parameter's, to undefined, on either LibTorch), as
  /// PusH does; the particle needs no optimizer for it.
  PFuture zero_grad();
  /// Advances the learning-rate scheduler; throws if there is none.
  PFuture scheduler_step();

  /// Sends `message` to particle `to`; its handler runs on `to`'s device.
  PFuture send(Pid to, const std::string& message, Args args = {});
  template <class A0, class... A>
  PFuture send(Pid to, const std::string& message, A0&& a0, A&&... args) {
    return send(to, message, Args{c10::IValue(std::forward<A0>(a0)), c10::IValue(std::forward<A>(args))...});
  }

  /// A copy of particle `pid`'s parameters and gradients on this particle's device.
  Future<ParticleView> get(Pid pid);

  /// Waits for every future (suspending this handler) and returns their values.
  std::vector<c10::IValue> wait(const std::vector<PFuture>& futures);
  std::vector<ParticleView> wait(const std::vector<Future<ParticleView>>& futures);

  /// Runs `fn` now with direct handles of particles `pids`, which must live on this
  /// particle's lane (this one may be among them): they are made resident and pinned for
  /// the call, and their handles work inside it as this one does. For work that treats
  /// several particles as one (fused training: push::bayes::FusedStack). `fn` must not
  /// wait (any wait inside it throws); calls do not nest. A particle borrowed may change:
  /// views taken of it before or during the call are not reused afterwards.
  void borrow(const std::vector<Pid>& pids, const std::function<void(const std::vector<Particle*>&)>& fn);

  /// Adds or replaces this particle's handler for `message`.
  void register_receive(const std::string& message, Handler handler);

  std::vector<Pid> particle_ids() const;
  std::vector<Pid> other_particles() const;

 private:
  /// `t` on this particle's device (itself when it is there already or undefined).
  torch::Tensor here(const torch::Tensor& t) const;
  template <class T>
  requires(!std::is_same_v<std::remove_cvref_t<T>, torch::Tensor>) T && here(T&& value)
  const { return std::forward<T>(value); }
  PFuture run_now(const char* what, const std::function<c10::IValue()>& fn);
  /// run_now("forward_view", fn) with the view's tensors in this module's place.
  PFuture run_with_view(const ParticleView& view, const std::function<c10::IValue()>& fn);
  void check_thread(const char* origin) const;
  void check_may_wait() const;

  detail::Runtime* runtime_;
  detail::ParticleRecord* record_;
};

}  // namespace push
