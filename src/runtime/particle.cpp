#include <push/runtime/particle.h>

#include <torch/torch.h>

#include "runtime/runtime.h"

namespace push {

void Particle::check_thread(const char* origin) const {
  detail::Lane* lane = detail::Lane::current();
  PUSH_CHECK(lane != nullptr && (lane->running() == record_ || lane->lends(record_)), origin, "particle ",
             record_->pid,
             " can only be used inside one of its own handlers");
}

Pid Particle::pid() const { return record_->pid; }
int Particle::lane() const { return record_->lane; }
torch::Device Particle::device() const { return runtime_->lane(record_->lane).device(); }

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
  PUSH_CHECK(record_->optimizer != nullptr, "push::Particle::optimizer", "particle ",
             record_->pid, " was created without an optimizer factory");
  return *record_->optimizer;
}

State& Particle::state() {
  check_thread("push::Particle::state");
  return record_->state;
}

PFuture Particle::run_now(const char* what, const std::function<c10::IValue()>& fn) {
  check_thread("push::Particle");
  try {
    return PFuture::ready(fn());
  } catch (...) {
    return PFuture::failed(detail::wrap_particle_error(record_->pid, what, std::current_exception()));
  }
}

PFuture Particle::zero_grad() {
  return run_now("zero_grad", [&]() -> c10::IValue {
    optimizer().zero_grad();
    return {};
  });
}

PFuture Particle::scheduler_step() {
  return run_now("scheduler_step", [&]() -> c10::IValue {
    PUSH_CHECK(record_->scheduler != nullptr, "push::Particle::scheduler_step", "particle ",
               record_->pid, " was created without a scheduler factory");
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
  detail::Lane& lane = *detail::Lane::current();
  const detail::Where at = runtime_->where(pid, "push::Particle::get");
  if (at.rank != runtime_->rank()) return runtime_->view_remote(pid, at, lane);
  detail::ParticleRecord& target = *at.record;
  detail::Runtime* rt = runtime_;
  torch::Device device = lane.device();
  if (&target == record_) {
    // This particle is running: it changes without a version bump (versions move at
    // switch-in), so a view of itself is always fresh and never enters the view cache,
    // where a sibling could later take it for the particle's current state.
    try {
      return Future<ParticleView>::ready(
          ParticleView(std::make_shared<const ParticleView::Data>(rt->snapshot(target, device))));
    } catch (...) {
      return Future<ParticleView>::failed(std::current_exception());
    }
  }
  // Any other particle is quiescent while its snapshot is taken (on its lane, between
  // handlers, or right here when it shares this lane), and it cannot change before its
  // next switch-in bumps its version: a cached view of the same version is exact.
  const uint64_t version = target.version.load(std::memory_order_acquire);
  if (auto hit = lane.views().lookup(pid, version)) return *hit;
  auto view = rt->call_on_lane<ParticleView>(target.lane, [rt, &target, device] {
    return ParticleView(std::make_shared<const ParticleView::Data>(rt->snapshot(target, device)));
  });
  lane.views().insert(pid, version, view);
  return view;
}

void Particle::borrow(const std::vector<Pid>& pids, const std::function<void(const std::vector<Particle*>&)>& fn) {
  const char* origin = "push::Particle::borrow";
  check_thread(origin);
  detail::Lane& lane = *detail::Lane::current();
  PUSH_CHECK(!lane.lending(), origin, "borrow calls do not nest (particle ", record_->pid, ")");
  std::vector<detail::ParticleRecord*> records;
  for (Pid pid : pids) {
    const detail::Where at = runtime_->where(pid, origin);
    PUSH_CHECK(at.record != nullptr && at.record->lane == record_->lane, origin, "particle ", pid,
               " is not on the lane of particle ", record_->pid, " (rank ", runtime_->rank(), " lane ",
               record_->lane, "); it is on rank ", at.rank, " lane ", at.lane);
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
  PUSH_CHECK(handler != nullptr, "push::Particle::register_receive", "the handler for '",
             message, "' is empty");
  record_->handlers[message] = std::move(handler);
}

std::vector<Pid> Particle::particle_ids() const { return runtime_->particle_ids(); }

std::vector<Pid> Particle::other_particles() const {
  std::vector<Pid> ids = runtime_->particle_ids();
  ids.erase(std::remove(ids.begin(), ids.end(), record_->pid), ids.end());
  return ids;
}

}  // namespace push
