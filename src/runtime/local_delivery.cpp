#include "runtime/local_delivery.h"

#include <push/core/errors.h>
#include <push/runtime/particle.h>

#include <torch/torch.h>

#include "core/torch_compat.h"
#include "runtime/message_values.h"

namespace push::detail {

std::exception_ptr wrap_particle_error(Pid pid, const std::string& message, std::exception_ptr error) {
  try {
    std::rethrow_exception(error);
  } catch (const CancelledError& e) {
    return std::make_exception_ptr(
        CancelledError(c10::str("[push] particle ", pid, ", message '", message, "': ", e.what())));
  } catch (...) {
    return std::make_exception_ptr(ParticleError(pid, message, describe(error), error));
  }
}

PFuture LocalDelivery::send(ParticleRecord& target, const std::string& message, Args args) {
  if (Lane* here = Lane::current()) {
    detach_from_particles(args, here->cache());
    // The arguments are read on the target's lane, on its own stream.
    LaneStreams::finish_current(here->device());
  }
  ParticleRecord* record = &target;
  Promise<c10::IValue> promise;
  auto handler = [record, message, args = std::move(args), promise] {
    Lane& lane = *Lane::current();
    try {
      lane.pin_running();
      auto it = record->handlers.find(message);
      if (it == record->handlers.end()) {
        std::string known;
        for (const auto& h : record->handlers) known += (known.empty() ? "'" : ", '") + h.first + "'";
        throw Error(c10::str("unknown message '", message, "' (particle ", record->pid, " handles ",
                             known.empty() ? std::string("no messages") : known, ")"));
      }
      c10::IValue result;
      if (has_tensor_off(args, lane.device())) {
        Args local;
        local.reserve(args.size());
        for (const auto& a : args) local.push_back(to_device(a, lane.device()));
        result = it->second(*record->handle, local);
      } else {
        result = it->second(*record->handle, args);
      }
      {
        std::vector<c10::IValue> out{std::move(result)};
        detach_from_particles(out, lane.cache());
        result = std::move(out[0]);
      }
      lane.unpin_running();
      // The waiter reads the result on its own thread and stream.
      LaneStreams::finish_current(lane.device());
      promise.set_value(std::move(result));
    } catch (...) {
      lane.unpin_running();
      promise.set_error(wrap_particle_error(record->pid, message, std::current_exception()));
    }
  };
  lanes_.at(record->lane).post_handler(*record, std::move(handler), [promise](std::exception_ptr e) {
    promise.set_error(std::move(e));
  });
  return promise.future();
}

ParticleView::Data LocalDelivery::snapshot(ParticleRecord& record, const torch::Device& device) {
  Lane& lane = lanes_.at(record.lane);
  torch::NoGradGuard no_grad;
  ParticleView::Data data;
  data.pid = record.pid;
  data.version = record.version.load(std::memory_order_acquire);
  data.names = record.parameter_names;
  auto copy = [&](const torch::Tensor& t) {
    return t.defined() ? t.to(device, t.scalar_type(), /*non_blocking=*/false, /*copy=*/true) : torch::Tensor();
  };
  for (const auto& p : lane.cache().parameters(record)) data.parameters.push_back(copy(p));
  for (const auto& g : lane.cache().gradients(record)) data.gradients.push_back(copy(g));
  for (const auto& b : lane.cache().buffers(record)) data.buffers.push_back(copy(b));
  LaneStreams::finish_current(lane.device());
  return data;
}

Future<ParticleView> LocalDelivery::view(ParticleRecord& target, const ParticleRecord& caller, Lane& lane) {
  const torch::Device device = lane.device();
  if (&target == &caller) {
    // This particle is running: it changes without a version bump (versions move at
    // switch-in), so a view of itself is always fresh and never enters the view cache,
    // where a sibling could later take it for the particle's current state.
    try {
      return Future<ParticleView>::ready(
          ParticleView(std::make_shared<const ParticleView::Data>(snapshot(target, device))));
    } catch (...) {
      return Future<ParticleView>::failed(std::current_exception());
    }
  }
  // Any other particle is quiescent while its snapshot is taken (on its lane, between
  // handlers, or right here when it shares this lane), and it cannot change before its
  // next switch-in bumps its version: a cached view of the same version is exact.
  const uint64_t version = target.version.load(std::memory_order_acquire);
  if (auto hit = lane.views().lookup(target.pid, version)) return *hit;
  ParticleRecord* record = &target;
  auto view = lanes_.call<ParticleView>(target.lane, [this, record, device] {
    return ParticleView(std::make_shared<const ParticleView::Data>(snapshot(*record, device)));
  });
  lane.views().insert(target.pid, version, view);
  return view;
}

Future<ParticleView::Data> LocalDelivery::parameters(ParticleRecord& record) {
  ParticleRecord* target = &record;
  return lanes_.call<ParticleView::Data>(record.lane, [this, target] { return snapshot(*target, torch::kCPU); });
}

}  // namespace push::detail
