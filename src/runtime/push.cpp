// push::Push, the distribution: a thin facade over detail::Runtime (runtime.h).
#include <push/runtime/push.h>

#include "runtime/deferred_shutdowns.h"
#include "runtime/runtime.h"

namespace push {

Push::Push(ModuleFactory module_factory, PushOptions options)
    : runtime_(std::make_shared<detail::Runtime>(std::move(module_factory), std::move(options))) {}

Push::~Push() {
  if (!runtime_->lanes().owns_current_thread()) {
    runtime_->shutdown();
    return;
  }
  // Destroyed from inside one of its own handlers (or a continuation on one of its
  // lanes): joining that lane from itself would terminate the process. The distribution
  // refuses new work now; a background thread that owns the runtime shuts it down (the
  // calling handler's lane stops once that handler returns or waits) and frees it.
  runtime_->close();
  detail::shut_down_later(std::move(runtime_));
}

Pid Push::p_create(ParticleOptions options) { return runtime_->create(options); }

PFuture Push::p_launch(Pid pid, const std::string& message, Args args) {
  return runtime_->send(pid, message, std::move(args), "push::Push::p_launch");
}

std::vector<c10::IValue> Push::p_wait(const std::vector<PFuture>& futures) { return wait_all(futures); }

std::vector<std::pair<std::string, torch::Tensor>> Push::p_named_parameters(Pid pid) {
  const ParticleView::Data data = runtime_->parameters(pid, "push::Push::p_parameters");
  std::vector<std::pair<std::string, torch::Tensor>> out;
  for (size_t i = 0; i < data.parameters.size(); ++i) out.emplace_back(data.names[i], data.parameters[i]);
  return out;
}

std::vector<torch::Tensor> Push::p_parameters(Pid pid) {
  std::vector<torch::Tensor> out;
  for (auto& item : p_named_parameters(pid)) out.push_back(std::move(item.second));
  return out;
}

std::vector<Pid> Push::particle_ids() const { return runtime_->registry().particle_ids(); }
std::vector<Pid> Push::local_particle_ids() const { return runtime_->registry().local_particle_ids(); }
int64_t Push::num_particles() const { return runtime_->registry().size(); }
int Push::rank() const { return runtime_->rank(); }
int Push::world_size() const { return runtime_->world_size(); }
int Push::rank_of(Pid pid) const { return runtime_->registry().where(pid, "push::Push::rank_of").rank; }
int Push::lane_of(Pid pid) const { return runtime_->registry().where(pid, "push::Push::lane_of").lane; }
int Push::num_devices() const { return runtime_->lanes().size(); }

void Push::barrier() { runtime_->collectives().barrier("push::Push::barrier"); }

std::vector<c10::IValue> Push::all_gather(c10::IValue value, const std::string& tag) {
  return runtime_->collectives().gather(std::move(value), "all_gather '" + tag + "'", "push::Push::all_gather");
}

std::vector<c10::IValue> Push::all_gather_or_throw(c10::IValue value, const std::exception_ptr& error,
                                                   const std::string& tag) {
  return runtime_->collectives().agree(std::move(value), error, "all_gather_or_throw '" + tag + "'",
                                       tag.empty() ? "push::Push::all_gather_or_throw" : tag.c_str());
}

torch::Device Push::device(int lane) const {
  const int lanes = runtime_->lanes().size();
  PUSH_CHECK(lane >= 0 && lane < lanes, "push::Push::device", "device ", lane,
             " is out of range: the distribution has ", lanes, " devices");
  return runtime_->lanes().at(lane).device();
}

CacheStats Push::cache_stats(int lane) const {
  device(lane);  // range check
  const auto& l = runtime_->lanes().at(lane);
  CacheStats stats;
  stats.resident = l.cache().resident();
  stats.evictions = l.cache().evictions();
  stats.restores = l.cache().restores();
  stats.view_hits = l.views().hits();
  stats.view_misses = l.views().misses();
  return stats;
}

void Push::save(const std::filesystem::path& dir) { runtime_->save(dir, std::nullopt, "push::Push::save"); }

void Push::save(const std::filesystem::path& dir, const std::vector<Pid>& pids) {
  runtime_->save(dir, std::set<Pid>(pids.begin(), pids.end()), "push::Push::save");
}

void Push::load(const std::filesystem::path& dir, const std::function<ParticleOptions(Pid)>& make_options) {
  runtime_->load(dir, make_options, /*whole=*/true, "push::Push::load");
}

std::vector<Pid> Push::load_particles(const std::filesystem::path& dir,
                                      const std::function<ParticleOptions(Pid)>& make_options) {
  return runtime_->load(dir, make_options, /*whole=*/false, "push::Push::load_particles");
}

}  // namespace push
