#include "dist/rendezvous/job_store.h"

#include <push/core/errors.h>

#include <netdb.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <random>
#include <thread>

#include "dist/rendezvous/store_wire.h"
#include "dist/transport/frame_seal.h"

namespace push::dist::detail {
namespace {

using Steady = std::chrono::steady_clock;
namespace sw = store_wire;
constexpr const char* kStoreOrigin = "push::dist::Store";

int remaining_ms(Steady::time_point deadline) {
  const auto left = std::chrono::ceil<std::chrono::milliseconds>(deadline - Steady::now()).count();
  return static_cast<int>(std::clamp<int64_t>(left, 0, 1000));
}

/// A socket connected to `host`:`port`, or -1 when nothing listens there (yet); throws on
/// an address that does not resolve.
int try_connect(const std::string& host, int port, Steady::time_point deadline) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* list = nullptr;
  PUSH_CHECK(::getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &list) == 0, kStoreOrigin,
             "cannot resolve MASTER_ADDR '", host, "'");
  int fd = -1;
  for (auto* a = list; a != nullptr && fd < 0; a = a->ai_next) {
    fd = ::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, a->ai_protocol);
    if (fd < 0) continue;
    bool up = ::connect(fd, a->ai_addr, a->ai_addrlen) == 0;
    if (!up && errno == EINPROGRESS) {
      pollfd p{fd, POLLOUT, 0};
      while (!up && Steady::now() < deadline) {
        const int n = ::poll(&p, 1, remaining_ms(deadline));
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) continue;
        int error = 0;
        socklen_t len = sizeof(error);
        ::getsockopt(fd, SOL_SOCKET, SO_ERROR, &error, &len);
        if (error != 0) break;
        up = true;
      }
    }
    if (!up) {
      ::close(fd);
      fd = -1;
    }
  }
  ::freeaddrinfo(list);
  return fd;
}

}  // namespace

/// One connection to the store: its socket and the seals of both directions.
struct JobStore::Link {
  int fd = -1;
  std::unique_ptr<FrameSeal> out_seal, in_seal;
  ~Link() {
    if (fd >= 0) ::close(fd);
  }
  /// Whether `events` came on the socket before `deadline`.
  bool ready(short events, Steady::time_point deadline) const {
    for (;;) {
      pollfd p{fd, events, 0};
      const int n = ::poll(&p, 1, remaining_ms(deadline));
      if (n > 0) return true;
      if (n < 0 && errno != EINTR) return true;  // the read or write says what failed
      if (Steady::now() >= deadline) return false;
    }
  }
  /// Empty when every byte went; else why not.
  std::string write_all(const char* bytes, std::size_t size, Steady::time_point deadline) const {
    for (std::size_t done = 0; done < size;) {
      if (!ready(POLLOUT, deadline)) return "timeout";
      const ssize_t n = ::send(fd, bytes + done, size - done, MSG_NOSIGNAL | MSG_DONTWAIT);
      if (n < 0 && (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK)) continue;
      if (n <= 0) return std::strerror(errno);
      done += static_cast<std::size_t>(n);
    }
    return "";
  }
  std::string read_all(char* out, std::size_t size, Steady::time_point deadline) const {
    for (std::size_t done = 0; done < size;) {
      if (!ready(POLLIN, deadline)) return "timeout";
      const ssize_t n = ::recv(fd, out + done, size - done, MSG_DONTWAIT);
      if (n < 0 && (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK)) continue;
      if (n == 0) return "the store closed the connection";
      if (n < 0) return std::strerror(errno);
      done += static_cast<std::size_t>(n);
    }
    return "";
  }
};

handshake::Bytes JobStore::key_for(const handshake::Bytes& secret, const std::string& job_id) {
  return sw::store_key(secret, job_id);
}

std::string JobStore::where() const { return c10::str(options_.host, ":", options_.port); }

JobStore::JobStore(Options options, const handshake::Bytes& key, Steady::time_point deadline)
    : c10d::Store(options.timeout), options_(std::move(options)), key_(key) {
  connect(deadline, /*patient=*/true);
}

JobStore::~JobStore() = default;

