#include <push/runtime/push.h>

#include <push/detail/torch_compat.h>

#include <ATen/CPUGeneratorImpl.h>
#include <torch/torch.h>

#include <pthread.h>

#include <algorithm>
#include <atomic>
#include <mutex>
#include <thread>
#include <unordered_set>

#include "runtime/heap.h"
#include "runtime/message_values.h"
#include "runtime/runtime.h"

namespace push {
namespace detail {
namespace {

uint64_t splitmix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

// Builds a module under `seed` without disturbing the global generator's sequence.
// Serialized: LibTorch's initializers draw from the one global CPU generator.
torch::nn::AnyModule build_module(const ModuleFactory& factory, uint64_t seed, Pid pid) {
  static std::mutex init_mutex;
  std::lock_guard<std::mutex> init_lock(init_mutex);
  auto generator = at::detail::getDefaultCPUGenerator();
  torch::Tensor saved;
  {
    std::lock_guard<std::mutex> lock(generator.mutex());
    saved = generator.get_state();
    generator.set_current_seed(seed);
  }
  auto restore = [&] {
    std::lock_guard<std::mutex> lock(generator.mutex());
    generator.set_state(saved);
  };
  torch::nn::AnyModule module;
  try {
    module = factory();
  } catch (...) {
    restore();
    throw Error(c10::str("[push::Push::p_create] the module factory threw for particle ", pid,
                         ": ", describe(std::current_exception())));
  }
  restore();
  PUSH_CHECK(!module.is_empty(), "push::Push::p_create",
             "the module factory returned an empty module for particle ", pid);
  return module;
}

// An exception from particle code, with the particle and message in its text.
std::exception_ptr wrap(Pid pid, const std::string& message, std::exception_ptr error) {
  try {
    std::rethrow_exception(error);
  } catch (const CancelledError& e) {
    return std::make_exception_ptr(CancelledError(
        c10::str("[push] particle ", pid, ", message '", message, "': ", e.what())));
  } catch (...) {
    return std::make_exception_ptr(ParticleError(pid, message, describe(error), error));
  }
}

}  // namespace

std::exception_ptr wrap_particle_error(Pid pid, const std::string& message,
                                       std::exception_ptr error) {
  return wrap(pid, message, std::move(error));
}

Runtime::Runtime(ModuleFactory factory, PushOptions options)
    : factory_(std::move(factory)), options_(std::move(options)) {
  PUSH_CHECK(factory_ != nullptr, "push::Push", "the module factory is empty");
  PUSH_CHECK(options_.cache_size() >= 1, "push::Push", "cache_size must be at least 1, got ",
             options_.cache_size());
  PUSH_CHECK(options_.view_size() >= 1, "push::Push", "view_size must be at least 1, got ",
             options_.view_size());
  PUSH_CHECK(options_.stack_size() >= 64 * 1024, "push::Push",
             "stack_size must be at least 64 KiB, got ", options_.stack_size());
  const int cuda = compat::cuda_device_count();
  const int lanes = options_.devices().value_or(cuda > 0 ? cuda : 1);
  PUSH_CHECK(lanes >= 1, "push::Push", "devices must be at least 1, got ", lanes);
  PUSH_CHECK(cuda == 0 || lanes <= cuda, "push::Push", "devices(", lanes,
             ") is more than the ", cuda, " CUDA devices of this machine");
  PUSH_CHECK(!options_.world() || options_.placement() == Placement::round_robin, "push::Push",
             "placement by_size needs every particle's size on every rank: it is for one process (no world)");
  lane_bytes_.assign(lanes, 0);
  int ranks_here = 1;
  if (options_.world()) {
    peers_ = Peers::create(*options_.world(), lanes);
    rank_ = peers_->rank();
    ranks_here = peers_->ranks_on_host();
  }
  // Ranks on one host share its cores too.
  const int cores = std::max(1u, std::thread::hardware_concurrency());
  const int threads = options_.intra_op_threads().value_or(std::max(1, cores / (lanes * ranks_here)));
  PUSH_CHECK(threads >= 1, "push::Push", "intra_op_threads must be at least 1, got ", threads);
  // LibTorch builds its pthreadpool lazily in the first at::set_num_threads; done here,
  // before any lane thread calls it, the pool is built on this thread (lanes start after),
  // not by two threads at once (ThreadSanitizer saw a lane's build race with this thread's
  // use of the pool, in code it cannot see the guard of).
  at::set_num_threads(at::get_num_threads());
  keep_freed_memory();
  for (int i = 0; i < lanes; ++i) {
    LaneConfig config;
    config.index = i;
    config.device = cuda > 0 ? torch::Device(torch::kCUDA, static_cast<c10::DeviceIndex>(i))
                             : torch::Device(torch::kCPU);
    config.cache_size = options_.cache_size();
    config.view_size = options_.view_size();
    config.intra_op_threads = threads;
    config.blas_threads = lanes == 1 ? threads : 1;  // OpenBLAS's pool is one per process
    config.stack_size = options_.stack_size();
    lanes_.push_back(std::make_shared<Lane>(config));
  }
  for (auto& lane : lanes_) lane->start();
  if (peers_) {
    try {
      peers_->start([this](PeerOp op, const dist::RpcArgs& body) { return serve(op, body); });
    } catch (...) {
      shutdown();
      throw;
    }
  }
}

Runtime::~Runtime() { shutdown(); }

void Runtime::shutdown() {
  // The other ranks may still message this rank's particles until every rank is here.
  if (peers_) peers_->leave();
  stopping_.store(true);
  for (auto& lane : lanes_) lane->stop();
}

bool Runtime::on_own_lane() const {
  const Lane* here = Lane::current();
  return here != nullptr &&
         std::any_of(lanes_.begin(), lanes_.end(), [&](const auto& l) { return l.get() == here; });
}

void Runtime::check_open(const char* origin) const {
  if (stopping_.load()) {
    throw CancelledError(c10::str("[", origin, "] the distribution is shutting down"));
  }
}

std::string Runtime::unknown_id_text(Pid pid) const {
  if (placements_.empty()) {
    return c10::str("unknown particle id ", pid, " (the distribution has no particles)");
  }
  return c10::str("unknown particle id ", pid, " (the distribution has ", placements_.size(),
                  " particles, ids ", placements_.begin()->first, "..", placements_.rbegin()->first, ")");
}

Where Runtime::where(Pid pid, const char* origin) const {
  std::shared_lock<std::shared_mutex> lock(mutex_);
  auto it = placements_.find(pid);
  if (it == placements_.end()) throw Error(c10::str("[", origin, "] ", unknown_id_text(pid)));
  Where at = it->second;
  if (at.rank == rank_) {
    auto record = records_.find(pid);
    // A particle of this rank is placed when it is registered, so its record is there.
    TORCH_INTERNAL_ASSERT(record != records_.end(), "particle ", pid, " placed here without a record");
    at.record = record->second.get();
  }
  return at;
}

std::vector<Pid> Runtime::particle_ids() const {
  std::shared_lock<std::shared_mutex> lock(mutex_);
  std::vector<Pid> ids;
  ids.reserve(placements_.size());
  for (const auto& entry : placements_) ids.push_back(entry.first);
  return ids;
}

std::vector<Pid> Runtime::local_particle_ids() const {
  std::shared_lock<std::shared_mutex> lock(mutex_);
  std::vector<Pid> ids;
  ids.reserve(records_.size());
  for (const auto& entry : records_) ids.push_back(entry.first);
  return ids;
}

int64_t Runtime::num_particles() const {
  std::shared_lock<std::shared_mutex> lock(mutex_);
  return static_cast<int64_t>(placements_.size());
}

std::vector<ParticleRecord*> Runtime::records_on(int lane) const {
  std::shared_lock<std::shared_mutex> lock(mutex_);
  std::vector<ParticleRecord*> out;
  for (const auto& entry : records_) {
    if (entry.second->lane == lane) out.push_back(entry.second.get());
  }
  return out;
}

Pid Runtime::create(const ParticleOptions& options, std::optional<Pid> wanted) {
  constexpr const char* origin = "push::Push::p_create";
  check_open(origin);
  Pid pid;
  if (wanted) {
    PUSH_CHECK(*wanted >= 0, origin, "particle ids are non-negative, got ", *wanted);
    pid = *wanted;
    reserve_pid(pid, origin);
  } else {
    std::unique_lock<std::shared_mutex> lock(mutex_);
    while (placements_.count(next_pid_) || reserved_.count(next_pid_)) ++next_pid_;
    pid = next_pid_++;
    reserved_.insert(pid);
  }
  try {
    const Where at = place(pid, options, origin);
    if (at.rank == rank_) {
      ParticleOptions here = options;
      // By size, build_record picks the lane once it knows the particle's size.
      if (options.device() || options_.placement() == Placement::round_robin) here.device(at.lane);
      register_record(build_record(here, pid, origin));
    } else {
      // Another rank builds it (p_create is collective): this one only learns where it is.
      std::unique_lock<std::shared_mutex> lock(mutex_);
      placements_[pid] = at;
      reserved_.erase(pid);
    }
  } catch (...) {
    if (peers_) {
      // Other ranks counted this id as this rank's: their requests for it fail with why.
      std::unique_lock<std::shared_mutex> lock(mutex_);
      failed_creations_[pid] = describe(std::current_exception());
    }
    release_pid(pid);
    throw;
  }
  return pid;
}

Where Runtime::place(Pid pid, const ParticleOptions& options, const char* origin) const {
  if (!peers_) {
    PUSH_CHECK(!options.rank() || *options.rank() == 0, origin, "rank(", *options.rank(),
               ") needs a distribution over a World (PushOptions::world)");
    return Where{0, options.device().value_or(static_cast<int>(pid % num_lanes()))};
  }
  const auto [rank0, lane0] = peers_->global_lane(pid);
  const int rank = options.rank().value_or(rank0);
  PUSH_CHECK(rank >= 0 && rank < peers_->size(), origin, "rank ", rank, " is out of range: the world has ",
             peers_->size(), " ranks");
  const int lanes = peers_->lanes_of(rank);
  const int lane = options.device().value_or(options.rank() ? static_cast<int>(pid % lanes) : lane0);
  PUSH_CHECK(lane >= 0 && lane < lanes, origin, "device ", lane, " is out of range: rank ", rank, " has ",
             lanes, " device", lanes == 1 ? "" : "s", " (0..", lanes - 1, ")");
  return Where{rank, lane};
}

void Runtime::reserve_pid(Pid pid, const char* origin) {
  std::unique_lock<std::shared_mutex> lock(mutex_);
  PUSH_CHECK(!placements_.count(pid) && !reserved_.count(pid), origin, "particle ", pid,
             reserved_.count(pid) ? " is being created by another call" : " already exists");
  reserved_.insert(pid);
  next_pid_ = std::max(next_pid_, pid + 1);
}

void Runtime::release_pid(Pid pid) {
  std::vector<Promise<bool>> waiting;
  {
    std::unique_lock<std::shared_mutex> lock(mutex_);
    reserved_.erase(pid);
    if (records_.count(pid)) return;
    auto it = creation_waiters_.find(pid);
    if (it != creation_waiters_.end()) {
      waiting = std::move(it->second);
      creation_waiters_.erase(it);
    }
  }
  // Requests of other ranks waiting for this particle learn that it will not come.
  for (auto& w : waiting) {
    w.set_error(std::make_exception_ptr(Error(c10::str("particle ", pid, " could not be created on rank ", rank_))));
  }
}

std::unique_ptr<ParticleRecord> Runtime::build_record(const ParticleOptions& options, Pid pid,
                                                      const char* origin) {
  int lane = options.device().value_or(static_cast<int>(pid % num_lanes()));
  PUSH_CHECK(lane >= 0 && lane < num_lanes(), origin, "device ", lane,
             " is out of range: the distribution has ", num_lanes(), " device",
             num_lanes() == 1 ? "" : "s", " (0..", num_lanes() - 1, ")");

  auto record = std::make_unique<ParticleRecord>();
  record->pid = pid;
  record->seed = options.seed().value_or(splitmix64(options_.seed() ^ splitmix64(static_cast<uint64_t>(pid))));
  record->module = build_module(factory_, record->seed, pid);
  for (const auto& t : record->module.ptr()->parameters()) record->bytes += t.numel() * static_cast<int64_t>(t.element_size());
  for (const auto& t : record->module.ptr()->buffers()) record->bytes += t.numel() * static_cast<int64_t>(t.element_size());
  if (!options.device() && options_.placement() == Placement::by_size) {
    // The lightest lane by the particles registered so far (counted in register_record,
    // so scratch copies that load builds and failed builds count nothing).
    std::shared_lock<std::shared_mutex> lock(mutex_);
    lane = static_cast<int>(std::min_element(lane_bytes_.begin(), lane_bytes_.end()) - lane_bytes_.begin());
  }
  record->lane = lane;
  const torch::Device device = lanes_[lane]->device();
  if (device != torch::kCPU) record->module.ptr()->to(device);
  for (const auto& item : record->module.ptr()->named_parameters()) {
    record->parameter_names.push_back(item.key());
  }
  record->make_optimizer = options.optimizer();
  if (options.optimizer()) {
    record->optimizer = options.optimizer()(record->module.ptr()->parameters());
    PUSH_CHECK(record->optimizer != nullptr, origin,
               "the optimizer factory returned null for particle ", pid);
  }
  if (options.scheduler()) {
    PUSH_CHECK(record->optimizer != nullptr, origin, "particle ", pid,
               " has a scheduler factory but no optimizer factory");
    record->make_scheduler = options.scheduler();
    record->scheduler = record->make_scheduler(*record->optimizer);
    PUSH_CHECK(record->scheduler != nullptr, origin,
               "the scheduler factory returned null for particle ", pid);
  }
  record->handlers = options.receive();
  record->state = options.state();
  record->handle = std::make_unique<Particle>(*this, *record);
  return record;
}

void Runtime::register_record(std::unique_ptr<ParticleRecord> record) {
  // Into the cache before anyone can address it, so no message overtakes the insert.
  ParticleRecord* raw = record.get();
  call_on_lane<bool>(raw->lane, [this, raw] {
    lanes_[raw->lane]->cache().insert(*raw);
    return true;
  }).wait();
  std::vector<Promise<bool>> waiting;
  {
    std::unique_lock<std::shared_mutex> lock(mutex_);
    // The id was reserved by the caller, so no other record can hold it.
    TORCH_INTERNAL_ASSERT(!records_.count(raw->pid), "particle ", raw->pid, " registered twice");
    next_pid_ = std::max(next_pid_, raw->pid + 1);
    placements_[raw->pid] = Where{rank_, raw->lane};
    lane_bytes_[raw->lane] += raw->bytes;
    failed_creations_.erase(raw->pid);
    records_.emplace(raw->pid, std::move(record));
    reserved_.erase(raw->pid);
    auto it = creation_waiters_.find(raw->pid);
    if (it != creation_waiters_.end()) {
      waiting = std::move(it->second);
      creation_waiters_.erase(it);
    }
  }
  for (auto& w : waiting) w.set_value(true);
}

PFuture Runtime::send(Pid pid, const std::string& message, Args args, const char* origin, bool from_peer) {
  // A request of another rank is served until this rank has left the others (a Push
  // closed from its own handler still meets them first); the lanes refuse it after.
  if (stopping_.load() && !from_peer) {
    return PFuture::failed(std::make_exception_ptr(
        CancelledError(c10::str("[", origin, "] the distribution is shutting down"))));
  }
  const Where at = where(pid, origin);
  if (at.rank != rank_) return send_remote(pid, at, message, std::move(args));
  ParticleRecord* record = at.record;
  if (Lane* here = Lane::current()) detach_from_particles(args, here->cache());
  auto state = std::make_shared<FutureState<c10::IValue>>();
  auto handler = [record, message, args = std::move(args), state] {
    Lane& lane = *Lane::current();
    try {
      lane.pin_running();
      auto it = record->handlers.find(message);
      if (it == record->handlers.end()) {
        std::string known;
        for (const auto& h : record->handlers) known += (known.empty() ? "'" : ", '") + h.first + "'";
        throw Error(c10::str("unknown message '", message, "' (particle ", record->pid,
                             " handles ", known.empty() ? std::string("no messages") : known, ")"));
      }
      c10::IValue result;
      if (has_tensor_off(args, lane.device())) {
        Args local;
        local.reserve(args.size());
        for (const auto& a : args) local.push_back(to_device(a, lane.device()));
        result = it->second(*record->handle, local);
      } else {
        result = it->second(*record->handle, args);
      }
      {
        std::vector<c10::IValue> out{std::move(result)};
        detach_from_particles(out, lane.cache());
        result = std::move(out[0]);
      }
      lane.unpin_running();
      state->set_value(std::move(result));
    } catch (...) {
      lane.unpin_running();
      state->set_error(wrap(record->pid, message, std::current_exception()));
    }
  };
  lanes_[record->lane]->post_handler(
      *record, std::move(handler), [state](std::exception_ptr e) { state->set_error(std::move(e)); });
  return PFuture(std::move(state));
}

ParticleView::Data Runtime::snapshot(ParticleRecord& record, const torch::Device& device) {
  Lane& lane = *lanes_[record.lane];
  torch::NoGradGuard no_grad;
  ParticleView::Data data;
  data.pid = record.pid;
  data.version = record.version.load(std::memory_order_acquire);
  data.names = record.parameter_names;
  auto copy = [&](const torch::Tensor& t) {
    return t.defined() ? t.to(device, t.scalar_type(), /*non_blocking=*/false, /*copy=*/true)
                       : torch::Tensor();
  };
  for (const auto& p : lane.cache().parameters(record)) data.parameters.push_back(copy(p));
  for (const auto& g : lane.cache().gradients(record)) data.gradients.push_back(copy(g));
  compat::synchronize(lane.device());
  return data;
}

// Shutdowns that ~Push hands to a thread of their own (see ~Push). The threads are joined
// when the next one starts (those already done) and, at the latest, at exit, when this
// object is destroyed: none is detached, none outlives the process's static destructors.
class DeferredShutdowns {
 public:
  static DeferredShutdowns& instance() {
    static DeferredShutdowns shutdowns;
    return shutdowns;
  }

