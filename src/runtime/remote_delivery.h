#pragma once
// Work for particles of other ranks, over the distribution's RPC group (peers.h): the
// calling side (a message, a view, a parameter copy of a particle that lives elsewhere)
// and the serving side (the same requests arriving from other ranks, answered in an RPC
// handler fiber through this rank's lanes). docs/distributed.md, "Particles across
// ranks", describes the protocol and what each request costs.
#include <push/core/future.h>
#include <push/runtime/types.h>
#include <push/runtime/view.h>

#include <chrono>
#include <string>

#include "runtime/lanes.h"
#include "runtime/local_delivery.h"
#include "runtime/peers.h"
#include "runtime/registry.h"

namespace push::detail {

class RemoteDelivery {
 public:
  /// `creation_timeout`: how long a request waits for a particle another rank created and
  /// this one has yet to (the world's rpc_timeout).
  RemoteDelivery(Peers& peers, Lanes& lanes, Registry& registry, LocalDelivery& local,
                 std::chrono::milliseconds creation_timeout)
      : peers_(peers), lanes_(lanes), registry_(registry), local_(local), creation_timeout_(creation_timeout) {}

  /// Runs the handler of `pid` (at `where`, another rank) for `message`. From a handler,
  /// the result arrives on the handler's lane and device.
  PFuture send(Pid pid, const Where& where, const std::string& message, Args args);
  /// A view of `pid` (on another rank) for a handler on `caller`: one round trip, which
  /// carries the parameters only when the view `caller` keeps is out of date.
  Future<ParticleView> view(Pid pid, const Where& where, Lane& caller);
  /// A copy of `pid`'s parameters on the CPU.
  ParticleView::Data parameters(Pid pid, const Where& where);
  /// Answers a request of another rank (an RPC handler fiber).
  c10::IValue serve(PeerRequest request);

 private:
  Peers& peers_;
  Lanes& lanes_;
  Registry& registry_;
  LocalDelivery& local_;
  std::chrono::milliseconds creation_timeout_;
};

}  // namespace push::detail
