#include "dist/transport/shm_ring.h"

#include <fcntl.h>
#include <linux/futex.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <climits>
#include <cstring>
#include <fstream>
#include <new>
#include "dist/transport/rpc_origin.h"

namespace push::dist::detail {

using push::detail::Clock;

namespace {

constexpr const char* kName = "push-rpc-ring";
constexpr std::size_t kHeaderBytes = 4096;
constexpr unsigned kSeals = F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL;

// The ring's first page: written by the receiver, read by the sender.
struct Shared {
  std::atomic<uint32_t> emptied;  // slots the receiver has emptied (mod 2^32)
  std::atomic<uint32_t> waiting;  // 1 while the sender waits for `emptied` to move
};
static_assert(std::atomic<uint32_t>::is_always_lock_free);

Shared* shared(char* base) { return reinterpret_cast<Shared*>(base); }

long futex(std::atomic<uint32_t>* word, int op, uint32_t value, const timespec* timeout) {
  return ::syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), op, value, timeout, nullptr, 0);
}

std::size_t ring_bytes(uint64_t slot_bytes, uint32_t slots) { return kHeaderBytes + slot_bytes * slots; }

std::string read_line(const char* path) {
  std::ifstream in(path);
  std::string line;
  std::getline(in, line);
  return line;
}

}  // namespace

std::unique_ptr<SendRing> SendRing::create(uint64_t slot_bytes, uint32_t slots, std::string& why) {
  std::unique_ptr<SendRing> r(new SendRing());
  r->slot_bytes_ = slot_bytes;
  r->slots_ = slots;
  r->mapped_ = ring_bytes(slot_bytes, slots);
  r->fd_ = ::memfd_create(kName, MFD_CLOEXEC | MFD_ALLOW_SEALING);
  if (r->fd_ < 0) {
    why = c10::str("memfd_create: ", std::strerror(errno));
    return nullptr;
  }
  if (::ftruncate(r->fd_, static_cast<off_t>(r->mapped_)) != 0 || ::fcntl(r->fd_, F_ADD_SEALS, kSeals) != 0) {
    why = c10::str("sizing the ring: ", std::strerror(errno));
    return nullptr;
  }
  void* p = ::mmap(nullptr, r->mapped_, PROT_READ | PROT_WRITE, MAP_SHARED, r->fd_, 0);
  if (p == MAP_FAILED) {
    why = c10::str("mmap: ", std::strerror(errno));
    return nullptr;
  }
  r->base_ = static_cast<char*>(p);
  // Fault the pages in now, once: a full slot is written at memory speed from then on.
  // (A memfd's pages come from shared memory: if it is too small, this is where it shows.)
#ifdef MADV_POPULATE_WRITE
  if (::madvise(r->base_, r->mapped_, MADV_POPULATE_WRITE) != 0 && errno != EINVAL) {  // EINVAL: before Linux 5.14
    why = c10::str("populating ", r->mapped_, " bytes of shared memory: ", std::strerror(errno));
    return nullptr;
  }
#endif
  new (r->base_) Shared{};
  return r;
}

SendRing::~SendRing() {
  if (base_ != nullptr) ::munmap(base_, mapped_);
  if (fd_ >= 0) ::close(fd_);
}

char* SendRing::acquire(Clock::time_point deadline, const std::atomic<bool>& broken, const std::string& peer) {
  char* slot = try_acquire(deadline, broken, peer);
  if (slot == nullptr) {
    throw Error(c10::str("[", kRpcOrigin, "] cannot send to ", peer,
                         ": no progress within the send timeout (its shared-memory ring stayed full)"));
  }
  return slot;
}

char* SendRing::try_acquire(Clock::time_point until, const std::atomic<bool>& broken, const std::string& peer) {
  Shared* s = shared(base_);
  for (;;) {
    uint32_t emptied = s->emptied.load(std::memory_order_acquire);
    if (head_ - emptied < slots_) break;
    if (broken.load(std::memory_order_acquire)) {
      throw Error(c10::str("[", kRpcOrigin, "] cannot send to ", peer, ": the connection closed"));
    }
    const auto now = Clock::now();
    if (now >= until) return nullptr;
    // Announce the wait, look once more, then sleep until the receiver moves `emptied`
    // (a wake between the look and the sleep makes the sleep return at once). At most
    // 100 ms at a time, so that a lost peer is noticed; with a ManualClock, at most its
    // tick, so that a deadline the test moves past is noticed.
    s->waiting.store(1, std::memory_order_seq_cst);
    if (head_ - s->emptied.load(std::memory_order_seq_cst) < slots_) break;
    const std::chrono::nanoseconds longest =
        Clock::manual() ? std::chrono::nanoseconds(Clock::kManualTick) : std::chrono::milliseconds(100);
    const auto left = std::min<std::chrono::nanoseconds>(until - now, longest);
    timespec ts{static_cast<time_t>(left.count() / 1000000000), static_cast<long>(left.count() % 1000000000)};
    futex(&s->emptied, FUTEX_WAIT, emptied, &ts);
  }
  return base_ + kHeaderBytes + static_cast<std::size_t>(head_ % slots_) * slot_bytes_;
}

