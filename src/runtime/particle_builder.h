#pragma once
// Builds particles: the module from the distribution's factory under the particle's seed
// (without disturbing anyone's random stream), moved to its lane's device, with the
// optimizer, scheduler, handlers and state its options give. The result is not yet in the
// distribution: nothing can address it until Registry::add.
#include <push/runtime/options.h>

#include <memory>

#include "runtime/particle_record.h"

namespace push::detail {

class Runtime;

class ParticleBuilder {
 public:
  ParticleBuilder(ModuleFactory factory, uint64_t seed) : factory_(std::move(factory)), seed_(seed) {}

  /// Particle `pid` on `lane` (a lane of this rank, on `device`), handled by `runtime`.
  /// Any thread.
  std::unique_ptr<ParticleRecord> build(const ParticleOptions& options, Pid pid, int lane, const torch::Device& device,
                                        Runtime& runtime, const char* origin) const;

 private:
  ModuleFactory factory_;
  uint64_t seed_;
};

}  // namespace push::detail
