#pragma once
// Fused particles: N networks of one architecture trained as one batched computation.
//
// With layers as small as an MLP's, a loop over N networks spends its time dispatching
// N small operations per layer; stacked, the N networks are one operation per layer:
// weights [N, out, in] and `baddbmm` for Linear (convolutions stay one per member: on CPU
// they cost the same either way), and one optimizer step over all stacked parameters at
// once (LibTorch's optimizers are element-wise, so stacking changes no arithmetic). On the
// CPU a chain of Linear layers and activations in float32 runs forward and backward as
// one autograd node over the BLAS that LibTorch's matrix products call: the same products,
// equal to float rounding (src/bayes/fused_mlp.h). That path has no second
// derivative: a backward with create_graph through it throws push::Error.
//
//   std::vector<torch::nn::Module*> nets = ...;           // one architecture
//   std::vector<torch::optim::Optimizer*> opts = ...;     // made by `factory`
//   push::bayes::FusedStack stack(nets, opts, factory);   // copies them in
//   stack.zero_grad();
//   auto out = stack.forward(x);                          // x [N, B, ...] -> [N, B, out]
//   loss_of(out).sum().backward();                        // member i's gradient lands in
//   stack.step();                                         //   parameters()[k].grad()[i]
//   stack.write_back();                                   // members hold the result
//
// The stack is a working copy: between construction and write_back() the members' own
// tensors keep the values they had before. Supported: a torch::nn::Sequential (or the
// learned-noise wrapper around one) of Linear, Conv2d, MaxPool2d, Flatten (from dim 1),
// ReLU, LeakyReLU, Tanh, Sigmoid, Identity and push::bayes::Dropout (each member draws
// its masks from its own generator, as it would alone); optimizers Adam, AdamW, SGD,
// RMSprop and Adagrad with one parameter group. fusion_blocker() says why anything else
// is not fused; push::bayes::Infer then trains those particles one by one.
#include <push/runtime/types.h>

#include <torch/torch.h>

#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace push::bayes {

/// Why `module` (with `optimizer`, a sample of its members' kind, when given) cannot be
/// fused: a sentence naming the layer or optimizer, or "" when it can.
std::string fusion_blocker(torch::nn::Module& module, torch::optim::Optimizer* optimizer = nullptr);

class FusedStack {
 public:
  /// Copies the members' parameters and optimizer state into stacks. `optimizers` is
  /// empty (no optimizer) or one per member, all made by `make_optimizer`. Throws
  /// push::Error naming the reason when the members cannot be fused (architectures,
  /// optimizer options or step counts differ, an unsupported module or optimizer).
  FusedStack(const std::vector<torch::nn::Module*>& members, const std::vector<torch::optim::Optimizer*>& optimizers,
             const OptimizerFactory& make_optimizer);
  ~FusedStack();
  FusedStack(const FusedStack&) = delete;
  FusedStack& operator=(const FusedStack&) = delete;

  int64_t size() const;
  /// Member i's forward on x[i], for all i at once: x [N, B, ...] -> [N, B, outputs].
  torch::Tensor forward(const torch::Tensor& x);
  /// The stacked parameters [N, ...] in the members' parameter order (autograd leaves).
  const std::vector<torch::Tensor>& parameters() const;
  /// Their names in the members' named_parameters().
  const std::vector<std::string>& parameter_names() const;
  /// Sets the stacks' gradients to zero. They are views of one buffer, which backward
  /// adds into; a gradient assigned instead is copied into the buffer at the next step().
  void zero_grad();
  /// One step of the members' optimizer over all of them (throws without one). The stacks
  /// and their gradients are views of one buffer each, and the step is one step of that
  /// optimizer kind over the buffer: the same arithmetic as the members' steps, element by
  /// element. A stack without a gradient steps as if it were zero (a member alone would skip it).
  void step();
  /// All stacks in one buffer: stack k is flat_values().narrow(0, flat_range(k).first,
  /// flat_range(k).second) (the same storage), and likewise its gradient.
  const torch::Tensor& flat_values() const;
  const torch::Tensor& flat_gradients();
  std::pair<int64_t, int64_t> flat_range(size_t k) const;
  /// [N, D]: each member's parameters, detached, flattened and concatenated in order.
  torch::Tensor flat_parameters() const;
  /// Copies the stacks' parameters, gradients and optimizer state into the members.
  void write_back();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace push::bayes
