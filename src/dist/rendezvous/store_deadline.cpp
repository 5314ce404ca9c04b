#include "dist/rendezvous/store_deadline.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/stat.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <vector>

namespace push::dist::detail {
namespace {

using push::detail::Clock;

/// The address and port of `a` as IPv6 (an IPv4 address mapped); false for other families.
bool as_v6(const sockaddr* a, in6_addr& v6, int& port) {
  v6 = in6_addr{};
  if (a->sa_family == AF_INET) {
    const auto* p = reinterpret_cast<const sockaddr_in*>(a);
    v6.s6_addr[10] = v6.s6_addr[11] = 0xff;
    std::memcpy(&v6.s6_addr[12], &p->sin_addr, 4);
    port = ntohs(p->sin_port);
    return true;
  }
  if (a->sa_family == AF_INET6) {
    const auto* p = reinterpret_cast<const sockaddr_in6*>(a);
    v6 = p->sin6_addr;
    port = ntohs(p->sin6_port);
    return true;
  }
  return false;
}

/// The IPv4 and IPv6 addresses `host` resolves to, as IPv6 (IPv4 mapped).
std::vector<in6_addr> addresses_of(const std::string& host) {
  std::vector<in6_addr> out;
  addrinfo hints{};
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* list = nullptr;
  if (::getaddrinfo(host.c_str(), nullptr, &hints, &list) != 0) return out;
  for (auto* a = list; a != nullptr; a = a->ai_next) {
    in6_addr v6;
    int port = 0;
    if (as_v6(a->ai_addr, v6, port)) out.push_back(v6);
  }
  ::freeaddrinfo(list);
  return out;
}

}  // namespace

int shutdown_sockets_to(const std::string& host, int port) {
  const auto wanted = addresses_of(host);
  int count = 0;
  DIR* dir = ::opendir("/proc/self/fd");
  if (dir == nullptr) return 0;
  while (dirent* e = ::readdir(dir)) {
    char* end = nullptr;
    const long fd = std::strtol(e->d_name, &end, 10);
    if (end == e->d_name || *end != '\0' || fd == ::dirfd(dir)) continue;
    // getpeername fails on anything that is not a connected socket (no fstat: another
    // thread may be opening this very descriptor, and it need not be a socket).
    sockaddr_storage peer{};
    socklen_t len = sizeof(peer);
    if (::getpeername(static_cast<int>(fd), reinterpret_cast<sockaddr*>(&peer), &len) != 0) continue;
    in6_addr v6;
    int peer_port = -1;
    if (!as_v6(reinterpret_cast<const sockaddr*>(&peer), v6, peer_port) || peer_port != port) continue;
    for (const auto& w : wanted) {
      if (std::memcmp(&w, &v6, sizeof(v6)) == 0) {
        ::shutdown(static_cast<int>(fd), SHUT_RDWR);
        ++count;
        break;
      }
    }
  }
  ::closedir(dir);
  return count;
}

StoreDeadline::StoreDeadline(std::string host, int port, Clock::time_point deadline, std::function<bool()> give_up)
    : host_(std::move(host)), port_(port) {
  thread_ = std::thread([this, deadline, give_up = std::move(give_up)] { run(deadline, give_up); });
}

StoreDeadline::~StoreDeadline() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    done_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

bool StoreDeadline::fired() {
  std::lock_guard<std::mutex> lock(mutex_);
  return fired_;
}

void StoreDeadline::run(Clock::time_point deadline, const std::function<bool()>& give_up) {
  std::unique_lock<std::mutex> lock(mutex_);
  for (;;) {
    // With give_up, a look every 50 ms; without, one wait for the deadline.
    const auto next = give_up ? std::min(deadline, Clock::deadline_after(std::chrono::milliseconds(50))) : deadline;
    if (Clock::wait_until(cv_, lock, next, [this] { return done_; })) return;
    if (Clock::now() >= deadline || (give_up && give_up())) break;
  }
  // Only a connection that was open counts: without one, the store's own error (nobody
  // listening) is the one to report.
  fired_ = shutdown_sockets_to(host_, port_) > 0;
}

}  // namespace push::dist::detail
