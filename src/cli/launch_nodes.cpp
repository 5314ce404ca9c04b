// The checks of a job over several hosts (launch_nodes.h).
#include "launch_nodes.h"

#include <push/core/errors.h>

#include <netdb.h>
#include <sys/socket.h>

#include <cstdlib>
#include <cstring>

#include "core/user_text.h"
#include "dist/transport/handshake.h"
#include "dist/transport/loopback.h"

namespace push::cli {

std::string secret_refusal() {
  const char* given = std::getenv("PUSH_JOB_SECRET");
  if (given == nullptr || *given == '\0') return "";
  try {
    dist::detail::handshake::from_hex(given, "PUSH_JOB_SECRET");
  } catch (const Error&) {
    return "PUSH_JOB_SECRET must be 64 hexadecimal digits (32 random bytes), got " +
           std::to_string(std::strlen(given)) +
           " characters: export PUSH_JOB_SECRET=$(openssl rand -hex 32), the same on every host, or unset it";
  }
  return "";
}

std::string nodes_refusal(int nnodes, int node_rank, const std::string& master_addr, int master_port) {
  const std::string m = "--nnodes " + std::to_string(nnodes);
  if (node_rank < 0 || node_rank >= nnodes) {
    return "--node-rank " + std::to_string(node_rank) + " is not in 0.." + std::to_string(nnodes - 1) + " (" + m + ")";
  }
  if (nnodes == 1) return "";
  if (master_addr.empty()) return m + " needs --master-addr: the address of node 0";
  if (dist::detail::is_loopback(master_addr)) {
    return m + " needs a --master-addr the other hosts reach, not the loopback " + master_addr;
  }
  {
    // Said once here; a rank would retry it until its join timed out, a line each time.
    addrinfo hints{};
    hints.ai_socktype = SOCK_STREAM;
    addrinfo* found = nullptr;
    const int rc = ::getaddrinfo(master_addr.c_str(), nullptr, &hints, &found);
    if (found != nullptr) ::freeaddrinfo(found);
    if (rc != 0) {
      return "--master-addr '" + push::detail::printable(master_addr) + "' does not resolve (" + ::gai_strerror(rc) +
             "): give node 0's address, or a name this host resolves";
    }
  }
  if (master_port <= 0) return m + " needs a --master-port (the same on every host)";
  const char* secret = std::getenv("PUSH_JOB_SECRET");
  if (secret == nullptr || *secret == '\0') {
    return m +
           " needs PUSH_JOB_SECRET in the environment, the same on every host: export "
           "PUSH_JOB_SECRET=$(openssl rand -hex 32)";
  }
  return "";
}

}  // namespace push::cli