namespace {

/// A pause of 10-40 ms before trying again: clients that a busy server closed do not all
/// come back at once.
void pause_before_retry() {
  thread_local std::minstd_rand random{std::random_device{}()};
  std::this_thread::sleep_for(std::chrono::milliseconds(10 + random() % 31));
}

/// Connects to a store that sends this job's banner; the socket, or -1 at the deadline
/// (`why` says what was found). Retries while nothing listens when `patient` (a rank
/// waiting for rank 0 to start), else only while the server closes connections before
/// their banner (making room). Throws when the banner is another job's.
int open_to_job(const JobStore::Options& o, Steady::time_point deadline, bool patient, std::string& why) {
  const auto banner = sw::banner(o.job_id);
  while (Steady::now() < deadline) {
    const int fd = try_connect(o.host, o.port, deadline);
    if (fd < 0) {
      why = "nothing listens there";
      if (!patient) return -1;
      pause_before_retry();
      continue;
    }
    char theirs[sw::kBannerBytes];
    pollfd p{fd, POLLIN, 0};
    std::size_t have = 0;
    while (have < sizeof(theirs) && Steady::now() < deadline) {
      if (::poll(&p, 1, remaining_ms(deadline)) <= 0) continue;
      const ssize_t n = ::recv(fd, theirs + have, sizeof(theirs) - have, MSG_DONTWAIT);
      if (n <= 0 && !(n < 0 && (errno == EINTR || errno == EAGAIN))) break;
      if (n > 0) have += static_cast<std::size_t>(n);
    }
    if (have == sizeof(theirs)) {
      if (std::memcmp(theirs, banner.data(), 8) != 0) {
        ::close(fd);
        throw Error(c10::str("[", kStoreOrigin, "] what listens at ", o.host, ":", o.port,
                             " (MASTER_ADDR:MASTER_PORT) is not a push store: another program uses MASTER_PORT"));
      }
      if (std::memcmp(theirs, banner.data(), banner.size()) != 0) {
        ::close(fd);
        throw Error(c10::str("[", kStoreOrigin, "] the store at ", o.host, ":", o.port, " serves another job than ",
                             o.job_id.empty() ? std::string("this one (no job id)") : "job '" + o.job_id + "'",
                             ": two jobs share MASTER_ADDR:MASTER_PORT. Give each job its own MASTER_PORT"));
      }
      return fd;
    }
    ::close(fd);
    // Closed before the banner: a server making room for newer connections; else silence.
    why = have == 0 && Steady::now() >= deadline
              ? "it did not answer: is rank 0 stopped, or another program listening on MASTER_PORT?"
              : "it closed the connection before its banner";
    pause_before_retry();
  }
  return -1;
}

}  // namespace

void JobStore::expect_this_job(const Options& options, Steady::time_point deadline) {
  std::string why = "no answer";
  const int fd = open_to_job(options, deadline, /*patient=*/true, why);
  PUSH_CHECK(fd >= 0, kStoreOrigin, "rank ", options.rank, " found no store at ", options.host, ":", options.port,
             " in time: ", why);
  ::close(fd);
}

void JobStore::connect(Steady::time_point deadline, bool patient) {
  std::string why = "no answer";
  for (;;) {
    const int fd = open_to_job(options_, deadline, patient, why);
    PUSH_CHECK(fd >= 0, kStoreOrigin, "rank ", options_.rank, " found no store at ", where(), " in time: ", why);
    auto link = std::make_unique<Link>();
    link->fd = fd;
    // The proofs bind MASTER_ADDR:MASTER_PORT as every rank was given it (not the socket's
    // address, which a NAT or a forwarded port changes on the way).
    const std::string server = where();
    try {
      const auto keys = handshake::dial(fd, key_, options_.rank, 0, server, deadline, "the store at " + where());
      const bool encrypt = handshake::encrypts(server);
      link->out_seal = std::make_unique<FrameSeal>(keys.dialer_to_listener, true, encrypt);
      link->in_seal = std::make_unique<FrameSeal>(keys.listener_to_dialer, false, encrypt);
    } catch (const Error& e) {
      const std::string text = e.what();
      if (text.find("could not prove") != std::string::npos) {
        throw WrongKey(c10::str("[", kStoreOrigin, "] the store at ", where(),
                                " could not prove it belongs to this job: ranks given different PUSH_JOB_SECRETs "
                                "(or PUSH_JOB_SECRET on one side only), or MASTER_ADDR spelled differently than "
                                "for rank 0, or another job's store on this port"));
      }
      // A server that closed this connection to make room for newer ones: try again.
      why = text;
      if (Steady::now() < deadline) {
        pause_before_retry();
        continue;
      }
      throw Error(
          c10::str("[", kStoreOrigin, "] rank ", options_.rank, " cannot join the store at ", where(), ": ", text));
    }
    link_ = std::move(link);
    return;
  }
}

