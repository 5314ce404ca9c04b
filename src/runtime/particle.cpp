#include <push/runtime/particle.h>

#include <torch/torch.h>

#include "runtime/message_values.h"
#include "runtime/runtime.h"

namespace push {

void Particle::check_thread(const char* origin) const {
  detail::Lane* lane = detail::Lane::current();
  PUSH_CHECK(lane != nullptr && (lane->running() == record_ || lane->lends(record_)), origin, "particle ", record_->pid,
             " can only be used inside one of its own handlers");
}

Pid Particle::pid() const { return record_->pid; }
int Particle::lane() const { return record_->lane; }
torch::Device Particle::device() const { return runtime_->lanes().at(record_->lane).device(); }

torch::nn::Module& Particle::module() {
  check_thread("push::Particle::module");
  return *record_->module.ptr();
}

torch::nn::AnyModule& Particle::any_module() {
  check_thread("push::Particle::any_module");
  return record_->module;
}

torch::optim::Optimizer& Particle::optimizer() {
  check_thread("push::Particle::optimizer");
  PUSH_CHECK(record_->optimizer != nullptr, "push::Particle::optimizer", "particle ", record_->pid,
             " was created without an optimizer factory");
  return *record_->optimizer;
}

State& Particle::state() {
  check_thread("push::Particle::state");
  return record_->state;
}

torch::Tensor Particle::here(const torch::Tensor& t) const { return detail::to_device(t, device()); }

PFuture Particle::run_now(const char* what, const std::function<c10::IValue()>& fn) {
  check_thread("push::Particle");
  try {
    return PFuture::ready(fn());
  } catch (...) {
    return PFuture::failed(detail::wrap_particle_error(record_->pid, what, std::current_exception()));
  }
}

namespace {

/// Puts `view`'s tensors in place of `module`'s parameters and buffers (set_data: the
/// same tensor objects, the view's data) and puts the module's own back when it ends.
class ViewInPlace {
 public:
  ViewInPlace(torch::nn::Module& module, const ParticleView& view) {
    const char* origin = "push::Particle::forward_view";
    auto params = module.parameters();
    auto buffers = module.buffers();
    PUSH_CHECK(view.parameters().size() == params.size() && view.buffers().size() == buffers.size(), origin,
               "the view of particle ", view.pid(), " has ", view.parameters().size(), " parameters and ",
               view.buffers().size(), " buffers, this module ", params.size(), " and ", buffers.size());
    auto place = [&](std::vector<torch::Tensor>& own, const std::vector<torch::Tensor>& theirs, const char* kind) {
      for (size_t i = 0; i < own.size(); ++i) {
        PUSH_CHECK(theirs[i].sizes() == own[i].sizes() && theirs[i].scalar_type() == own[i].scalar_type() &&
                       theirs[i].device() == own[i].device(),
                   origin, kind, " ", i, " of the view of particle ", view.pid(), " is ", theirs[i].scalar_type(),
                   theirs[i].sizes(), " on ", theirs[i].device(), ", this module's ", own[i].scalar_type(),
                   own[i].sizes(), " on ", own[i].device());
      }
      for (size_t i = 0; i < own.size(); ++i) {
        saved_.push_back({own[i], own[i].data()});
        own[i].set_data(theirs[i]);
      }
    };
    try {
      place(params, view.parameters(), "parameter");
      place(buffers, view.buffers(), "buffer");
    } catch (...) {
      restore();
      throw;
    }
  }
  ~ViewInPlace() { restore(); }
  ViewInPlace(const ViewInPlace&) = delete;
  ViewInPlace& operator=(const ViewInPlace&) = delete;

