#pragma once
// ModelServer: one model's parameters and buffers shared through an ordered server, each
// version pushed only by whoever holds the newest one (machin's PushPullModelServer).
//
//   // One member hosts the ordered server (see ordered_server.h); on every member:
//   push::server::ModelServer models(push::server::OrderedServer(rpc, "models"), "actor");
//   models.pull(net);              // the newest version into net (false: none yet)
//   ... train net a while ...
//   if (!models.push(net)) { ... }  // lost the race: net now holds the winner's version
//
// A handle remembers the version its module last pushed or pulled (machin stores it on the
// module as `pp_version`): use one handle per local copy of the model. push() publishes
// version() + 1 when version() is still the newest on the server, so of members that
// started from one version exactly one publishes; the others (pull_on_fail) load the
// winner's parameters. The first push creates the model (version 1). Gradients are left
// alone. The module must have the server's parameter and buffer names and shapes: a
// mismatch is a push::Error naming the tensor. Any OrderedServerBase can hold the model
// (machin's `o_server`): push's OrderedServer, or a backend of your own.
#include <push/server/ordered_server.h>

#include <torch/nn/module.h>

#include <memory>
#include <string>

namespace push::server {

class ModelServer {
 public:
  explicit ModelServer(OrderedServer server, std::string model_name = "model");
  /// The model kept in another ordered-server backend (not null).
  explicit ModelServer(std::shared_ptr<const OrderedServerBase> server, std::string model_name = "model");

  const std::string& model_name() const { return model_name_; }
  /// The version this handle's module holds (0: none pushed or pulled yet).
  int64_t version() const { return version_; }

  /// Publishes `module`'s parameters and buffers as version() + 1 if version() is the
  /// newest; returns whether it did. Otherwise, with pull_on_fail, loads the newest.
  bool push(torch::nn::Module& module, bool pull_on_fail = true);
  /// Loads the newest version into `module`; false when none has been pushed.
  bool pull(torch::nn::Module& module);

 private:
  std::shared_ptr<const OrderedServerBase> server_;
  std::string model_name_;
  int64_t version_ = 0;
};

/// A module's parameters and buffers by name, detached CPU copies (what ModelServer sends).
c10::Dict<std::string, at::Tensor> state_of(const torch::nn::Module& module);
/// Copies `state` into `module`'s parameters and buffers (onto their devices); push::Error
/// naming the tensor when a name is missing on either side or a shape differs.
void load_state(torch::nn::Module& module, const c10::Dict<std::string, at::Tensor>& state, const char* origin);

}  // namespace push::server
