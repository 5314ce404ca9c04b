#include "solo_member.h"

#include <chrono>

#include "dist/rpc/rpc_test_access.h"
#include "raw_peer.h"

namespace {
c10::IValue solo_answer(const push::dist::RpcArgs&) { return c10::IValue(int64_t{42}); }
PUSH_RPC_FUNCTION(solo_answer);
}  // namespace

namespace push::testing {

using namespace std::chrono_literals;
namespace wire = dist::detail::wire;

SoloMember::SoloMember(dist::RpcGroupOptions options)
    : world(dist::WorldOptions().master_port(dist::free_port()).init_timeout(30s)),
      rpc(world.rpc_group("solo", {world.name()}, options.timeout(10s))) {}

int SoloMember::port() const { return dist::detail::RpcTestAccess::port(rpc); }

dist::detail::handshake::Bytes SoloMember::key() const { return dist::detail::RpcTestAccess::key(rpc); }

bool SoloMember::answers() const {
  RawPeer peer(port(), key());
  if (!peer.write(RawPeer::call_frame(7, "solo_answer", {}))) return false;
  auto reply = peer.read_reply(10s);
  return reply && reply->header.type == wire::kReplyOk && reply->header.id == 7 && reply->value.isInt() &&
         reply->value.toInt() == 42;
}

}  // namespace push::testing