 private:
  void restore() {
    // Backwards: a tensor listed twice (a tied weight) gets its first saved data last.
    for (auto it = saved_.rbegin(); it != saved_.rend(); ++it) it->first.set_data(it->second);
    saved_.clear();
  }
  std::vector<std::pair<torch::Tensor, torch::Tensor>> saved_;
};

}  // namespace

PFuture Particle::run_with_view(const ParticleView& view, const std::function<c10::IValue()>& fn) {
  return run_now("forward_view", [&]() -> c10::IValue {
    torch::NoGradGuard no_grad;
    // Evaluation mode: dropout off, batch norm on the view's running statistics, which it
    // must not update (the view is shared through the view cache).
    struct Mode {
      torch::nn::Module& m;
      bool training;
      ~Mode() { m.train(training); }
    } mode{module(), module().is_training()};
    module().eval();
    ViewInPlace in_place(module(), view);
    return fn();
  });
}

PFuture Particle::zero_grad() {
  return run_now("zero_grad", [&]() -> c10::IValue {
    module().zero_grad(/*set_to_none=*/true);  // as LibTorch 2.x and PyTorch do by default
    return {};
  });
}

PFuture Particle::scheduler_step() {
  return run_now("scheduler_step", [&]() -> c10::IValue {
    PUSH_CHECK(record_->scheduler != nullptr, "push::Particle::scheduler_step", "particle ", record_->pid,
               " was created without a scheduler factory");
    record_->scheduler->step();
    ++record_->scheduler_steps;
    return {};
  });
}

PFuture Particle::send(Pid to, const std::string& message, Args args) {
  check_thread("push::Particle::send");
  return runtime_->send(to, message, std::move(args), "push::Particle::send");
}

Future<ParticleView> Particle::get(Pid pid) {
  check_thread("push::Particle::get");
  return runtime_->view(pid, *record_, *detail::Lane::current(), "push::Particle::get");
}

void Particle::borrow(const std::vector<Pid>& pids, const std::function<void(const std::vector<Particle*>&)>& fn) {
  const char* origin = "push::Particle::borrow";
  check_thread(origin);
  detail::Lane& lane = *detail::Lane::current();
  PUSH_CHECK(!lane.lending(), origin, "borrow calls do not nest (particle ", record_->pid, ")");
  std::vector<detail::ParticleRecord*> records;
  for (Pid pid : pids) {
    const detail::Where at = runtime_->registry().where(pid, origin);
    PUSH_CHECK(at.record != nullptr && at.record->lane == record_->lane, origin, "particle ", pid,
               " is not on the lane of particle ", record_->pid, " (rank ", runtime_->rank(), " lane ", record_->lane,
               "); it is on rank ", at.rank, " lane ", at.lane);
    PUSH_CHECK(std::find(records.begin(), records.end(), at.record) == records.end(), origin, "particle ", pid,
               " is listed twice");
    records.push_back(at.record);
  }
  // Pinned for the call (this particle already is): resident, and not evicted while a
  // sibling is made resident.
  std::vector<detail::ParticleRecord*> pinned;
  auto give_back = [&] {
    lane.take_back();
    // fn may have changed them: a view taken meanwhile (of this version) is stale now.
    for (detail::ParticleRecord* r : pinned) {
      r->version.fetch_add(1, std::memory_order_acq_rel);
      lane.cache().unpin(*r);
    }
  };
  std::vector<Particle*> handles;
  try {
    for (detail::ParticleRecord* r : records) {
      if (r != record_) {
        lane.cache().pin(*r);
        pinned.push_back(r);
        r->version.fetch_add(1, std::memory_order_acq_rel);
      }
      handles.push_back(r->handle.get());
    }
    lane.lend(records);
    fn(handles);
  } catch (...) {
    give_back();
    throw;
  }
  give_back();
}

void Particle::check_may_wait() const {
  check_thread("push::Particle::wait");
  // Also when nothing needs waiting for (the loop refuses the waits that suspend).
  PUSH_CHECK(!detail::Lane::current()->lending(), "push::Particle::wait",
             "a handler cannot wait inside Particle::borrow");
}

std::vector<c10::IValue> Particle::wait(const std::vector<PFuture>& futures) {
  check_may_wait();
  return wait_all(futures);
}

std::vector<ParticleView> Particle::wait(const std::vector<Future<ParticleView>>& futures) {
  check_may_wait();
  return wait_all(futures);
}

void Particle::register_receive(const std::string& message, Handler handler) {
  check_thread("push::Particle::register_receive");
  PUSH_CHECK(handler != nullptr, "push::Particle::register_receive", "the handler for '", message, "' is empty");
  record_->handlers[message] = std::move(handler);
}

std::vector<Pid> Particle::particle_ids() const { return runtime_->registry().particle_ids(); }

std::vector<Pid> Particle::other_particles() const {
  std::vector<Pid> ids = runtime_->registry().particle_ids();
  ids.erase(std::remove(ids.begin(), ids.end(), record_->pid), ids.end());
  return ids;
}

}  // namespace push
