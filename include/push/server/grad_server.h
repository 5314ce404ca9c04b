#pragma once
// GradServer: asynchronous data-parallel training through reducers (machin's
// PushPullGradServer / PushPullGradServerImpl). Clients push their model's gradients to a
// secondary reducer; each secondary adds up reduce_batch_size of them and forwards the sum
// to the primary reducer; the primary adds up reduce_batch_size such sums, sets the
// managed model's gradients to their sum or mean, steps its optimizer and publishes the
// new parameters; clients pull them.
//
//   // On the primary and on every secondary (the same arguments everywhere):
//   push::server::GradServerHost host(rpc, "ps", "worker0", {"worker0", "worker1"},
//                                     GradServerOptions().reduce_method(ReduceMethod::mean));
//   if (world.rank() == 0) host.manage_model(*server_net, optimizer);   // publishes version 1
//   rpc.barrier();
//   // On any member:
//   push::server::GradServer ps(rpc, "ps");
//   ps.pull(net);                       // the newest parameters
//   loss(net).backward(); ps.push(net); // its gradients, to a random secondary
//
// "mean" is the mean over every gradient pushed into the step: the primary divides the sum
// of the sums by the number of gradients in them. (machin's "mean" is a mean of means: the
// secondaries' batch means averaged with equal weights, which weighs each gradient unequally
// when batches differ in size, e.g. when a flush forwards a short one.)
//
// Reducers add gradients up as they arrive: a secondary holds one sum, whatever the batch.
// `max_queue_size` bounds the gradients a secondary holds or has forwarded and not yet
// seen applied; a push beyond it waits until the primary has applied earlier batches
// (back-pressure). Gradients travel on the CPU and add up on `reduce_device` (the CPU by
// default, in double there); the primary copies the result to its model's device. flush()
// forwards and applies what is held in unfilled batches (machin has no such call: a last
// short batch is never applied there). The primary publishes the model through an ordered
// server it hosts, or through `model_store` (any OrderedServerBase every member reaches,
// machin's `o_server`); clients then pull from the store they are given.
#include <push/server/ordered_server.h>

#include <torch/nn/module.h>
#include <torch/optim/optimizer.h>

#include <functional>
#include <memory>
#include <random>
#include <string>
#include <vector>

namespace push::server {

enum class ReduceMethod { sum, mean };

struct GradServerOptions {
  TORCH_ARG(ReduceMethod, reduce_method) = ReduceMethod::sum;
  /// Gradients a secondary adds up before forwarding; forwarded sums the primary adds up
  /// before a step.
  TORCH_ARG(int64_t, reduce_batch_size) = 4;
  /// Gradients a secondary may hold or have in flight (>= reduce_batch_size).
  TORCH_ARG(int64_t, max_queue_size) = 64;
  /// Where reducers add gradients up: on the CPU in double (a float32 sum of many gradients
  /// rounds where their mean need not); on a GPU in the gradients' own type.
  TORCH_ARG(torch::Device, reduce_device) = torch::kCPU;
  /// Where the primary publishes the model (key "<name>/model"); null: an OrderedServer it
  /// hosts itself. Clients give GradServer the same store.
  TORCH_ARG(std::shared_ptr<const OrderedServerBase>, model_store) = nullptr;
};

/// The reducers' part: built on the primary and on each secondary (one process may be
/// both), with the same arguments everywhere, before any client pushes.
class GradServerHost {
 public:
  GradServerHost(dist::RpcGroup group, std::string name, std::string primary, std::vector<std::string> secondaries,
                 GradServerOptions options = {});
  ~GradServerHost();
  GradServerHost(const GradServerHost&) = delete;
  GradServerHost& operator=(const GradServerHost&) = delete;

  /// On the primary, once: the model the reductions train (not one a client trains: the
  /// server owns it), its optimizer, and what to call after each step (a learning-rate
  /// scheduler's step, say; it runs under the server's lock, so it must not wait on
  /// anything: no RPC, no collective). Publishes the model's parameters as version 1. The
  /// model and optimizer must outlive this host.
  void manage_model(torch::nn::Module& model, torch::optim::Optimizer& optimizer,
                    std::function<void()> after_step = {});
  /// Optimizer steps taken so far (on the primary; 0 elsewhere).
  int64_t steps() const;

  struct Primary;
  struct Secondary;

 private:
  dist::RpcGroup group_;
  std::string name_;
  dist::ServiceSet services_;
  std::shared_ptr<Primary> primary_;
  std::shared_ptr<Secondary> secondary_;
};

/// Any member's handle on the gradient server `name` of `group`. A push is delivered at
/// most once per call; a call that fails on its timeout may still have been taken (do not
/// retry it blindly when counting matters).
class GradServer {
 public:
  /// `model_store`: the store the hosts were given as GradServerOptions::model_store (null:
  /// the primary's own ordered server).
  GradServer(dist::RpcGroup group, std::string name, std::optional<dist::Milliseconds> timeout = std::nullopt,
             std::shared_ptr<const OrderedServerBase> model_store = nullptr);

  /// Sends the gradients of `module`'s trainable parameters to a random secondary, or to
  /// `secondary`. Returns once it holds them (or, when it is full, once room was made).
  void push(const torch::nn::Module& module, const std::string& secondary = "");
  /// Loads the newest published parameters into `module`; returns their version.
  int64_t pull(torch::nn::Module& module);
  /// Makes every secondary forward what it holds, then the primary take one step on all it
  /// has (when it has anything): what was pushed before flush() is applied when it returns.
  void flush();
  /// The secondary reducers, as the primary knows them.
  const std::vector<std::string>& secondaries();

 private:
  dist::RpcGroup group_;
  std::string name_;
  std::optional<dist::Milliseconds> timeout_;
  std::shared_ptr<const OrderedServerBase> model_store_;
  std::vector<std::string> secondaries_;
  std::mt19937_64 random_;
};

}  // namespace push::server
