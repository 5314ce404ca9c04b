#include "dist/transport/transport.h"

#include "dist/transport/connection.h"

#include <push/core/errors.h>

#include <ATen/ATen.h>

#include <arpa/inet.h>
#include <fcntl.h>
#include <ifaddrs.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include "dist/transport/rpc_origin.h"

namespace push::dist::detail {
namespace {

void set_nodelay(int fd) {
  int one = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
}

void set_send_timeout(int fd, std::chrono::milliseconds timeout) {
  timeval tv{};
  tv.tv_sec = static_cast<time_t>(timeout.count() / 1000);
  tv.tv_usec = static_cast<suseconds_t>((timeout.count() % 1000) * 1000);
  ::setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
}

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

/// Waits until `deadline` for the non-blocking connect of `fd` to finish: its error (0 when
/// connected, ETIMEDOUT when the deadline passed first).
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

}  // namespace

Transport::Transport(TransportOptions options, TransportCallbacks callbacks)
    : options_(std::move(options)),
      callbacks_(std::move(callbacks)),
      pool_(std::make_shared<ReceivePool>(options_.receive_pool_bytes)) {
  outgoing_.resize(options_.size);
  addresses_.resize(options_.size);
  same_host_.assign(options_.size, 0);
  for (int i = 0; i < options_.size; ++i) dial_mutex_.push_back(std::make_unique<std::mutex>());
  last_heard_ = std::make_unique<std::atomic<int64_t>[]>(static_cast<std::size_t>(std::max(options_.size, 1)));
  for (int i = 0; i < options_.size; ++i) heard_from(i);
  epoll_fd_ = ::epoll_create1(EPOLL_CLOEXEC);
  wake_fd_ = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  PUSH_CHECK(epoll_fd_ >= 0 && wake_fd_ >= 0, kRpcOrigin, "cannot create an epoll instance: ", std::strerror(errno));
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.u64 = kWakeTag;
  ::epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, wake_fd_, &ev);
}

Transport::~Transport() {
  stop();
  if (epoll_fd_ >= 0) ::close(epoll_fd_);
  if (wake_fd_ >= 0) ::close(wake_fd_);
}

std::string Transport::describe(int peer) const {
  if (peer < 0 || peer >= static_cast<int>(options_.names.size())) return c10::str("an unknown peer");
  return c10::str(options_.names[peer], " (rank ", peer, " of the group)");
}

bool Transport::silent(int peer) const {
  if (options_.heartbeat_timeout.count() <= 0 || !last_heard_) return false;
  const Clock::time_point heard(
      Clock::duration(last_heard_[static_cast<std::size_t>(peer)].load(std::memory_order_relaxed)));
  return Clock::now() - heard > std::chrono::duration_cast<Clock::duration>(options_.heartbeat_timeout);
}

std::string Transport::listen(const std::string& host) {
  listen_fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  PUSH_CHECK(listen_fd_ >= 0, kRpcOrigin, "cannot open a socket: ", std::strerror(errno));
  int one = 1;
  ::setsockopt(listen_fd_, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  sockaddr_in sa = parse_address(host + ":0");
  PUSH_CHECK(::bind(listen_fd_, reinterpret_cast<sockaddr*>(&sa), sizeof(sa)) == 0, kRpcOrigin, "cannot listen on ",
             host, ": ", std::strerror(errno));
  PUSH_CHECK(::listen(listen_fd_, 128) == 0, kRpcOrigin, "cannot listen on ", host, ": ", std::strerror(errno));
  socklen_t len = sizeof(sa);
  ::getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&sa), &len);
  port_ = ntohs(sa.sin_port);
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.u64 = kListenTag;
  ::epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, listen_fd_, &ev);
  address_ = canonical_address(c10::str(host, ":", port_));
  return address_;
}

void Transport::start() {
  thread_ = std::thread([this] { loop(); });
}

void Transport::wake() {
  const uint64_t one = 1;
  [[maybe_unused]] auto n = ::write(wake_fd_, &one, sizeof(one));
}

void Transport::stop() {
  if (stopped_) return;
  stopped_ = true;
  stopping_ = true;
  wake();
  if (thread_.joinable()) thread_.join();
  std::vector<ConnectionPtr> left;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    left.swap(all_);
    for (auto& c : outgoing_) c.reset();
  }
  for (auto& c : left) close(c.get(), "the group shut down");
  closed_in_batch_.clear();
  if (listen_fd_ >= 0) ::close(listen_fd_);
  listen_fd_ = -1;
}

// -- dialing and sending ------------------------------------------------------------------