c10::intrusive_ptr<c10d::Store> JobStore::clone() {
  return c10::make_intrusive<JobStore>(options_, key_, Steady::now() + options_.timeout);
}

std::string JobStore::call(const std::string& body, std::chrono::milliseconds io_timeout, const char* what) {
  const std::string origin = c10::str(kStoreOrigin, "::", what);
  PUSH_CHECK(body.size() <= sw::kMaxBody, origin, "a request of ", body.size(), " bytes is over the store's limit of ",
             sw::kMaxBody, " bytes");
  // One deadline from the call on, the wait for another thread's call on this connection included.
  const auto deadline = Steady::now() + io_timeout;
  // (A flag under a mutex and a condition variable, not std::timed_mutex: ThreadSanitizer
  // does not see pthread_mutex_clocklock take the lock.)
  {
    std::unique_lock<std::mutex> lock(mutex_);
    PUSH_CHECK(turn_free_.wait_until(lock, deadline, [&] { return !turn_taken_; }), origin,
               "another call on this connection to the store at ", where(), " did not end within ", io_timeout.count(),
               " ms: is rank 0 stopped?");
    turn_taken_ = true;
  }
  struct Turn {
    JobStore& store;
    ~Turn() {
      {
        std::lock_guard<std::mutex> lock(store.mutex_);
        store.turn_taken_ = false;
      }
      store.turn_free_.notify_one();
    }
  } turn{*this};
  if (!link_) connect(deadline, /*patient=*/false);  // dropped by an earlier call's failure
  Link& link = *link_;
  auto fail = [&](const std::string& why) {
    link_.reset();
    return Error(c10::str("[", origin, "] the store at ", where(), " (rank 0) ", why));
  };
  const auto sealed = sw::seal_message(*link.out_seal, body);
  std::string why = link.write_all(sealed.data(), sealed.size(), deadline);
  if (why == "timeout") throw fail(c10::str("took no request within ", io_timeout.count(), " ms: is rank 0 stopped?"));
  if (!why.empty()) throw fail("is gone: " + why);
  char head[sw::kHeadBytes];
  why = link.read_all(head, sizeof(head), deadline);
  if (why == "timeout") throw fail(c10::str("did not answer within ", io_timeout.count(), " ms: is rank 0 stopped?"));
  if (!why.empty()) throw fail("is gone: " + why);
  const int64_t bytes = sw::open_head(*link.in_seal, head);
  if (bytes < 0) throw fail("sent a reply that failed authentication (changed on the way)");
  std::string reply(static_cast<std::size_t>(bytes) + kTagBytes, '\0');
  why = link.read_all(reply.data(), reply.size(), deadline);
  if (why == "timeout") throw fail(c10::str("did not answer within ", io_timeout.count(), " ms: is rank 0 stopped?"));
  if (!why.empty()) throw fail("is gone: " + why);
  if (!sw::open_body(*link.in_seal, reply.data(), static_cast<std::size_t>(bytes))) {
    throw fail("sent a reply that failed authentication (changed on the way)");
  }
  reply.resize(static_cast<std::size_t>(bytes));
  PUSH_CHECK(!reply.empty(), origin, "the store at ", where(), " sent an empty reply");
  const auto status = static_cast<sw::Status>(reply[0]);
  if (status == sw::Status::kError) {
    sw::Reader in(std::string_view(reply).substr(1), "the store");
    throw Error(in.bytes(sw::kMaxBody));
  }
  if (status == sw::Status::kTimeout) {
    throw Timeout(c10::str("[", origin, "] timed out waiting for keys at the store at ", where()));
  }
  PUSH_CHECK(status == sw::Status::kOk, origin, "the store at ", where(), " sent an unknown status");
  return reply.substr(1);
}