  void start(std::shared_ptr<Runtime> runtime) {
    std::lock_guard<std::mutex> lock(mutex_);
    join_finished();
    auto done = std::make_shared<std::atomic<bool>>(false);
    threads_.push_back({std::thread([runtime = std::move(runtime), done]() mutable {
                          pthread_setname_np(pthread_self(), "push-shutdown");
                          runtime->shutdown();
                          runtime.reset();
                          done->store(true, std::memory_order_release);
                        }),
                        done});
  }

  ~DeferredShutdowns() {
    std::lock_guard<std::mutex> lock(mutex_);
    for (auto& t : threads_) t.thread.join();
  }

 private:
  struct Entry {
    std::thread thread;
    std::shared_ptr<std::atomic<bool>> done;
  };
  void join_finished() {
    std::erase_if(threads_, [](Entry& t) {
      if (!t.done->load(std::memory_order_acquire)) return false;
      t.thread.join();
      return true;
    });
  }
  std::mutex mutex_;
  std::vector<Entry> threads_;
};

}  // namespace detail

// ---- Push -------------------------------------------------------------------------

Push::Push(ModuleFactory module_factory, PushOptions options)
    : runtime_(std::make_shared<detail::Runtime>(std::move(module_factory), std::move(options))) {}

Push::~Push() {
  if (!runtime_->on_own_lane()) {
    runtime_->shutdown();
    return;
  }
  // Destroyed from inside one of its own handlers (or a continuation on one of its
  // lanes): joining that lane from itself would terminate the process. The distribution
  // refuses new work now; a background thread that owns the runtime shuts it down (the
  // calling handler's lane stops once that handler returns or waits) and frees it.
  runtime_->close();
  detail::DeferredShutdowns::instance().start(std::move(runtime_));
}

Pid Push::p_create(ParticleOptions options) { return runtime_->create(options); }

PFuture Push::p_launch(Pid pid, const std::string& message, Args args) {
  return runtime_->send(pid, message, std::move(args), "push::Push::p_launch");
}

std::vector<c10::IValue> Push::p_wait(const std::vector<PFuture>& futures) {
  return wait_all(futures);
}

std::vector<std::pair<std::string, torch::Tensor>> Push::p_named_parameters(Pid pid) {
  constexpr const char* origin = "push::Push::p_parameters";
  auto* rt = runtime_.get();
  const detail::Where at = rt->where(pid, origin);
  ParticleView::Data data;
  if (at.rank != rt->rank()) {
    data = rt->parameters_remote(pid, at);
  } else {
    auto& record = *at.record;
    data = rt->call_on_lane<ParticleView::Data>(record.lane, [rt, &record] {
             return rt->snapshot(record, torch::kCPU);
           }).wait();
  }
  std::vector<std::pair<std::string, torch::Tensor>> out;
  for (size_t i = 0; i < data.parameters.size(); ++i) {
    out.emplace_back(data.names[i], data.parameters[i]);
  }
  return out;
}

std::vector<torch::Tensor> Push::p_parameters(Pid pid) {
  std::vector<torch::Tensor> out;
  for (auto& item : p_named_parameters(pid)) out.push_back(std::move(item.second));
  return out;
}

std::vector<Pid> Push::particle_ids() const { return runtime_->particle_ids(); }
std::vector<Pid> Push::local_particle_ids() const { return runtime_->local_particle_ids(); }
int Push::rank() const { return runtime_->rank(); }
int Push::world_size() const { return runtime_->world_size(); }
int Push::rank_of(Pid pid) const { return runtime_->where(pid, "push::Push::rank_of").rank; }
int Push::lane_of(Pid pid) const { return runtime_->where(pid, "push::Push::lane_of").lane; }
void Push::barrier() { runtime_->barrier("push::Push::barrier"); }
std::vector<c10::IValue> Push::all_gather(c10::IValue value, const std::string& tag) {
  if (!runtime_->peers()) return {std::move(value)};
  return runtime_->gather(std::move(value), "all_gather '" + tag + "'", "push::Push::all_gather");
}
int64_t Push::num_particles() const { return runtime_->num_particles(); }
int Push::num_devices() const { return runtime_->num_lanes(); }

torch::Device Push::device(int lane) const {
  PUSH_CHECK(lane >= 0 && lane < runtime_->num_lanes(), "push::Push::device", "device ", lane,
             " is out of range: the distribution has ", runtime_->num_lanes(), " devices");
  return runtime_->lane(lane).device();
}

CacheStats Push::cache_stats(int lane) const {
  device(lane);  // range check
  const auto& l = runtime_->lane(lane);
  CacheStats stats;
  stats.resident = l.cache().resident();
  stats.evictions = l.cache().evictions();
  stats.restores = l.cache().restores();
  stats.view_hits = l.views().hits();
  stats.view_misses = l.views().misses();
  return stats;
}

void Push::save(const std::filesystem::path& dir) { runtime_->save(dir); }

void Push::load(const std::filesystem::path& dir,
                const std::function<ParticleOptions(Pid)>& make_options) {
  runtime_->load(dir, make_options);
}

}  // namespace push