ConnectionPtr Transport::dial(int peer, const std::string& address, Clock::time_point deadline, bool retry) {
  const sockaddr_in sa = parse_address(address);
  const std::string listener = canonical_address(address);  // as the handshake proves it
  ConnectionPtr c;
  int error = 0;
  auto cannot = [&] {
    return Error(
        c10::str("[", kRpcOrigin, "] cannot connect to ", describe(peer), " at ", address, ": ", std::strerror(error)));
  };
  // A refused connection is tried again every 20 ms until the deadline: the peer may not
  // listen yet.
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
    set_nodelay(fd);
    set_send_timeout(fd, options_.send_timeout);
    handshake::SessionKeys keys;
    try {
      // At least a second for the handshake, however little of the dial's time is left.
      keys = handshake::dial(fd, options_.key, options_.rank, peer, listener,
                             std::max(deadline, Clock::deadline_after(std::chrono::seconds(1))), describe(peer));
    } catch (...) {
      ::close(fd);
      throw;
    }
    c = std::make_shared<Connection>(fd, /*outgoing=*/true, peer);
    c->seal_with(keys, handshake::encrypts(listener));
    heard_from(peer);
    watch(c);
    return true;
  });
  if (!connected) throw cannot();
  return c;
}

void Transport::connect(int peer, const std::string& address, const std::string& identity, Clock::time_point deadline) {
  auto c = dial(peer, address, deadline, /*retry=*/true);
  std::lock_guard<std::mutex> lock(mutex_);
  same_host_[peer] = options_.shared_memory && identity == host_identity() ? 1 : 0;
  addresses_[peer] = address;
  outgoing_[peer] = std::move(c);
}

void Transport::send(int peer, const wire::Header& header, const wire::Encoded& body) {
  ConnectionPtr c;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    c = outgoing_.at(peer);
  }
  if (!c) {
    // The connection was lost: dial once more (a dead peer refuses at once).
    std::lock_guard<std::mutex> dial_lock(*dial_mutex_.at(peer));
    std::string address;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      c = outgoing_[peer];
      address = addresses_[peer];
    }
    if (!c) {
      PUSH_CHECK(!stopping_, kRpcOrigin, "the group is shut down");
      c = dial(peer, address, Clock::deadline_after(options_.send_timeout), /*retry=*/false);
      {
        std::lock_guard<std::mutex> lock(mutex_);
        outgoing_[peer] = c;
      }
      if (callbacks_.peer_found) callbacks_.peer_found(peer);
    }
  }
  write_frame(*c, header, body);
}

void Transport::reply(const ConnectionPtr& to, const wire::Header& header, const wire::Encoded& body) {
  write_frame(*to, header, body);
}

// -- the I/O thread: heartbeats -------------------------------------------------------------

void Transport::heard_from(int peer) {
  last_heard_[static_cast<std::size_t>(peer)].store(Clock::now().time_since_epoch().count(), std::memory_order_relaxed);
}

void Transport::watch_heartbeats() {
  for (int i = 0; i < options_.size; ++i) heard_from(i);
  heartbeats_ = true;
  wake();
}

std::optional<Clock::time_point> Transport::keep_alive() {
  if (options_.heartbeat_timeout.count() <= 0 || !heartbeats_) return std::nullopt;
  const auto now = Clock::now();
  if (now < next_beat_) return next_beat_;
  next_beat_ = now + options_.heartbeat_timeout / 4;
  std::vector<ConnectionPtr> out;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    out = outgoing_;
  }
  {
    char head[wire::kHeaderBytes];
    wire::Header h;
    h.type = wire::kHeartbeat;
    wire::write_header(h, head);
    for (auto& c : out) {
      if (!c) continue;
      // A sender holding the connection is writing to the peer already; never wait for it.
      std::unique_lock<std::mutex> lock(c->send_mutex, std::try_to_lock);
      if (!lock.owns_lock() || c->closed || c->writing) continue;
      // This round's heartbeat, or what is left of the last one: what the socket does not
      // take now stays owed, and the next sender writes it first, so that the stream (and
      // the count of sealed segments) stays whole.
      if (c->owed.empty()) c->owed = seal_head(*c->send_seal, head, sizeof(head), {});
      const ssize_t n = ::send(c->fd, c->owed.data(), c->owed.size(), MSG_DONTWAIT | MSG_NOSIGNAL);
      if (n > 0) c->owed.erase(c->owed.begin(), c->owed.begin() + n);
    }
  }
  for (auto& c : out) {
    if (!c || !silent(c->peer)) continue;
    const std::string why = c10::str("nothing heard from it for ", options_.heartbeat_timeout.count(),
                                     " ms (heartbeat_timeout): it is stopped, hung or cut off");
    // Its own connections too: a reply blocked on one (the peer stopped reading) fails now,
    // and frees the handler loop it holds.
    std::vector<ConnectionPtr> incoming;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      for (const auto& in : all_) {
        if (!in->outgoing && in->introduced && in->peer == c->peer) incoming.push_back(in);
      }
    }
    for (auto& in : incoming) close(in.get(), why);
    close(c.get(), why);
  }
  return next_beat_;
}

// -- the I/O thread: accepting (reading is in transport_read.cpp) ---------------------------

