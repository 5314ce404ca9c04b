// push_netbed_switch: the test bed's switch in user space, for what the kernel here cannot do
// (no netem): one-way delay, jitter and loss per host link, a link that stalls, one that is
// down. (Rates are the kernel's: NetBed::rate puts tbf on both ends of a link, and this
// switch's sends go through it.)
// It runs in the bed's switch namespace and forwards Ethernet frames between the host ports
// (AF_PACKET sockets; a learning switch: known MACs to their port, others to all), each
// frame crossing the sender's link up and the receiver's link down:
//   leaves the host at t (received here), arrives after the sender's link delay (+ uniform
//   jitter, order kept), is delivered after the receiver's. A frame is dropped with each
//   link's loss probability, or when more than kQueueBytes wait on a link, or are held by
//   a stalled one (tail drop).
// Frames keep their virtio-net header (PACKET_VNET_HDR): the kernel's large segments pass
// through whole and are cut (and checksummed) by the receiving host's stack.
//
//   push_netbed_switch SETTINGS
// SETTINGS: one line per port, `PORT DELAY_MS JITTER_MS LOSS STALLED DOWN` (STALLED 1: the
// link holds every frame, both ways, until it is 0 again; DOWN 1: it drops every frame).
// Read at start and again on SIGHUP; SIGTERM ends the switch.
#include <arpa/inet.h>
#include <linux/if_packet.h>
#include <net/ethernet.h>
#include <net/if.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <deque>
#include <fstream>
#include <map>
#include <queue>
#include <random>
#include <sstream>
#include <string>
#include <vector>

