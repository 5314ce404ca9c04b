#include "runtime/particle_builder.h"

#include <push/core/errors.h>
#include <push/runtime/particle.h>

#include <torch/torch.h>

#include "core/seed.h"
#include "core/seeded.h"

namespace push::detail {
namespace {

// Builds a module under `seed` without disturbing the global generator's sequence.
torch::nn::AnyModule build_module(const ModuleFactory& factory, uint64_t seed, Pid pid) {
  torch::nn::AnyModule module;
  try {
    module = under_seed(seed, factory);
  } catch (...) {
    throw Error(c10::str("[push::Push::p_create] the module factory threw for particle ", pid, ": ",
                         describe(std::current_exception())));
  }
  PUSH_CHECK(!module.is_empty(), "push::Push::p_create", "the module factory returned an empty module for particle ",
             pid);
  return module;
}

int64_t bytes_of(const std::vector<torch::Tensor>& tensors) {
  int64_t bytes = 0;
  for (const auto& t : tensors) bytes += t.numel() * static_cast<int64_t>(t.element_size());
  return bytes;
}

}  // namespace

std::unique_ptr<ParticleRecord> ParticleBuilder::build(const ParticleOptions& options, Pid pid, int lane,
                                                       const torch::Device& device, Runtime& runtime,
                                                       const char* origin) const {
  auto record = std::make_unique<ParticleRecord>();
  record->pid = pid;
  record->lane = lane;
  record->seed = options.seed().value_or(mix_seed(seed_, pid, seed_purpose::kParticle));
  record->module = build_module(factory_, record->seed, pid);
  auto& module = *record->module.ptr();
  record->bytes = bytes_of(module.parameters()) + bytes_of(module.buffers());
  if (device != torch::kCPU) module.to(device);
  for (const auto& item : module.named_parameters()) record->parameter_names.push_back(item.key());
  record->make_optimizer = options.optimizer();
  if (options.optimizer()) {
    record->optimizer = options.optimizer()(module.parameters());
    PUSH_CHECK(record->optimizer != nullptr, origin, "the optimizer factory returned null for particle ", pid);
  }
  if (options.scheduler()) {
    PUSH_CHECK(record->optimizer != nullptr, origin, "particle ", pid,
               " has a scheduler factory but no optimizer factory");
    record->make_scheduler = options.scheduler();
    record->scheduler = record->make_scheduler(*record->optimizer);
    PUSH_CHECK(record->scheduler != nullptr, origin, "the scheduler factory returned null for particle ", pid);
  }
  record->handlers = options.receive();
  record->state = options.state();
  record->handle = std::make_unique<Particle>(runtime, *record);
  return record;
}

}  // namespace push::detail
