#pragma once
// A TCP port for a job's rendezvous (MASTER_PORT) that nobody listens on right now:
// what `push launch --master-port 0` and the multi-process tests pick.
//
//   int port = push::dist::free_port("127.0.0.1");
//
// The kernel's choice for port 0 on `address`, released before returning: another process
// may take it in between, so a caller that binds it must still handle a refusal.
#include <string>

namespace push::dist {

/// A port free on `address` (an IPv4 address; default the loopback). Throws push::Error
/// naming the address and the reason when none can be had.
int free_port(const std::string& address = "127.0.0.1");

}  // namespace push::dist