namespace {

/// How long a call that waits `timeout` for keys may take before the store counts as gone.
std::chrono::milliseconds waiting_io(std::chrono::milliseconds timeout) {
  return timeout + std::max(std::chrono::milliseconds(2000), timeout / 10);
}

/// A request's body, in the one encoding the server decodes (store_wire.h).
std::string request(sw::Op op, std::vector<std::string> keys, std::string value = {}, std::string desired = {},
                    int64_t number = 0) {
  sw::Request r;
  r.op = op;
  r.keys = std::move(keys);
  r.value = std::move(value);
  r.desired = std::move(desired);
  r.number = number;
  return sw::encode_request(r);
}

std::string text(const std::vector<uint8_t>& v) { return std::string(v.begin(), v.end()); }
std::vector<uint8_t> bytes(const std::string& s) { return std::vector<uint8_t>(s.begin(), s.end()); }

}  // namespace

void JobStore::set(const std::string& key, const std::vector<uint8_t>& value) {
  sw::Reader(call(request(sw::Op::kSet, {key}, text(value)), bounded(timeout_), "set"), "the store").done();
}

std::vector<uint8_t> JobStore::compareSet(const std::string& key, const std::vector<uint8_t>& expected,
                                          const std::vector<uint8_t>& desired) {
  const std::string reply =
      call(request(sw::Op::kCompareSet, {key}, text(expected), text(desired)), bounded(timeout_), "compareSet");
  sw::Reader in(reply, "the store");
  return bytes(in.bytes(sw::kMaxBody));
}

std::vector<uint8_t> JobStore::get(const std::string& key) {
  const std::string reply =
      call(request(sw::Op::kGet, {key}, {}, {}, bounded(timeout_).count()), waiting_io(bounded(timeout_)), "get");
  sw::Reader in(reply, "the store");
  return bytes(in.bytes(sw::kMaxBody));
}

int64_t JobStore::add(const std::string& key, int64_t value) {
  const std::string reply = call(request(sw::Op::kAdd, {key}, {}, {}, value), bounded(timeout_), "add");
  return sw::Reader(reply, "the store").i64();
}

bool JobStore::deleteKey(const std::string& key) {
  const std::string reply = call(request(sw::Op::kDelete, {key}), bounded(timeout_), "deleteKey");
  return sw::Reader(reply, "the store").u8() != 0;
}

bool JobStore::check(const std::vector<std::string>& keys) {
  const std::string reply = call(request(sw::Op::kCheck, keys), bounded(timeout_), "check");
  return sw::Reader(reply, "the store").u8() != 0;
}

int64_t JobStore::getNumKeys() {
  return sw::Reader(call(request(sw::Op::kNumKeys, {}), bounded(timeout_), "getNumKeys"), "the store").i64();
}

void JobStore::wait(const std::vector<std::string>& keys) { wait(keys, bounded(timeout_)); }

std::chrono::milliseconds JobStore::bounded(std::chrono::milliseconds timeout) const {
  // c10d's kNoTimeout (0) waits without end: push waits the store's own timeout instead.
  if (timeout.count() <= 0) timeout = timeout_.count() > 0 ? timeout_ : options_.timeout;
  return std::min(timeout, std::chrono::milliseconds(sw::kMaxWaitMs));
}

void JobStore::wait(const std::vector<std::string>& keys, const std::chrono::milliseconds& asked) {
  const auto timeout = bounded(asked);
  const auto start = Steady::now();
  try {
    call(request(sw::Op::kWait, keys, {}, {}, timeout.count()), waiting_io(timeout), "wait");
  } catch (const Timeout&) {
    // A timeout never comes before `timeout` on this rank's clock (the server's may have
    // started the wait a little later, but rounds to whole milliseconds).
    std::this_thread::sleep_until(start + timeout);
    throw;
  }
}

}  // namespace push::dist::detail
