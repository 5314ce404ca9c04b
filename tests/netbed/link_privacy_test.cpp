// What an eavesdropper on the link between two hosts sees of push's RPC (docs/distributed.md,
// "Every frame"): the frames' headers, and nothing of the values and tensors they carry.
#include <push/dist.h>

#include <linux/if_ether.h>
#include <linux/if_packet.h>

#include <atomic>
#include <chrono>
#include <future>
#include <string>
#include <thread>

#include <test_util.h>

#include "netbed/netbed_util.h"
#include "netbed/ranks_on_hosts.h"

using namespace std::chrono_literals;

namespace {
using namespace push::testing;

using LinkPrivacy = Hosts;

constexpr char kPrivacyMarker[] = "a value only the job may read";

c10::IValue privacy_echo(const push::dist::RpcArgs& a) { return a.at(0); }
PUSH_RPC_FUNCTION(privacy_echo);

/// 256 KiB of the marker, over and over, as a tensor's bytes.
at::Tensor marked_tensor() {
  auto t = torch::empty({256 << 10}, torch::kUInt8);
  auto* p = t.data_ptr<uint8_t>();
  for (int64_t i = 0; i < t.numel(); ++i) p[i] = static_cast<uint8_t>(kPrivacyMarker[i % (sizeof(kPrivacyMarker) - 1)]);
  return t;
}

// Each rank sends the other the marker as a string and as tensor bytes, and gets them back.
PUSH_DIST_WORKER(privacy_values) {
  auto world = test_world(60s);
  auto rpc = world.rpc_group("private", world.names());
  const auto t = marked_tensor();
  const auto value = c10::ivalue::Tuple::create({c10::IValue(std::string(kPrivacyMarker)), c10::IValue(t)});
  const auto back = rpc.rpc_sync(1 - world.rank(), "privacy_echo", {value}).toTupleRef().elements();
  EXPECT_EQ(back.at(0).toStringRef(), kPrivacyMarker);
  EXPECT_TRUE(torch::equal(back.at(1).toTensor(), t));
  rpc.shutdown();
}

/// Every frame on host `h`'s links, both ways, from a packet socket in its namespace (opened
/// by a thread of its own: only that thread enters the namespace).
class Sniffer {
 public:
  Sniffer(const NetBed& bed, int h) {
    std::promise<std::string> opened;
    auto ready = opened.get_future();
    thread_ = std::thread([this, &bed, h, opened = std::move(opened)]() mutable {
      const int fd = enter(bed, h) ? ::socket(AF_PACKET, SOCK_RAW | SOCK_CLOEXEC, htons(ETH_P_ALL)) : -1;
      opened.set_value(fd >= 0 ? "" : c10::str("cannot sniff host ", h, ": ", std::strerror(errno)));
      if (fd < 0) return;
      const int bytes = 32 << 20;  // room for the whole exchange: a full buffer drops frames
      ::setsockopt(fd, SOL_SOCKET, SO_RCVBUFFORCE, &bytes, sizeof(bytes));
      std::vector<char> frame(1 << 16);
      while (!stop_) {
        pollfd p{fd, POLLIN, 0};
        if (::poll(&p, 1, 50) <= 0) continue;
        const ssize_t n = ::recv(fd, frame.data(), frame.size(), 0);
        if (n > 0) seen_.append(frame.data(), static_cast<std::size_t>(n));
      }
      ::close(fd);
    });
    error_ = ready.get();
  }
  ~Sniffer() { stop(); }
  const std::string& error() const { return error_; }
  /// Everything seen so far, once the sniffing stopped.
  const std::string& stop() {
    stop_ = true;
    if (thread_.joinable()) thread_.join();
    return seen_;
  }

 private:
  std::thread thread_;
  std::atomic<bool> stop_{false};
  std::string seen_;
  std::string error_;
};

TEST_F(LinkPrivacy, AnEavesdropperOnTheLinkSeesFrameHeadersButNoValueOrTensorByte) {
  NetBed bed(2);
  Sniffer sniffer(bed, 1);
  ASSERT_EQ(sniffer.error(), "");
  expect_all_ok(run_workers(2, "privacy_values", 90s, {}, on_hosts(bed, {0, 1})));
  const std::string& seen = sniffer.stop();
  // It saw the traffic (four messages of 256 KiB cross this link; the kernel may drop some
  // frames of a busy packet socket) and push's frame headers ("PRP3").
  EXPECT_GT(seen.size(), std::size_t{512} << 10);
  EXPECT_NE(seen.find("PRP3"), std::string::npos);
  // And none of what the frames carried.
  EXPECT_EQ(seen.find(kPrivacyMarker), std::string::npos);
}

}  // namespace