void SendRing::interrupt() { futex(&shared(base_)->emptied, FUTEX_WAKE, INT_MAX, nullptr); }

std::unique_ptr<RecvRing> RecvRing::open(int64_t pid, int64_t fd, uint64_t slot_bytes, uint32_t slots) {
  PUSH_CHECK(pid > 0 && pid <= INT_MAX && fd >= 0 && fd <= INT_MAX, kRpcOrigin, "malformed ring announcement: pid ",
             pid, ", descriptor ", fd);
  const std::string path = c10::str("/proc/", pid, "/fd/", fd);
  char target[256] = {};
  const ssize_t n = ::readlink(path.c_str(), target, sizeof(target) - 1);
  PUSH_CHECK(n > 0 && std::strncmp(target, "/memfd:push-rpc-ring", 20) == 0, kRpcOrigin, "cannot open the ",
             "shared-memory ring at ", path, ": ",
             n > 0 ? c10::str("it is ", target) : std::string(std::strerror(errno)),
             " (set RpcGroupOptions::shared_memory(false) where processes cannot open each other's memory)");
  const int f = ::open(path.c_str(), O_RDWR | O_CLOEXEC);
  PUSH_CHECK(f >= 0, kRpcOrigin, "cannot open the shared-memory ring at ", path, ": ", std::strerror(errno),
             " (set RpcGroupOptions::shared_memory(false) where processes cannot open each other's memory)");
  struct stat st {};
  const int seals = ::fcntl(f, F_GET_SEALS);
  const bool ok = ::fstat(f, &st) == 0 && seals >= 0 && (static_cast<unsigned>(seals) & kSeals) == kSeals &&
                  static_cast<uint64_t>(st.st_size) == ring_bytes(slot_bytes, slots);
  if (!ok) {
    ::close(f);
    throw Error(
        c10::str("[", kRpcOrigin, "] the shared-memory ring at ", path, " is not a sealed ring of the announced size"));
  }
  std::unique_ptr<RecvRing> r(new RecvRing());
  r->slot_bytes_ = slot_bytes;
  r->slots_ = slots;
  r->mapped_ = ring_bytes(slot_bytes, slots);
  // MAP_POPULATE: the page tables are filled now, not on the first pass through the ring.
  void* p = ::mmap(nullptr, r->mapped_, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, f, 0);
  const int error = errno;
  ::close(f);
  PUSH_CHECK(p != MAP_FAILED, kRpcOrigin, "cannot map the shared-memory ring at ", path, ": ", std::strerror(error));
  r->base_ = static_cast<char*>(p);
  // Start where the sender is (0 on a fresh ring).
  r->tail_ = shared(r->base_)->emptied.load(std::memory_order_acquire);
  return r;
}

RecvRing::~RecvRing() {
  if (base_ != nullptr) ::munmap(base_, mapped_);
}

const char* RecvRing::front() const {
  return base_ + kHeaderBytes + static_cast<std::size_t>(tail_ % slots_) * slot_bytes_;
}

void RecvRing::pop() {
  Shared* s = shared(base_);
  s->emptied.store(++tail_, std::memory_order_seq_cst);
  if (s->waiting.exchange(0, std::memory_order_seq_cst) != 0) futex(&s->emptied, FUTEX_WAKE, INT_MAX, nullptr);
}

std::string host_identity() {
  static const std::string identity = [] {
    const auto ns = [](const char* path) {
      char link[64] = {};
      [[maybe_unused]] auto n = ::readlink(path, link, sizeof(link) - 1);
      return std::string(link);
    };
    return c10::str(read_line("/proc/sys/kernel/random/boot_id"), "/", ns("/proc/self/ns/pid"), "/",
                    ns("/proc/self/ns/net"), "/", ::getuid());
  }();
  return identity;
}

}  // namespace push::dist::detail
