// Rewriting the store, which has no authentication: a member takes no address from it that
// lacks the job's seal, and one that dials a relay (an old sealed address that someone now
// listens on and forwards) finds out in the handshake, before any call goes through. And
// rank 0, which hosts the store, stopped: the others fail within the heartbeat timeout
// and a few seconds, naming it (docs/distributed.md, "Who gets in", "Timeouts").
#include "dist_test_util.h"

#include <test_util.h>

#include "dist/transport/handshake.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <future>
#include <thread>

using namespace std::chrono_literals;
using push::dist::World;
using push::dist::WorldOptions;

namespace {

WorldOptions relay_rank(int port, int rank, const std::string& secret) {
  return WorldOptions().master_port(port).rank(rank).world_size(2).job_secret(secret).init_timeout(8s).shutdown_timeout(
      2s);
}

std::string relay_text(const std::vector<uint8_t>& bytes) { return std::string(bytes.begin(), bytes.end()); }
std::vector<uint8_t> relay_bytes(const std::string& s) { return std::vector<uint8_t>(s.begin(), s.end()); }

/// The value of `key` once some rank has put it in the store.
std::string relay_await(push::dist::Store& store, const std::string& key) {
  store.wait({key}, 20s);
  return relay_text(store.get(key));
}

/// Listens on 127.0.0.1:`port` and forwards one connection to 127.0.0.1:`target` both ways,
/// counting what the dialer sent, until either side closes.
class Relay {
 public:
  Relay(int port, int target) {
    listener_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    int one = 1;
    ::setsockopt(listener_, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    const sockaddr_in at = address(port);
    bound_ = ::bind(listener_, reinterpret_cast<const sockaddr*>(&at), sizeof(at)) == 0 && ::listen(listener_, 4) == 0;
    thread_ = std::thread([this, target] { run(target); });
  }
  ~Relay() {
    stop_ = true;
    thread_.join();
    ::close(listener_);
  }
  bool bound() const { return bound_; }
  bool relayed() const { return relayed_; }
  std::size_t from_dialer() const { return from_dialer_; }

 private:
  static sockaddr_in address(int port) {
    sockaddr_in sa{};
    sa.sin_family = AF_INET;
    sa.sin_port = htons(static_cast<uint16_t>(port));
    ::inet_pton(AF_INET, "127.0.0.1", &sa.sin_addr);
    return sa;
  }

  void run(int target) {
    pollfd p{listener_, POLLIN, 0};
    while (!stop_ && ::poll(&p, 1, 50) == 0) {
    }
    if (stop_ || !bound_) return;
    const int in = ::accept(listener_, nullptr, nullptr);
    const int out = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    const sockaddr_in to = address(target);
    relayed_ = in >= 0 && ::connect(out, reinterpret_cast<const sockaddr*>(&to), sizeof(to)) == 0;
    char buffer[65536];
    for (bool open = relayed_; open && !stop_;) {
      pollfd both[2] = {{in, POLLIN, 0}, {out, POLLIN, 0}};
      if (::poll(both, 2, 50) <= 0) continue;
      for (int side = 0; side < 2 && open; ++side) {
        if (both[side].revents == 0) continue;
        const ssize_t n = ::recv(both[side].fd, buffer, sizeof(buffer), 0);
        open = n > 0 && ::send(both[1 - side].fd, buffer, static_cast<size_t>(n), MSG_NOSIGNAL) == n;
        if (n > 0 && side == 0) from_dialer_ += static_cast<std::size_t>(n);
      }
    }
    if (in >= 0) ::close(in);
    ::close(out);
  }

  int listener_ = -1;
  bool bound_ = false;
  std::atomic<bool> stop_{false}, relayed_{false};
  std::atomic<std::size_t> from_dialer_{0};
  std::thread thread_;
};

}  // namespace

TEST(RpcTrust, AnAddressRewrittenInTheStoreIsNotUsed) {
  const std::string secret = push::dist::new_job_secret();
  const int port = push::dist::free_port();
  auto r1 = std::async(std::launch::async, [&] { return World(relay_rank(port, 1, secret)); });
  World w0(relay_rank(port, 0, secret));
  World w1 = r1.get();
  auto g1 = std::async(std::launch::async, [&] { return w1.rpc_group("g", {"worker0", "worker1"}); });
  auto store = w0.store();  // any local user's client of the store: it has no authentication
  relay_await(store, "push/rpc/g#0/addr/1");
  store.set("push/rpc/g#0/addr/1", relay_bytes("127.0.0.1:1 attacker"));
  EXPECT_PUSH_ERROR(w0.rpc_group("g", {"worker0", "worker1"}), "does not carry this job's seal");
  EXPECT_PUSH_ERROR(g1.get(), "");  // rank 0 never met it: it gives up at init_timeout
}

TEST(RpcTrust, AnOldSealedAddressWithARelayBehindItGetsNoCallThrough) {
  // Two jobs, one after the other, with one PUSH_JOB_SECRET: the first one's sealed
  // address of worker1 is right under the key, so only the handshake can tell.
  const std::string secret = push::dist::new_job_secret();
  std::string recorded;
  {
    const int port = push::dist::free_port();
    auto r1 = std::async(std::launch::async, [&] { return World(relay_rank(port, 1, secret)); });
    World w0(relay_rank(port, 0, secret));
    World w1 = r1.get();
    auto g1 = std::async(std::launch::async, [&] { return w1.rpc_group("g", {"worker0", "worker1"}); });
    auto g0 = w0.rpc_group("g", {"worker0", "worker1"});
    auto group1 = g1.get();
    auto store = w0.store();
    recorded = relay_text(store.get("push/rpc/g#0/addr/1"));
    auto s1 = std::async(std::launch::async, [&] { group1.shutdown(); });
    g0.shutdown();
    s1.get();
  }
  const int port = push::dist::free_port();
  auto r1 = std::async(std::launch::async, [&] { return World(relay_rank(port, 1, secret)); });
  World w0(relay_rank(port, 0, secret));
  World w1 = r1.get();
  auto g1 = std::async(std::launch::async, [&] { return w1.rpc_group("g", {"worker0", "worker1"}); });
  auto store = w0.store();
  const std::string real = relay_await(store, "push/rpc/g#0/addr/1");
  auto port_of = [](const std::string& value) { return std::stoi(value.substr(value.find(':') + 1)); };
  Relay relay(port_of(recorded), port_of(real));
  ASSERT_TRUE(relay.bound()) << "the old address is taken again: " << recorded;
  store.set("push/rpc/g#0/addr/1", relay_bytes(recorded));
  EXPECT_PUSH_ERROR(w0.rpc_group("g", {"worker0", "worker1"}), "could not prove it belongs to this job");
  EXPECT_TRUE(relay.relayed());
  // The dialer sent its hello and hung up at the relayed challenge: no proof, no call.
  EXPECT_EQ(relay.from_dialer(), push::dist::detail::handshake::kHelloBytes);
  EXPECT_PUSH_ERROR(g1.get(), "");
}

// Rank 0 hosts the store. Stopped (SIGSTOP) once the job runs, it answers nothing: the
// other rank's shutdown fails within the heartbeat timeout and a few seconds, naming it,
// and leaving the World does not wait for it either.
PUSH_DIST_WORKER(stopped_store_host) {
  const std::chrono::milliseconds beat = push::testing::sanitized() ? 4s : 1s;
  auto world = World(WorldOptions::from_env().timeout(5s).shutdown_timeout(3s));
  auto rpc = world.rpc_group("host", world.names(), push::dist::RpcGroupOptions().heartbeat_timeout(beat).timeout(60s));
  // The pid goes through the store before the barrier: once rank 0 stops, so does the store.
  if (world.rank() == 0) world.store().set("test/pid", relay_bytes(std::to_string(::getpid())));
  const pid_t pid = std::stoi(relay_text(world.store().get("test/pid")));
  rpc.barrier(30s);
  if (world.rank() == 0) {
    // Rank 1 stops this process here, then kills it.
    world.store().wait({"test/never"}, 60s);
    return;
  }
  // Stopped by rank 1 once every store call of rank 1 has its answer: rank 0 stopping itself
  // could stop its store between taking a call of rank 1 and answering it, and that call
  // would wait the store's own timeout (init_timeout), not the heartbeat's.
  ::kill(pid, SIGSTOP);
  ASSERT_TRUE(push::testing::eventually([&] { return push::testing::is_stopped(pid); }, 10s));
  const auto start = std::chrono::steady_clock::now();
  {
    World leaving = std::move(world);
    EXPECT_PUSH_ERROR(rpc.shutdown(), "which hosts the job's store, is stopped or cut off");
  }
  EXPECT_LT(std::chrono::steady_clock::now() - start, beat + 10s);
  ::kill(pid, SIGKILL);
}

TEST(DistFailure, AStoppedRankZeroFailsTheOthersWithinTheHeartbeatTimeout) {
  const auto codes = push::testing::run_workers(2, "stopped_store_host", 90s);
  EXPECT_EQ(codes[0], 128 + SIGKILL);
  EXPECT_EQ(codes[1], 0);
}
