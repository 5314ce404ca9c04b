#pragma once
// The messages between the ranks of one distribution (peers.h), with named fields: each is
// encoded once, as the arguments of the RPC function "push.particles", and decoded once,
// every field checked, before anything acts on it. A request from another rank that does
// not decode is a push::Error naming what is wrong, and fails that request only.
#include <push/dist/rpc.h>
#include <push/runtime/types.h>
#include <push/runtime/view.h>

#include <cstdint>
#include <string>
#include <vector>

namespace push::detail {

/// What a request asks for.
enum class PeerOp : int64_t { send = 1, view = 2, parameters = 3, gather = 4 };

struct PeerRequest {
  std::string distribution;  // the name of the distribution it is for (Peers::name)
  PeerOp op = PeerOp::send;
  // send, view, parameters: the particle.
  Pid pid = -1;
  // send: the message and its arguments.
  std::string message;
  std::vector<c10::IValue> args;
  // view: the version of the view the caller keeps (0: none), answered without tensors
  // when it is still current.
  uint64_t known_version = 0;
  // gather: the round, the rank contributing, which collective it is, and its value.
  int64_t round = 0;
  int from = -1;
  std::string call;
  c10::IValue value;

  dist::RpcArgs encode() &&;
  /// Throws push::Error ("a malformed request from another rank: ...").
  static PeerRequest decode(const dist::RpcArgs& body);
};

/// The answer to a view request: the particle's version, and its tensors unless the
/// caller's view is still current.
struct ViewReply {
  uint64_t version = 0;
  bool current = false;  // the caller's view is still this version: no tensors
  std::vector<std::string> names;
  std::vector<torch::Tensor> parameters, gradients, buffers;  // gradients: undefined where none

  c10::IValue encode() &&;
  /// The tensors on `device`. Throws push::Error on a malformed reply.
  static ViewReply decode(const c10::IValue& reply, const torch::Device& device);
};

/// The answer to a parameters request: names and parameters, on the CPU.
struct ParametersReply {
  std::vector<std::string> names;
  std::vector<torch::Tensor> parameters;

  c10::IValue encode() &&;
  static ParametersReply decode(const c10::IValue& reply);
};

}  // namespace push::detail