void Transport::accept_all() {
  for (;;) {
    const int fd = ::accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
    if (fd < 0) {
      if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR || errno == ECONNABORTED) return;
      // Out of file descriptors (or buffers): the listening socket stays ready, so epoll
      // would wake this thread again at once. Close the oldest unproved connection and try
      // again; when there is none, stop accepting for a while.
      const int error = errno;
      if ((error == EMFILE || error == ENFILE) && evict_oldest_handshake("out of file descriptors")) continue;
      accept_paused_until_ = Clock::deadline_after(std::chrono::milliseconds(100));
      epoll_event ev{};
      ev.data.u64 = kListenTag;
      ::epoll_ctl(epoll_fd_, EPOLL_CTL_MOD, listen_fd_, &ev);
      if (!accept_pause_reported_) {
        accept_pause_reported_ = true;
        std::cerr << "[push::dist::RpcGroup] " << options_.names.at(options_.rank) << ": cannot accept connections ("
                  << std::strerror(error) << "): pausing 100 ms at a time\n";
      }
      return;
    }
    set_nodelay(fd);
    set_send_timeout(fd, options_.send_timeout);
    auto c = std::make_shared<Connection>(fd, /*outgoing=*/false, -1);
    c->handshake_deadline = Clock::deadline_after(options_.handshake_timeout);
    while (pending_.size() >= options_.max_pending &&
           evict_oldest_handshake("too many connections in their handshake")) {
    }
    pending_.push_back(c);
    watch(c);
  }
}

void Transport::forget_pending(Connection* c) {
  auto it = std::find_if(pending_.begin(), pending_.end(), [&](const ConnectionPtr& p) { return p.get() == c; });
  if (it != pending_.end()) pending_.erase(it);
}

bool Transport::evict_oldest_handshake(const char* why) {
  if (pending_.empty()) return false;
  ConnectionPtr c = pending_.front();  // close() takes it out of pending_
  close(c.get(), why);
  return true;
}

std::optional<Clock::time_point> Transport::expire_handshakes() {
  const auto now = Clock::now();
  std::optional<Clock::time_point> next;
  if (accept_paused_until_) {
    if (now >= *accept_paused_until_) {
      accept_paused_until_.reset();
      epoll_event ev{};
      ev.events = EPOLLIN;
      ev.data.u64 = kListenTag;
      ::epoll_ctl(epoll_fd_, EPOLL_CTL_MOD, listen_fd_, &ev);
    } else {
      next = accept_paused_until_;
    }
  }
  // Deadlines grow with accept order: the expired ones are at the front.
  while (!pending_.empty()) {
    ConnectionPtr c = pending_.front();
    if (c->handshake_deadline > now) {
      if (!next || c->handshake_deadline < *next) next = c->handshake_deadline;
      break;
    }
    close(c.get(), "no handshake within the handshake timeout");  // takes it out of pending_
  }
  return next;
}

void Transport::watch(const ConnectionPtr& c) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    all_.push_back(c);
  }
  epoll_event ev{};
  ev.events = EPOLLIN | EPOLLRDHUP;
  ev.data.ptr = c.get();
  ::epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, c->fd, &ev);
}

void Transport::close(Connection* c, const std::string& why) {
  // Alive until the I/O thread's current batch of events ends (closed_in_batch_).
  closed_in_batch_.push_back(c->shared_from_this());
  bool lost = false;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = std::find_if(all_.begin(), all_.end(), [&](const ConnectionPtr& p) { return p.get() == c; });
    if (it != all_.end()) all_.erase(it);
    if (c->outgoing && c->peer >= 0 && outgoing_[c->peer].get() == c) {
      outgoing_[c->peer].reset();
      lost = true;
    }
  }
  if (!c->outgoing && !c->introduced) forget_pending(c);
  c->gone = true;
  ::epoll_ctl(epoll_fd_, EPOLL_CTL_DEL, c->fd, nullptr);
  ::shutdown(c->fd, SHUT_RDWR);  // unblocks a sender
  c->broken = true;              // and one waiting for its ring
  if (SendRing* ring = c->ring_to_wake.load()) ring->interrupt();
  std::vector<Promise<bool>> wake;  // senders waiting for the turn or for the socket
  {
    std::lock_guard<std::mutex> lock(c->send_mutex);
    if (!c->closed) {
      c->closed = true;
      // A sender writing now still uses the descriptor: it closes it when it is done.
      if (!c->writing) {
        ::close(c->fd);
        c->fd_closed = true;
      }
    }
    wake.swap(c->turn_waiters);
    if (c->writable) wake.push_back(*c->writable);
    c->writable.reset();
  }
  c->turn_free.notify_all();
  for (auto& w : wake) w.set_value(true);
  if (stopping_) return;
  if (!c->outgoing && c->introduced == false) {
    // Said for the first few and then every 1000th: a flood of strangers must not become a
    // flood of lines.
    ++strangers_dropped_;
    if (strangers_dropped_ <= 3 || strangers_dropped_ % 1000 == 0) {
      std::cerr << "[push::dist::RpcGroup] " << options_.names.at(options_.rank)
                << ": dropped a connection that did not prove it is a member of the group (" << strangers_dropped_
                << " so far): " << why << "\n";
    }
  } else if (!c->outgoing && why != "the peer closed the connection") {
    std::cerr << "[push::dist::RpcGroup] " << options_.names.at(options_.rank) << ": closed the connection from "
              << describe(c->peer) << ": " << why << "\n";
  }
  if (lost) callbacks_.peer_lost(c->peer, why);
}

// -- addresses ----------------------------------------------------------------------------

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

}  // namespace push::dist::detail
