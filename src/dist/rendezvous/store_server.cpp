#include "dist/rendezvous/store_server.h"

#include <push/core/errors.h>

#include <fcntl.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <deque>
#include <iostream>

#include "dist/rendezvous/store_wire.h"
#include "dist/transport/frame_seal.h"

namespace push::dist::detail {

using Steady = std::chrono::steady_clock;
namespace hs = handshake;
namespace sw = store_wire;

struct StoreServer::Connection {
  enum Stage { kHello, kProof, kHead, kBody };
  int fd = -1;
  Stage stage = kHello;
  Steady::time_point opened;
  // The handshake: fixed-size frames into a fixed buffer.
  std::array<char, hs::kHelloBytes> frame{};
  std::size_t have = 0;
  hs::Bytes dialer_nonce{}, listener_nonce{};
  int peer = -1;
  // After it: sealed messages.
  std::unique_ptr<FrameSeal> in_seal, out_seal;
  std::string in;  // the head, then the body and its tag, as they arrive
  std::size_t need = 0;
  std::string out;  // sealed replies not yet written
  std::size_t written = 0;
  std::deque<std::string> pending;  // bodies opened and not yet served (behind a parked one)
  // A parked request: a get (the key) or a wait (every key) of keys not there yet.
  bool parked = false;
  bool parked_get = false;
  std::vector<std::string> parked_keys;
  Steady::time_point parked_until;

