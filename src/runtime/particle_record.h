#pragma once
// Everything the runtime keeps about one particle. Owned by the Runtime; mutated only on
// its lane's thread (except `version`, which other lanes read to validate views).
#include <push/runtime/particle.h>
#include <push/runtime/types.h>

#include <atomic>
#include <list>
#include <memory>
#include <string>
#include <vector>

#include "runtime/lane_streams.h"

namespace push::detail {

struct ParticleRecord {
  Pid pid = -1;
  int lane = 0;
  int64_t bytes = 0;  // parameters and buffers (PushOptions::placement)
  uint64_t seed = 0;
  torch::nn::AnyModule module;
  OptimizerFactory make_optimizer;  // kept so that load() can check against a scratch copy
  std::unique_ptr<torch::optim::Optimizer> optimizer;
  SchedulerFactory make_scheduler;
  std::unique_ptr<torch::optim::LRScheduler> scheduler;
  int64_t scheduler_steps = 0;
  Handlers handlers;
  State state;
  std::vector<std::string> parameter_names;
  std::unique_ptr<Particle> handle;

  // Bumped whenever the particle may change (a handler of it is switched in, a load):
  // a view taken at version v is still exact while version == v.
  std::atomic<uint64_t> version{1};

  // Particle cache (see particle_cache.h).
  bool resident = false;
  int pins = 0;
  std::list<ParticleRecord*>::iterator lru_position;
  std::vector<torch::Tensor> slots;  // the tensors that were evicted, same TensorImpls
  std::vector<torch::Tensor> host;   // their copies in the host store
  CopiesDone host_ready;             // the copies into `host` (a GPU lane copies asynchronously)
  // One entry per parameter in module order, duplicates included (a tied weight is one
  // slot under several names): parameter i is slots[param_slot[i]], its gradient
  // slots[grad_slot[i]] (-1: none).
  std::vector<int64_t> param_slot;
  std::vector<int64_t> grad_slot;
  std::vector<int64_t> buffer_slot;  // buffer i, in module order
};

}  // namespace push::detail
