#include "runtime/remote_delivery.h"

#include <torch/torch.h>

#include "runtime/message_values.h"

namespace push::detail {
namespace {

// What went wrong on another rank (its own message), or on the way there.
std::string remote_detail(const std::exception_ptr& error) {
  try {
    std::rethrow_exception(error);
  } catch (const dist::RemoteError& e) {
    return e.remote_message();
  } catch (...) {
    return describe(error);
  }
}

// A failure of a particle on another rank, or of the way there, as a ParticleError
// naming the particle, the message and the rank.
std::exception_ptr remote_particle_error(Pid pid, const std::string& message, const std::string& rank,
                                         const std::exception_ptr& error) {
  return std::make_exception_ptr(ParticleError(pid, message, c10::str("on ", rank, ": ", remote_detail(error)), error));
}

}  // namespace

// -- calling --------------------------------------------------------------------------------

namespace {

// Runs `complete` where the caller will want the result: on its lane (a handler: the
// tensors are moved to its device there, and continuations run on the lane) or, for a
// user thread, on the RPC group's I/O thread that received the reply (continuations of
// such futures must be short and never wait, as for any RPC future).
void complete_on(const std::weak_ptr<Lane>& lane, std::function<void()> complete,
                 std::function<void(std::exception_ptr)> cancel) {
  if (lane.expired() && !cancel) {
    complete();
    return;
  }
  if (auto l = lane.lock()) {
    l->post_inline(std::move(complete), std::move(cancel));
  } else {
    cancel(std::make_exception_ptr(CancelledError("[push] the distribution was destroyed")));
  }
}

}  // namespace

PFuture RemoteDelivery::send(Pid pid, const Where& where, const std::string& message, Args args) {
  Lane* here = Lane::current();
  const std::string rank = peers_.describe(where.rank);
  // The bytes leave when the request is written, but a send can queue behind another:
  // a particle's live tensors are copied now, as for a message to a sibling.
  if (here) detach_from_particles(args, here->cache());
  PeerRequest request;
  request.op = PeerOp::send;
  request.pid = pid;
  request.message = message;
  request.args = std::move(args);
  PFuture reply;
  try {
    reply = peers_.call(where.rank, std::move(request));
  } catch (...) {
    return PFuture::failed(remote_particle_error(pid, message, rank, std::current_exception()));
  }
  Promise<c10::IValue> out;
  const PFuture in = reply;
  std::weak_ptr<Lane> lane;
  if (here) lane = lanes_.weak(here->index());
  std::optional<torch::Device> device;
  if (here) device = here->device();
  auto finish = [in, out, pid, message, device, rank] {
    if (auto error = in.error()) {
      out.set_error(remote_particle_error(pid, message, rank, error));
      return;
    }
    try {
      // A handler gets the result on its own device, as the handler on the other rank
      // got the arguments on its own.
      out.set_value(device ? to_device(in.wait(), *device) : in.wait());
    } catch (...) {
      out.set_error(remote_particle_error(pid, message, rank, std::current_exception()));
    }
  };
  std::function<void(std::exception_ptr)> cancel;
  if (here) cancel = [out](std::exception_ptr e) { out.set_error(std::move(e)); };
  in.on_complete([lane, finish, cancel] { complete_on(lane, finish, cancel); });
  return out.future();
}

Future<ParticleView> RemoteDelivery::view(Pid pid, const Where& where, Lane& caller) {
  // The version of the view this lane keeps goes with the request: the owner answers
  // "still current" (no tensor bytes) or with a fresh copy. A request still on its way
  // is not shared: it may have been answered before a change this handler knows of.
  std::optional<Future<ParticleView>> kept = caller.views().peek(pid);
  if (kept && !kept->is_ready()) kept.reset();
  const uint64_t version = kept ? kept->wait().version() : 0;
  const std::string rank = peers_.describe(where.rank);
  auto fail = [pid, rank](const std::exception_ptr& error) {
    return std::make_exception_ptr(
        Error(c10::str("[push::Particle::get] particle ", pid, " on ", rank, ": ", remote_detail(error))));
  };
  PFuture reply;
  try {
    PeerRequest request;
    request.op = PeerOp::view;
    request.pid = pid;
    request.known_version = version;
    reply = peers_.call(where.rank, std::move(request));
  } catch (...) {
    return Future<ParticleView>::failed(fail(std::current_exception()));
  }
  Promise<ParticleView> out;
  const PFuture in = reply;
  const torch::Device device = caller.device();
  Lane* lane_of_caller = &caller;
  auto finish = [in, out, kept, lane_of_caller, device, pid, fail] {
    try {
      ViewReply answer = ViewReply::decode(in.wait(), device);
      PUSH_CHECK(!answer.current || kept, "push::Push", "a view answered as current that this lane does not keep");
      if (answer.current) {
        lane_of_caller->views().count_hit();
        out.set_value(kept->wait());
        return;
      }
      lane_of_caller->views().count_miss();
      auto data = std::make_shared<ParticleView::Data>();
      data->pid = pid;
      data->version = answer.version;
      data->names = std::move(answer.names);
      data->parameters = std::move(answer.parameters);
      data->gradients = std::move(answer.gradients);
      data->buffers = std::move(answer.buffers);
      out.set_value(ParticleView(std::move(data)));
    } catch (...) {
      out.set_error(fail(std::current_exception()));
    }
  };
  std::weak_ptr<Lane> lane = lanes_.weak(caller.index());
  std::function<void(std::exception_ptr)> cancel = [out](std::exception_ptr e) { out.set_error(std::move(e)); };
  in.on_complete([lane, finish, cancel] { complete_on(lane, finish, cancel); });
  Future<ParticleView> view = out.future();
  caller.views().insert(pid, 0, view);
  return view;
}

ParticleView::Data RemoteDelivery::parameters(Pid pid, const Where& where) {
  ParametersReply reply;
  try {
    PeerRequest request;
    request.op = PeerOp::parameters;
    request.pid = pid;
    reply = ParametersReply::decode(peers_.call(where.rank, std::move(request)).wait());
  } catch (...) {
    throw Error(c10::str("[push::Push::p_parameters] particle ", pid, " on ", peers_.describe(where.rank), ": ",
                         remote_detail(std::current_exception())));
  }
  ParticleView::Data data;
  data.pid = pid;
  data.names = std::move(reply.names);
  data.parameters = std::move(reply.parameters);
  return data;
}

// -- serving --------------------------------------------------------------------------------

c10::IValue RemoteDelivery::serve(PeerRequest request) {
  const Pid pid = request.pid;
  switch (request.op) {
    case PeerOp::send: {
      ParticleRecord& record = registry_.await_local(pid, creation_timeout_, "push::Particle::send");
      try {
        // Served until this rank has left the others (a Push closed from its own handler
        // still meets them first); the lanes refuse it after.
        return local_.send(record, request.message, std::move(request.args)).wait();
      } catch (const ParticleError& e) {
        // The caller names the particle, the message and this rank: send what happened.
        throw Error(describe(e.cause()));
      }
    }
    case PeerOp::view: {
      ParticleRecord& record = registry_.await_local(pid, creation_timeout_, "push::Particle::get");
      ViewReply reply;
      if (request.known_version != 0 && record.version.load(std::memory_order_acquire) == request.known_version) {
        reply.version = request.known_version;
        reply.current = true;
        return std::move(reply).encode();
      }
      auto data = local_.parameters(record).wait();
      reply.version = data.version;
      reply.names = std::move(data.names);
      reply.parameters = std::move(data.parameters);
      reply.gradients = std::move(data.gradients);
      reply.buffers = std::move(data.buffers);
      return std::move(reply).encode();
    }
    case PeerOp::parameters: {
      ParticleRecord& record = registry_.await_local(pid, creation_timeout_, "push::Push::p_parameters");
      auto data = local_.parameters(record).wait();
      ParametersReply reply;
      reply.names = std::move(data.names);
      reply.parameters = std::move(data.parameters);
      return std::move(reply).encode();
    }
    case PeerOp::gather:
      break;
  }
  throw Error(c10::str("[push::Push] unknown request ", static_cast<int64_t>(request.op), " from another rank"));
}

}  // namespace push::detail