namespace {

using Clock = std::chrono::steady_clock;
using Seconds = std::chrono::duration<double>;
constexpr size_t kQueueBytes = 4 << 20;   // per link direction
constexpr size_t kFrameBytes = 70 << 10;  // a 64 KiB segment, its headers and the vnet header
// sizeof(struct virtio_net_hdr): <linux/virtio_net.h> does not compile as C++ (a member
// named `class`).
constexpr size_t kVnetHeader = 10;

volatile sig_atomic_t g_reload = 0, g_stop = 0;
void on_hup(int) { g_reload = 1; }
void on_term(int) { g_stop = 1; }

struct Link {
  double delay_s = 0, jitter_s = 0, loss = 0;
  bool stalled = false, down = false;
};

/// One direction of a link: the latest delivery time (frames keep their order), and the
/// bytes waiting.
struct Direction {
  Clock::time_point last{};
  size_t queued = 0;
};

struct Port {
  std::string name;
  int fd = -1;
  int index = 0;  // ifindex
  Link link;
  Direction up, down;                                         // host -> switch, switch -> host
  std::deque<std::vector<uint8_t>> stalled_up, stalled_down;  // frames held while the link stalls
  size_t stalled_bytes = 0;  // both ways; past kQueueBytes a stalled link drops (tail drop)
};

struct Pending {
  Clock::time_point at;
  uint64_t seq;
  int from, to;  // ports; `to` < 0: still crossing the sender's link up
  std::vector<uint8_t> frame;
  bool operator>(const Pending& o) const { return at != o.at ? at > o.at : seq > o.seq; }
};

std::vector<Port> g_ports;
std::map<std::array<uint8_t, 6>, int> g_macs;  // learned: MAC -> port
std::priority_queue<Pending, std::vector<Pending>, std::greater<>> g_queue;
std::mt19937_64 g_random(12345);
uint64_t g_seq = 0;

bool read_settings(const char* path) {
  std::ifstream in(path);
  if (!in) return false;
  for (std::string line; std::getline(in, line);) {
    std::istringstream row(line);
    std::string name;
    double delay_ms = 0, jitter_ms = 0, loss = 0;
    int stalled = 0, down = 0;
    if (!(row >> name >> delay_ms >> jitter_ms >> loss >> stalled >> down)) continue;
    auto it = std::find_if(g_ports.begin(), g_ports.end(), [&](const Port& p) { return p.name == name; });
    if (it == g_ports.end()) {
      g_ports.push_back(Port{});
      it = std::prev(g_ports.end());
      it->name = name;
    }
    it->link = Link{delay_ms / 1e3, jitter_ms / 1e3, loss, stalled != 0, down != 0};
  }
  return true;
}

int open_port(const std::string& name, int* index) {
  const int fd = ::socket(AF_PACKET, SOCK_RAW | SOCK_NONBLOCK | SOCK_CLOEXEC, htons(ETH_P_ALL));
  if (fd < 0) return -1;
  const int one = 1;
  ::setsockopt(fd, SOL_PACKET, PACKET_VNET_HDR, &one, sizeof(one));
  const int buffer = 8 << 20;
  ::setsockopt(fd, SOL_SOCKET, SO_RCVBUFFORCE, &buffer, sizeof(buffer));
  ::setsockopt(fd, SOL_SOCKET, SO_SNDBUFFORCE, &buffer, sizeof(buffer));
  *index = static_cast<int>(::if_nametoindex(name.c_str()));
  sockaddr_ll at{};
  at.sll_family = AF_PACKET;
  at.sll_protocol = htons(ETH_P_ALL);
  at.sll_ifindex = *index;
  if (*index == 0 || ::bind(fd, reinterpret_cast<sockaddr*>(&at), sizeof(at)) != 0) {
    ::close(fd);
    return -1;
  }
  packet_mreq promisc{};
  promisc.mr_ifindex = *index;
  promisc.mr_type = PACKET_MR_PROMISC;
  ::setsockopt(fd, SOL_PACKET, PACKET_ADD_MEMBERSHIP, &promisc, sizeof(promisc));
  return fd;
}

/// When a frame of `bytes` entering `d` at `now` is delivered across `link`; false: dropped.
bool cross(const Link& link, Direction& d, Clock::time_point now, size_t bytes, Clock::time_point* at) {
  if (link.down) return false;
  if (link.loss > 0 && std::uniform_real_distribution<double>(0, 1)(g_random) < link.loss) return false;
  if (d.queued + bytes > kQueueBytes) return false;
  const double jitter = link.jitter_s > 0 ? std::uniform_real_distribution<double>(0, link.jitter_s)(g_random) : 0.0;
  *at = std::max(d.last, std::chrono::time_point_cast<Clock::duration>(now + Seconds(link.delay_s + jitter)));
  d.last = *at;
  d.queued += bytes;
  return true;
}

/// The payload's Ethernet header starts after the virtio-net header.
const uint8_t* ethernet(const std::vector<uint8_t>& frame) { return frame.data() + kVnetHeader; }

void schedule(int from, int to, std::vector<uint8_t> frame, Clock::time_point at) {
  g_queue.push(Pending{at, g_seq++, from, to, std::move(frame)});
}

/// A frame that crossed `from`'s link up: on to its port (or every other), down their links.
void switch_frame(int from, std::vector<uint8_t> frame, Clock::time_point now) {
  std::array<uint8_t, 6> dst{}, src{};
  std::memcpy(dst.data(), ethernet(frame), 6);
  std::memcpy(src.data(), ethernet(frame) + 6, 6);
  g_macs[src] = from;
  const auto known = g_macs.find(dst);
  for (int to = 0; to < static_cast<int>(g_ports.size()); ++to) {
    if (to == from || (known != g_macs.end() && known->second != to)) continue;
    auto& port = g_ports[static_cast<size_t>(to)];
    if (port.link.stalled) {
      if (port.stalled_bytes + frame.size() <= kQueueBytes) {
        port.stalled_bytes += frame.size();
        port.stalled_down.push_back(frame);
      }
      continue;
    }
    Clock::time_point at;
    if (cross(port.link, port.down, now, frame.size(), &at)) schedule(from, to, frame, at);
  }
}

void receive(int p, Clock::time_point now) {
  auto& port = g_ports[static_cast<size_t>(p)];
  for (int burst = 0; burst < 64; ++burst) {
    std::vector<uint8_t> frame(kFrameBytes);
    sockaddr_ll from{};
    socklen_t len = sizeof(from);
    const ssize_t got = ::recvfrom(port.fd, frame.data(), frame.size(), 0, reinterpret_cast<sockaddr*>(&from), &len);
    if (got <= 0) return;
    if (from.sll_pkttype == PACKET_OUTGOING) continue;  // our own sends to this port
    if (static_cast<size_t>(got) < kVnetHeader + 14) continue;
    frame.resize(static_cast<size_t>(got));
    if (port.link.stalled) {
      if (port.stalled_bytes + frame.size() <= kQueueBytes) {
        port.stalled_bytes += frame.size();
        port.stalled_up.push_back(std::move(frame));
      }
      continue;
    }
    Clock::time_point at;
    if (cross(port.link, port.up, now, frame.size(), &at)) schedule(p, -1, std::move(frame), at);
  }
}

void deliver(Pending& e) {
  if (e.to < 0) {  // crossed the sender's link up: switch it
    g_ports[static_cast<size_t>(e.from)].up.queued -= e.frame.size();
    switch_frame(e.from, std::move(e.frame), e.at);
    return;
  }
  auto& port = g_ports[static_cast<size_t>(e.to)];
  port.down.queued -= e.frame.size();
  ::send(port.fd, e.frame.data(), e.frame.size(), MSG_DONTWAIT);  // a full socket drops it, as a wire would
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2 || !read_settings(argv[1])) {
    std::fprintf(stderr, "usage: push_netbed_switch SETTINGS (lines: PORT DELAY_MS JITTER_MS LOSS STALLED DOWN)\n");
    return 2;
  }
  ::prctl(PR_SET_TIMERSLACK, 1UL);  // wake when asked: the default 50 us slack shows on a 0.1 ms link
  struct sigaction action {};
  action.sa_handler = on_hup;  // no SA_RESTART: a reload interrupts the wait
  ::sigaction(SIGHUP, &action, nullptr);
  action.sa_handler = on_term;
  ::sigaction(SIGTERM, &action, nullptr);
  for (auto& port : g_ports) {
    port.fd = open_port(port.name, &port.index);
    if (port.fd < 0) {
      std::fprintf(stderr, "push_netbed_switch: cannot open port %s: %s\n", port.name.c_str(), std::strerror(errno));
      return 1;
    }
  }
  std::printf("ready\n");
  std::fflush(stdout);
  std::vector<pollfd> fds;
  for (const auto& port : g_ports) fds.push_back({port.fd, POLLIN, 0});
  while (!g_stop) {
    if (g_reload) {
      g_reload = 0;
      const size_t known = g_ports.size();
      read_settings(argv[1]);
      g_ports.resize(known);  // ports are fixed at start
      for (int p = 0; p < static_cast<int>(g_ports.size()); ++p) {
        auto& port = g_ports[static_cast<size_t>(p)];
        const auto now = Clock::now();
        if (!port.link.stalled) port.stalled_bytes = 0;  // a stall ended: all that it held goes on
        for (; !port.link.stalled && !port.stalled_up.empty(); port.stalled_up.pop_front()) {
          Clock::time_point at;
          if (cross(port.link, port.up, now, port.stalled_up.front().size(), &at)) {
            schedule(p, -1, std::move(port.stalled_up.front()), at);
          }
        }
        for (; !port.link.stalled && !port.stalled_down.empty(); port.stalled_down.pop_front()) {
          Clock::time_point at;
          if (cross(port.link, port.down, now, port.stalled_down.front().size(), &at)) {
            schedule(-1, p, std::move(port.stalled_down.front()), at);
          }
        }
      }
    }
    auto now = Clock::now();
    while (!g_queue.empty() && g_queue.top().at <= now) {
      Pending e = std::move(const_cast<Pending&>(g_queue.top()));
      g_queue.pop();
      deliver(e);
    }
    // Until the next delivery, to the nanosecond (poll's milliseconds would add up to 1 ms
    // to a 0.1 ms link), and at most 50 ms (a reload is looked for then).
    int64_t wait_ns = 50'000'000;
    if (!g_queue.empty()) {
      const auto until = std::chrono::duration_cast<std::chrono::nanoseconds>(g_queue.top().at - now).count();
      wait_ns = std::clamp<int64_t>(until, 0, wait_ns);
    }
    const timespec wait{static_cast<time_t>(wait_ns / 1'000'000'000), static_cast<long>(wait_ns % 1'000'000'000)};
    if (::ppoll(fds.data(), fds.size(), &wait, nullptr) <= 0) continue;
    now = Clock::now();
    for (size_t p = 0; p < fds.size(); ++p) {
      if (fds[p].revents & POLLIN) receive(static_cast<int>(p), now);
    }
  }
  return 0;
}