  bool proved() const { return stage == kHead || stage == kBody; }
};

static_assert(hs::kHelloBytes == hs::kProofBytes, "the hello and the proof share one buffer");

StoreServer::StoreServer(Options options) : options_(std::move(options)) {
  ::fcntl(options_.listen_fd, F_SETFL, ::fcntl(options_.listen_fd, F_GETFL) | O_NONBLOCK);
  stop_fd_ = ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (stop_fd_ < 0) {
    ::close(options_.listen_fd);
    throw Error(c10::str("[push::dist::World] cannot start the store server: eventfd: ", std::strerror(errno)));
  }
  thread_ = std::thread([this] { run(); });
}

StoreServer::~StoreServer() {
  const uint64_t one = 1;
  [[maybe_unused]] const ssize_t n = ::write(stop_fd_, &one, sizeof(one));
  thread_.join();
  for (auto& c : connections_) ::close(c->fd);
  ::close(options_.listen_fd);
  ::close(stop_fd_);
}

void StoreServer::run() {
  std::vector<pollfd> fds;
  for (;;) {
    try {
      if (!serve_once(fds)) return;
    } catch (const std::exception& e) {
      // Nothing a client sends gets here (each connection's failures close it); this is the
      // server's own trouble (out of memory). It goes on serving the others.
      std::cerr << "[push::dist::World] the store server: " << e.what() << "\n";
    }
  }
}

bool StoreServer::serve_once(std::vector<pollfd>& fds) {
  const auto now = Steady::now();
  // Handshakes past their time; parked requests past theirs; requests that queued behind one.
  std::erase_if(connections_, [&](const std::unique_ptr<Connection>& c) {
    if (c->proved() || now - c->opened < options_.handshake_timeout) return false;
    ::close(c->fd);
    return true;
  });
  answer_parked(now);
  for (auto& c : connections_) {
    if (!c->parked && !c->pending.empty()) {
      drain(*c);
      flush(*c);
    }
  }
  Steady::time_point next = now + std::chrono::seconds(1);
  for (const auto& c : connections_) {
    if (!c->proved()) next = std::min(next, c->opened + options_.handshake_timeout);
    if (c->parked) next = std::min(next, c->parked_until);
  }
  const bool accepting = now >= accept_paused_until_;
  if (!accepting) next = std::min(next, accept_paused_until_);
  fds.clear();
  fds.push_back({stop_fd_, POLLIN, 0});
  fds.push_back({options_.listen_fd, static_cast<short>(accepting ? POLLIN : 0), 0});
  for (const auto& c : connections_) {
    fds.push_back({c->fd, static_cast<short>(POLLIN | (c->written < c->out.size() ? POLLOUT : 0)), 0});
  }
  const auto wait = std::chrono::ceil<std::chrono::milliseconds>(std::max(next - now, Steady::duration::zero()));
  if (::poll(fds.data(), fds.size(), static_cast<int>(wait.count())) < 0) {
    if (errno == EINTR) return true;
    std::cerr << "[push::dist::World] the store server stops: poll: " << std::strerror(errno) << "\n";
    return false;
  }
  if (fds[0].revents != 0) return false;
  std::vector<Connection*> closing;
  for (std::size_t i = 2; i < fds.size(); ++i) {
    Connection& c = *connections_[i - 2];
    bool keep = true;
    try {
      if ((fds[i].revents & POLLOUT) != 0) keep = flush(c);
      if (keep && (fds[i].revents & (POLLIN | POLLHUP | POLLERR)) != 0) keep = on_readable(c);
    } catch (const std::exception&) {
      keep = false;  // out of memory for what it sent, or a cipher failure: that connection ends
    }
    if (!keep) closing.push_back(&c);
  }
  std::erase_if(connections_, [&](const std::unique_ptr<Connection>& c) {
    if (std::find(closing.begin(), closing.end(), c.get()) == closing.end()) return false;
    ::close(c->fd);
    return true;
  });
  if ((fds[1].revents & POLLIN) != 0) accept_all();
  return true;
}

bool StoreServer::evict_one_waiting() {
  // A random connection still in its handshake, among those that sent nothing yet if any
  // did not (a rank sends its hello as soon as it reads the banner): a flood of silent
  // connections then mostly evicts itself, and a rank's connection, picked with chance
  // 1/max_pending per newcomer, gets through on a retry.
  std::vector<std::size_t> silent, waiting;
  for (std::size_t i = 0; i < connections_.size(); ++i) {
    const Connection& c = *connections_[i];
    if (c.proved()) continue;
    waiting.push_back(i);
    if (c.stage == Connection::kHello && c.have == 0) silent.push_back(i);
  }
  const auto& pool = silent.empty() ? waiting : silent;
  if (pool.empty()) return false;
  const std::size_t victim = pool[static_cast<std::size_t>(random_()) % pool.size()];
  ::close(connections_[victim]->fd);
  connections_.erase(connections_.begin() + static_cast<std::ptrdiff_t>(victim));
  evicted_.fetch_add(1);
  return true;
}

void StoreServer::accept_all() {
  for (int i = 0; i < 64; ++i) {
    const int fd = ::accept4(options_.listen_fd, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) {
      if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM) {
        // Out of descriptors (or memory): make room by closing a stranger, and accept
        // nothing for 100 ms rather than wake at once on the same full backlog.
        evict_one_waiting();
        accept_paused_until_ = Steady::now() + std::chrono::milliseconds(100);
      }
      return;
    }
    const auto waiting = std::count_if(connections_.begin(), connections_.end(),
                                       [](const std::unique_ptr<Connection>& c) { return !c->proved(); });
    if (static_cast<std::size_t>(waiting) >= options_.max_pending) evict_one_waiting();
    auto c = std::make_unique<Connection>();
    c->fd = fd;
    c->opened = Steady::now();
    const auto banner = sw::banner(options_.job_id);
    c->out.assign(banner.begin(), banner.end());
    connections_.push_back(std::move(c));
    if (!flush(*connections_.back())) {
      ::close(fd);
      connections_.pop_back();
    }
  }
}

