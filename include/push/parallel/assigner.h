#pragma once
// Model placement (machin's ModelSizeEstimator and ModelAssigner): which device each of
// several models should live on, given their sizes, how much data flows between them, and
// each device's memory budget and compute.
//
//   std::vector<torch::nn::Module*> models = {&actor, &critic, &target};
//   push::parallel::ModelAssigner assigner(models, {{{0, 1}, 10.0}, {{1, 2}, 1.0}},
//       {push::parallel::DeviceSpec{torch::Device("cuda:0"), 4LL << 30, 1.0},
//        push::parallel::DeviceSpec{torch::Device("cuda:1"), 4LL << 30, 1.0}});
//   assigner.assignment();   // e.g. {cuda:0, cuda:0, cuda:1}; models moved there (move_models)
//
// What you get: every model on one device, every device within its budget (a problem that
// cannot fit is a push::Error saying by how many bytes), at a low cost of machin's kind
// (data between models on distant devices, memory over budget, work against compute), and
// one placement per problem (the search is seeded). assigner.cpp says how it is found and
// where it parts from machin.
#include <push/core/errors.h>

#include <torch/arg.h>
#include <torch/nn/module.h>

#include <map>
#include <utility>
#include <vector>

namespace push::parallel {

/// Bytes of a module's parameters and buffers, times `size_multiplier` (room for
/// activations and inputs, as machin's ModelSizeEstimator; machin reports megabytes).
int64_t estimate_model_bytes(const torch::nn::Module& module, double size_multiplier = 2.0);

/// A device a model may go to: its memory budget in bytes and its compute (relative: a GPU
/// is 1, machin's default CPU is 0, which sends no work there unless nothing else fits).
struct DeviceSpec {
  c10::Device device = c10::kCPU;
  int64_t memory_bytes = 0;
  double compute = 1.0;
};

struct ModelAssignerOptions {
  TORCH_ARG(double, size_multiplier) = 2.0;
  TORCH_ARG(double, connection_weight) = 2.0;
  TORCH_ARG(double, size_match_weight) = 0.01;
  TORCH_ARG(double, complexity_match_weight) = 1.0;
  TORCH_ARG(double, entropy_weight) = 1.0;
  TORCH_ARG(int64_t, iterations) = 500;
  TORCH_ARG(double, update_rate) = 0.01;
  /// Distance between two GPUs, and between the CPU and a GPU (same device: 0).
  TORCH_ARG(double, gpu_gpu_distance) = 1.0;
  TORCH_ARG(double, cpu_gpu_distance) = 10.0;
  /// Move each model to its device at the end.
  TORCH_ARG(bool, move_models) = true;
  TORCH_ARG(uint64_t, seed) = 0;
  /// When the devices are detected (ModelAssigner without devices): the share of each
  /// device's free memory it may fill, and the CPU's compute (machin's defaults).
  TORCH_ARG(double, max_mem_ratio) = 0.5;
  TORCH_ARG(double, cpu_weight) = 0.0;
};

/// Connection weights between models i < j (data between them; missing pairs are 0).
using Connections = std::map<std::pair<int, int>, double>;

/// The placement problem on sizes alone: model_bytes[i] is model i's size (already
/// multiplied), devices their budgets. Returns each model's device index.
std::vector<int> assign_models(const std::vector<int64_t>& model_bytes, const Connections& connections,
                               const std::vector<DeviceSpec>& devices, const ModelAssignerOptions& options = {});

/// The CPU, with `max_mem_ratio` of the memory available now as its budget and `cpu_weight`
/// as its compute (machin's defaults: 0.5 and 0).
DeviceSpec cpu_device(double max_mem_ratio = 0.5, double cpu_weight = 0.0);
/// Every device of this process: each CUDA device (on a CUDA build of push), with
/// `max_mem_ratio` of its free memory now as its budget and compute 1, then cpu_device()
/// (with compute 1 when there is no GPU). Reading a GPU's free memory makes its CUDA context.
std::vector<DeviceSpec> detect_devices(double max_mem_ratio = 0.5, double cpu_weight = 0.0);

class ModelAssigner {
 public:
  ModelAssigner(const std::vector<torch::nn::Module*>& models, const Connections& connections,
                std::vector<DeviceSpec> devices, ModelAssignerOptions options = {});
  /// On the devices detect_devices() finds (machin's ModelAssigner with devices=None).
  ModelAssigner(const std::vector<torch::nn::Module*>& models, const Connections& connections,
                ModelAssignerOptions options = {});
  /// The device of each model, in the order given.
  const std::vector<c10::Device>& assignment() const { return assignment_; }

 private:
  std::vector<c10::Device> assignment_;
};

}  // namespace push::parallel
