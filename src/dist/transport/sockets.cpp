#include "dist/transport/sockets.h"

#include <push/core/errors.h>

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <netdb.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstdlib>
#include <cstring>

#include "dist/transport/loopback.h"
#include "dist/transport/rpc_origin.h"

namespace push::dist::detail {

using push::detail::Clock;

sockaddr_in parse_address(const std::string& address) {
  const auto colon = address.rfind(':');
  PUSH_CHECK(colon != std::string::npos, kRpcOrigin, "bad member address '", address, "'");
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  const std::string host = address.substr(0, colon);
  PUSH_CHECK(::inet_pton(AF_INET, host.c_str(), &sa.sin_addr) == 1, kRpcOrigin, "bad member address '", address,
             "' (an IPv4 address is expected)");
  const std::string port = address.substr(colon + 1);
  char* end = nullptr;
  const long number = std::strtol(port.c_str(), &end, 10);
  PUSH_CHECK(!port.empty() && port.size() <= 5 && *end == '\0' && port[0] != '-' && number >= 0 && number <= 65535,
             kRpcOrigin, "bad member address '", address, "' (a port 0..65535 is expected)");
  sa.sin_port = htons(static_cast<uint16_t>(number));
  return sa;
}

std::string canonical_address(const std::string& address) {
  const sockaddr_in sa = parse_address(address);
  char text[INET_ADDRSTRLEN];
  ::inet_ntop(AF_INET, &sa.sin_addr, text, sizeof(text));
  return c10::str(text, ":", ntohs(sa.sin_port));
}

std::string advertised_host(const std::string& master_addr, int master_port, const std::string& interface) {
  if (interface.empty() && is_loopback(master_addr)) return "127.0.0.1";
  if (!interface.empty()) {
    ifaddrs* list = nullptr;
    PUSH_CHECK(::getifaddrs(&list) == 0, kRpcOrigin, "cannot list network interfaces: ", std::strerror(errno));
    std::string found;
    for (auto* a = list; a != nullptr; a = a->ifa_next) {
      if (a->ifa_addr == nullptr || a->ifa_addr->sa_family != AF_INET || interface != a->ifa_name) continue;
      char text[INET_ADDRSTRLEN];
      ::inet_ntop(AF_INET, &reinterpret_cast<sockaddr_in*>(a->ifa_addr)->sin_addr, text, sizeof(text));
      found = text;
      break;
    }
    ::freeifaddrs(list);
    PUSH_CHECK(!found.empty(), kRpcOrigin, "network interface '", interface, "' has no IPv4 address");
    return found;
  }
  // The address this host reaches the master from: a connected UDP socket sends nothing.
  addrinfo hints{};
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_DGRAM;
  addrinfo* res = nullptr;
  PUSH_CHECK(::getaddrinfo(master_addr.c_str(), std::to_string(master_port).c_str(), &hints, &res) == 0, kRpcOrigin,
             "cannot resolve the master address '", master_addr, "'");
  const int fd = ::socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  sockaddr_in local{};
  socklen_t len = sizeof(local);
  const bool ok = fd >= 0 && ::connect(fd, res->ai_addr, res->ai_addrlen) == 0 &&
                  ::getsockname(fd, reinterpret_cast<sockaddr*>(&local), &len) == 0;
  if (fd >= 0) ::close(fd);
  ::freeaddrinfo(res);
  PUSH_CHECK(ok, kRpcOrigin, "cannot find this host's address towards '", master_addr, "'");
  char text[INET_ADDRSTRLEN];
  ::inet_ntop(AF_INET, &local.sin_addr, text, sizeof(text));
  return text;
}

void set_member_socket_options(int fd, std::chrono::milliseconds send_timeout) {
  int one = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  timeval tv{};
  tv.tv_sec = static_cast<time_t>(send_timeout.count() / 1000);
  tv.tv_usec = static_cast<suseconds_t>((send_timeout.count() % 1000) * 1000);
  ::setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
}

int finish_connect(int fd, Clock::time_point deadline) {
  pollfd p{fd, POLLOUT, 0};
  int ready = 0;
  do {
    ready = ::poll(&p, 1, poll_timeout_ms(deadline, INT_MAX));
  } while (ready == 0 && Clock::now() < deadline);
  if (ready != 1) return ETIMEDOUT;
  int error = 0;
  socklen_t len = sizeof(error);
  ::getsockopt(fd, SOL_SOCKET, SO_ERROR, &error, &len);
  return error;
}

Received receive(int fd, char* into, std::size_t max, ssize_t& n, std::string& why) {
  for (;;) {
    n = ::recv(fd, into, max, MSG_DONTWAIT);
    if (n > 0) return Received::kBytes;
    if (n == 0) {
      why = "the peer closed the connection";
      return Received::kEnd;
    }
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) return Received::kNothingYet;
    why = std::strerror(errno);
    return Received::kEnd;
  }
}

int poll_timeout_ms(Clock::time_point deadline, int longest_ms) {
  const auto now = Clock::now();
  if (deadline <= now) return 0;
  int64_t longest = longest_ms;
  if (Clock::manual()) longest = std::min<int64_t>(longest, Clock::kManualTick.count());
  const int64_t left = std::chrono::ceil<std::chrono::milliseconds>(deadline - now).count();
  return static_cast<int>(std::min(left, longest));
}

}  // namespace push::dist::detail