bool StoreServer::flush(Connection& c) {
  while (c.written < c.out.size()) {
    const ssize_t n = ::send(c.fd, c.out.data() + c.written, c.out.size() - c.written, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return true;
    if (n <= 0) return false;
    c.written += static_cast<std::size_t>(n);
  }
  c.out.clear();
  c.written = 0;
  return true;
}

bool StoreServer::on_readable(Connection& c) {
  for (;;) {
    if (!c.proved()) {
      const ssize_t n = ::recv(c.fd, c.frame.data() + c.have, c.frame.size() - c.have, MSG_DONTWAIT);
      if (n < 0 && errno == EINTR) continue;
      if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return true;
      if (n <= 0) {
        if (c.stage == Connection::kProof) refused_.fetch_add(1);
        return false;
      }
      c.have += static_cast<std::size_t>(n);
      if (c.have == c.frame.size() && !on_handshake(c)) return false;
      continue;
    }
    char chunk[65536];
    const std::size_t want = std::min(sizeof(chunk), c.need - c.in.size());
    const ssize_t n = ::recv(c.fd, chunk, want, MSG_DONTWAIT);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return true;
    if (n <= 0) return false;
    c.in.append(chunk, static_cast<std::size_t>(n));
    if (c.in.size() == c.need && !on_message(c)) return false;
  }
}

bool StoreServer::on_handshake(Connection& c) {
  c.have = 0;
  try {
    const wire::Header h = hs::check_header(c.frame.data(), c.stage == Connection::kHello, options_.world_size);
    if (c.stage == Connection::kHello) {
      c.peer = static_cast<int>(h.id);
      std::memcpy(c.dialer_nonce.data(), c.frame.data() + wire::kHeaderBytes, hs::kBytes);
      c.listener_nonce = hs::random_bytes();
      const auto challenge = hs::challenge_frame(
          0, c.listener_nonce,
          hs::proof(options_.key, "listener", c.dialer_nonce, c.listener_nonce, c.peer, 0, options_.address));
      c.out.append(challenge.data(), challenge.size());
      c.stage = Connection::kProof;
      return flush(c);
    }
    hs::Bytes theirs;
    std::memcpy(theirs.data(), c.frame.data() + wire::kHeaderBytes, hs::kBytes);
    if (!hs::same(theirs,
                  hs::proof(options_.key, "dialer", c.dialer_nonce, c.listener_nonce, c.peer, 0, options_.address))) {
      refused_.fetch_add(1);
      return false;
    }
  } catch (const Error&) {
    return false;  // not a handshake frame: not a client of this store
  }
  const auto keys = hs::session_keys(options_.key, c.dialer_nonce, c.listener_nonce, c.peer, 0, options_.address);
  const bool encrypt = hs::encrypts(options_.address);
  c.in_seal = std::make_unique<FrameSeal>(keys.dialer_to_listener, false, encrypt);
  c.out_seal = std::make_unique<FrameSeal>(keys.listener_to_dialer, true, encrypt);
  c.stage = Connection::kHead;
  c.need = sw::kHeadBytes;
  return true;
}

bool StoreServer::on_message(Connection& c) {
  if (c.stage == Connection::kHead) {
    const int64_t bytes = sw::open_head(*c.in_seal, c.in.data());
    if (bytes < 0) return false;  // a forged or changed head, or a body over kMaxBody
    c.stage = Connection::kBody;
    c.need = static_cast<std::size_t>(bytes) + kTagBytes;
    c.in.clear();
    return true;
  }
  const std::size_t bytes = c.need - kTagBytes;
  if (!sw::open_body(*c.in_seal, c.in.data(), bytes)) return false;
  c.in.resize(bytes);
  c.pending.push_back(std::move(c.in));
  c.in.clear();
  c.stage = Connection::kHead;
  c.need = sw::kHeadBytes;
  drain(c);
  return flush(c);
}

void StoreServer::drain(Connection& c) {
  while (!c.parked && !c.pending.empty()) {
    std::string body = std::move(c.pending.front());
    c.pending.pop_front();
    try {
      serve(c, body);
    } catch (const Error& e) {
      reply(c, sw::Writer(static_cast<uint8_t>(sw::Status::kError)).bytes(e.what()).take());
    } catch (const std::bad_alloc&) {
      reply(c, sw::Writer(static_cast<uint8_t>(sw::Status::kError))
                   .bytes("[push::dist::Store] the store is out of memory")
                   .take());
    }
  }
}

void StoreServer::serve(Connection& c, const std::string& body) {
  using sw::Op;
  sw::Request r = sw::decode_request(body);
  const auto ok = [] { return sw::Writer(static_cast<uint8_t>(sw::Status::kOk)); };
  std::string& key = r.keys.empty() ? r.value : r.keys.front();  // (the key of one-key requests)
  switch (r.op) {
    case Op::kSet:
      data_[std::move(key)] = std::move(r.value);
      reply(c, ok().take());
      answer_parked(Steady::now());
      break;
    case Op::kGet:
    case Op::kWait:
      c.parked = true;
      c.parked_get = r.op == Op::kGet;
      c.parked_keys = std::move(r.keys);
      // (The client bounds the timeout: store_wire.h's kMaxWaitMs.)
      c.parked_until = Steady::now() + std::chrono::milliseconds(std::clamp<int64_t>(r.number, 0, sw::kMaxWaitMs));
      answer_parked(Steady::now());
      break;
    case Op::kAdd: {
      int64_t value = 0;
      auto it = data_.find(key);
      if (it != data_.end()) {
        char* end = nullptr;
        errno = 0;
        value = std::strtoll(it->second.c_str(), &end, 10);
        PUSH_CHECK(!it->second.empty() && end == it->second.c_str() + it->second.size() && errno == 0,
                   "push::dist::Store::add", "the key '", key, "' holds a value that is not a number");
      }
      PUSH_CHECK(!__builtin_add_overflow(value, r.number, &value), "push::dist::Store::add", "adding ", r.number,
                 " to the key '", key, "' overflows a 64-bit count");
      data_[std::move(key)] = std::to_string(value);
      reply(c, ok().i64(value).take());
      answer_parked(Steady::now());
      break;
    }
    case Op::kCompareSet: {
      // c10d's semantics: a missing key is set only when the expected value is empty; the
      // reply is the value after the call (for a missing key left alone, the expected one).
      auto it = data_.find(key);
      if (it == data_.end()) {
        if (r.value.empty()) data_[key] = r.desired;
        reply(c, ok().bytes(r.value.empty() ? r.desired : r.value).take());
      } else {
        if (it->second == r.value) it->second = std::move(r.desired);
        reply(c, ok().bytes(it->second).take());
      }
      answer_parked(Steady::now());
      break;
    }
    case Op::kCheck: {
      const bool all = std::all_of(r.keys.begin(), r.keys.end(), [&](const std::string& k) { return data_.count(k); });
      reply(c, ok().u8(all ? 1 : 0).take());
      break;
    }
    case Op::kDelete:
      reply(c, ok().u8(data_.erase(key) > 0 ? 1 : 0).take());
      break;
    case Op::kNumKeys:
      reply(c, ok().i64(static_cast<int64_t>(data_.size())).take());
      break;
  }
}

void StoreServer::reply(Connection& c, const std::string& body) {
  const auto sealed = sw::seal_message(*c.out_seal, body);
  c.out.append(sealed.data(), sealed.size());
}

void StoreServer::answer_parked(Steady::time_point now) {
  for (auto& owner : connections_) {
    Connection& c = *owner;
    if (!c.parked) continue;
    const bool there = std::all_of(c.parked_keys.begin(), c.parked_keys.end(),
                                   [&](const std::string& k) { return data_.count(k) > 0; });
    if (!there && now < c.parked_until) continue;
    c.parked = false;
    if (!there) {
      reply(c, sw::Writer(static_cast<uint8_t>(sw::Status::kTimeout)).take());
    } else if (c.parked_get) {
      reply(c, sw::Writer(static_cast<uint8_t>(sw::Status::kOk)).bytes(data_[c.parked_keys.front()]).take());
    } else {
      reply(c, sw::Writer(static_cast<uint8_t>(sw::Status::kOk)).take());
    }
    c.parked_keys.clear();
    flush(c);  // (a failure shows at the next poll, which closes the connection)
  }
}

}  // namespace push::dist::detail
