#include <push/dist/free_port.h>

#include <push/core/errors.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

namespace push::dist {

int free_port(const std::string& address) {
  constexpr const char* origin = "push::dist::free_port";
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  PUSH_CHECK(::inet_pton(AF_INET, address.c_str(), &addr.sin_addr) == 1, origin, "'", address,
             "' is not an IPv4 address");
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  PUSH_CHECK(fd >= 0, origin, "cannot open a socket: ", std::strerror(errno));
  socklen_t len = sizeof(addr);
  if (::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 ||
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    const int err = errno;
    ::close(fd);
    throw Error(c10::str("[", origin, "] no free port on ", address, ": ", std::strerror(err)));
  }
  ::close(fd);
  return ntohs(addr.sin_port);
}

}  // namespace push::dist
