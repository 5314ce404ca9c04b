#pragma once
// Push: a distribution of particles (networks with their own optimizers) that run
// concurrently on device lanes, exchange messages and read each other's parameters.
//
//   push::Push dist([] { return torch::nn::AnyModule(torch::nn::Linear(1, 1)); },
//                   push::PushOptions().devices(2).cache_size(4));
//   auto opts = push::ParticleOptions()
//       .optimizer([](std::vector<torch::Tensor> ps) {
//         return std::make_unique<torch::optim::Adam>(ps, torch::optim::AdamOptions(1e-2));
//       })
//       .on("train", [](push::Particle& p, const push::Args& a) {
//         return p.step(mse, a[0].toTensor(), a[1].toTensor()).wait();
//       });
//   std::vector<push::PFuture> fs;
//   for (int i = 0; i < 8; ++i) fs.push_back(dist.p_launch(dist.p_create(opts), "train", x, y));
//   dist.p_wait(fs);
//   dist.save("ckpt");
//
// Thread-safety: every member may be called from any thread, including from inside a
// handler. The destructor cancels work that has not started, unwinds suspended
// handlers (their futures fail with CancelledError) and joins every thread. Destroyed
// from inside one of its own handlers, it returns at once instead: new work is refused
// and a background thread does the rest as soon as that handler returns or waits (the
// handler must not touch the distribution afterwards).
#include <push/core/future.h>
#include <push/runtime/options.h>
#include <push/runtime/particle.h>
#include <push/runtime/types.h>

#include <filesystem>
#include <memory>
#include <string>
#include <vector>

namespace push {
namespace detail {
class Runtime;
}

/// Counters of one device's particle cache.
struct CacheStats {
  int64_t resident = 0;   // particles materialized now
  int64_t evictions = 0;  // particles copied out to the host store
  int64_t restores = 0;   // particles copied back from it
  int64_t view_hits = 0;  // get() answered from the view cache
  int64_t view_misses = 0;
};

class Push {
 public:
  explicit Push(ModuleFactory module_factory, PushOptions options = {});
  /// Accepts any factory whose result converts to torch::nn::AnyModule (a ModuleHolder
  /// such as torch::nn::Linear, a std::shared_ptr<MyModule>, or a torch::nn::Sequential).
  template <class F, class = std::enable_if_t<!std::is_convertible_v<F, ModuleFactory> && std::is_invocable_v<F&>>>
  explicit Push(F factory, PushOptions options = {})
      : Push(ModuleFactory([f = std::move(factory)]() mutable { return to_any_module(f()); }), std::move(options)) {}
  ~Push();
  Push(const Push&) = delete;
  Push& operator=(const Push&) = delete;

  /// Creates a particle and returns its id.
  Pid p_create(ParticleOptions options = {});

  /// Runs `pid`'s handler for `message` on its device.
  PFuture p_launch(Pid pid, const std::string& message, Args args = {});
  template <class A0, class... A>
  PFuture p_launch(Pid pid, const std::string& message, A0&& a0, A&&... args) {
    return p_launch(pid, message, Args{c10::IValue(std::forward<A0>(a0)), c10::IValue(std::forward<A>(args))...});
  }

  /// Waits for every future; returns their values or rethrows the first error.
  std::vector<c10::IValue> p_wait(const std::vector<PFuture>& futures);

  /// Copies (on the CPU) of `pid`'s parameters, in module order.
  std::vector<torch::Tensor> p_parameters(Pid pid);
  /// Like p_parameters, keyed by parameter name.
  std::vector<std::pair<std::string, torch::Tensor>> p_named_parameters(Pid pid);

  /// Every particle of the distribution (on every rank), ascending.
  std::vector<Pid> particle_ids() const;
  int64_t num_particles() const;
  /// This rank's particles (all of them without a world).
  std::vector<Pid> local_particle_ids() const;
  /// This process's rank and the number of ranks (0 and 1 without a world).
  int rank() const;
  int world_size() const;
  /// Where particle `pid` lives: its rank and its lane (device index) there.
  int rank_of(Pid pid) const;
  int lane_of(Pid pid) const;
  /// Collective with a world: returns once every rank has called it, or throws at once
  /// when a rank is lost. Without a world it returns at once.
  void barrier();
  /// Collective with a world: every rank contributes `value` and gets every rank's, by
  /// rank (other ranks' tensors arrive on the CPU; this rank's own value is returned as
  /// it is); throws at once when a rank is lost. `tag` names the call: ranks whose tags,
  /// or numbers of particles, differ fail it (and every later collective). Without a
  /// world: {value}.
  std::vector<c10::IValue> all_gather(c10::IValue value, const std::string& tag = "");
  /// Collective with a world, for a step that must succeed on every rank or fail on all:
  /// every rank contributes `value`, or the error that stopped it (`error`, non-null).
  /// When no rank failed, each gets every rank's value, by rank; when one did, every rank
  /// throws: its own error first, else push::Error "[tag] failed on rank r (name): why".
  /// `tag` names the call (ranks whose tags differ fail it) and the errors. Without a
  /// world: {value}, or `error` rethrown.
  std::vector<c10::IValue> all_gather_or_throw(c10::IValue value, const std::exception_ptr& error,
                                               const std::string& tag = "");
  /// Lanes (devices) of this rank.
  int num_devices() const;
  torch::Device device(int lane) const;
  CacheStats cache_stats(int lane) const;

  /// Writes every particle's parameters, buffers, optimizer and scheduler state, user
  /// state and id to `dir`, atomically (a crash mid-save leaves any previous checkpoint
  /// at `dir` intact). `dir` must be new, empty or a push checkpoint: the folder is
  /// replaced as a whole. Callable from a handler too; it waits for the particles' lanes.
  void save(const std::filesystem::path& dir);
  /// Writes the particles `pids` alone (PusH's save_to_disk, for any number of them), as
  /// save does; load_particles reads such a checkpoint back. With a world, collective:
  /// every rank passes the same ids, and each writes its own of them.
  void save(const std::filesystem::path& dir, const std::vector<Pid>& pids);

  /// Restores the particles saved in `dir`. A saved id that exists here is overwritten;
  /// one that does not is created with `make_options(pid)` (handlers, optimizer factory;
  /// without it, a missing id is an error). Particles here but not in `dir` are an error.
  void load(const std::filesystem::path& dir, const std::function<ParticleOptions(Pid)>& make_options = nullptr);
  /// As load, but the particles here that `dir` does not hold stay as they are: restores
  /// the particles a save(dir, pids) wrote. Returns their ids, ascending.
  std::vector<Pid> load_particles(const std::filesystem::path& dir,
                                  const std::function<ParticleOptions(Pid)>& make_options = nullptr);

 private:
  std::shared_ptr<detail::Runtime> runtime_;
};

}  // namespace push
