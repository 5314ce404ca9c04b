#pragma once
// Work for the particles of this rank, each on its own lane: a message runs the
// particle's handler as a fiber job; a view or a parameter copy is a snapshot taken on
// the particle's lane while it is quiescent.
#include <push/core/future.h>
#include <push/runtime/types.h>
#include <push/runtime/view.h>

#include <string>

#include "runtime/lanes.h"
#include "runtime/particle_record.h"

namespace push::detail {

/// An exception from particle code, rewrapped with the particle and message in its text.
std::exception_ptr wrap_particle_error(Pid pid, const std::string& message, std::exception_ptr error);

class LocalDelivery {
 public:
  explicit LocalDelivery(Lanes& lanes) : lanes_(lanes) {}

  /// Runs `record`'s handler for `message` on its lane. Any thread.
  PFuture send(ParticleRecord& record, const std::string& message, Args args);
  /// A copy of `record`'s parameters and gradients on `device`. On the record's lane.
  ParticleView::Data snapshot(ParticleRecord& record, const torch::Device& device);
  /// A view of `target` for the handler of `caller` running on `lane` (Particle::get),
  /// from the lane's view cache while `target` has not changed.
  Future<ParticleView> view(ParticleRecord& target, const ParticleRecord& caller, Lane& lane);
  /// A copy of `record`'s parameters on the CPU, taken on its lane. Any thread.
  Future<ParticleView::Data> parameters(ParticleRecord& record);

 private:
  Lanes& lanes_;
};

}  // namespace push::detail
