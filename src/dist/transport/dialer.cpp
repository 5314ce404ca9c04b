#include "dist/transport/dialer.h"

#include <push/core/errors.h>

#include <fcntl.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "dist/transport/rpc_origin.h"
#include "dist/transport/sockets.h"
#include "dist/transport/transport.h"

namespace push::dist::detail {

using push::detail::Clock;

ConnectionPtr dial_member(const TransportOptions& options, ReceivePool& pool, int peer, const std::string& address,
                          Clock::time_point deadline, bool retry) {
  const sockaddr_in sa = parse_address(address);
  const std::string listener = canonical_address(address);  // as the handshake proves it
  ConnectionPtr c;
  int error = 0;
  auto cannot = [&] {
    return Error(c10::str("[", kRpcOrigin, "] cannot connect to ", options.describe(peer), " at ", address, ": ",
                          std::strerror(error)));
  };
  const bool connected = Clock::poll_until(deadline, std::chrono::milliseconds(20), [&] {
    int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    PUSH_CHECK(fd >= 0, kRpcOrigin, "cannot open a socket: ", std::strerror(errno));
    int rc = ::connect(fd, reinterpret_cast<const sockaddr*>(&sa), sizeof(sa));
    error = rc == 0 ? 0 : errno;
    if (error == EINPROGRESS) error = finish_connect(fd, deadline);
    if (error != 0) {
      ::close(fd);
      if (!retry || (error != ECONNREFUSED && error != EAGAIN)) throw cannot();
      return false;
    }
    ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) & ~O_NONBLOCK);  // sends block; reads use MSG_DONTWAIT
    set_member_socket_options(fd, options.send_timeout);
    handshake::SessionKeys keys;
    try {
      // At least a second for the handshake, however little of the dial's time is left.
      keys =
          handshake::dial(fd, options.key, options.rank, peer, listener,
                          std::max(deadline, Clock::deadline_after(std::chrono::seconds(1))), options.describe(peer));
    } catch (...) {
      ::close(fd);
      throw;
    }
    c = std::make_shared<Connection>(fd, peer, keys, handshake::encrypts(listener), &pool, options.max_message_bytes);
    return true;
  });
  if (!connected) throw cannot();
  return c;
}

}  // namespace push::dist::detail
