// A device lane (lane.h): the event loop of one device, its thread set up with the device
// current and the lane's own intra-op and BLAS thread counts, and the particle hooks the
// loop calls around every suspension.
#include "runtime/lane.h"

#include <ATen/Parallel.h>
#include <c10/core/DeviceGuard.h>
#include <c10/util/StringUtil.h>

#include <dlfcn.h>

#include <algorithm>
#include <typeinfo>
#include <utility>

#include "runtime/particle_record.h"

namespace push::detail {
namespace {

// OpenBLAS (Debian's LibTorch links whichever BLAS the system selects) keeps one pthread
// pool per process, not per calling thread, so at::set_num_threads does not limit it.
// Looked up at run time: with another BLAS the symbols are absent and nothing is done.
// push only limits the pool: never above the size it had before push first touched it
// (OPENBLAS_NUM_THREADS, or the cores), which the user may have lowered on purpose.
void set_blas_threads(int n) {
  using Get = int (*)();
  using Set = void (*)(int);
  static const auto get = reinterpret_cast<Get>(::dlsym(RTLD_DEFAULT, "openblas_get_num_threads"));
  static const auto set = reinterpret_cast<Set>(::dlsym(RTLD_DEFAULT, "openblas_set_num_threads"));
  if (get == nullptr || set == nullptr) return;
  static const int initial = get();
  n = std::max(1, std::min(n, initial));
  if (get() != n) set(n);
}

EventLoop::Options loop_options(const LaneConfig& config) {
  EventLoop::Options options;
  options.name = "push-lane-" + std::to_string(config.index);
  options.device = config.device;
  options.stack_size = config.stack_size;
  options.stopped = "the distribution was destroyed";
  return options;
}

}  // namespace

Lane::Lane(LaneConfig config)
    : EventLoop(loop_options(config)),
      config_(std::move(config)),
      streams_(config_.device),
      cache_(streams_, config_.device, config_.cache_size),
      views_(config_.view_size) {}

// Joined here, not in ~EventLoop: the loop's last work (unwinding suspended handlers)
// still uses the caches and this class's hooks.
Lane::~Lane() { stop(); }

// A type check, not a blind cast: the thread may run an event loop that is not a lane (an
// RPC loop), whose fiber jobs have no particle. Lane is final, so comparing the exact type
// is enough, and cheaper than a dynamic_cast on this hot path (every send and handler).
Lane* Lane::current() {
  EventLoop* loop = EventLoop::current();
  return loop != nullptr && typeid(*loop) == typeid(Lane) ? static_cast<Lane*>(loop) : nullptr;
}

void Lane::thread_main() {
  c10::DeviceGuard device_guard(config_.device);
  streams_.enter();
  // BLAS first: an OpenMP build of OpenBLAS sets this thread's OpenMP count, which
  // at::set_num_threads then sets to the lane's.
  set_blas_threads(config_.blas_threads);
  at::set_num_threads(config_.intra_op_threads);
  run();
}

std::string Lane::describe_job(void* owner) const {
  const auto* record = static_cast<const ParticleRecord*>(owner);
  return c10::str("a handler of particle ", record != nullptr ? record->pid : -1);
}

void Lane::check_may_wait(void* owner) {
  PUSH_CHECK(!lending(), "push::Particle::borrow", "a handler cannot wait inside Particle::borrow (particle ",
             static_cast<ParticleRecord*>(owner) != nullptr ? static_cast<ParticleRecord*>(owner)->pid : -1, ")");
}

void Lane::pin_running() {
  ParticleRecord* record = running();
  if (record == nullptr || pinned_ == record) return;
  cache_.pin(*record);
  pinned_ = record;
  record->version.fetch_add(1, std::memory_order_acq_rel);
}

void Lane::unpin_running() {
  ParticleRecord* record = running();
  if (record == nullptr || pinned_ != record) return;
  pinned_ = nullptr;
  cache_.unpin(*record);
}

}  // namespace push::detail
