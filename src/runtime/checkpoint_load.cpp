// Load of a whole distribution, all or nothing (checkpoint_format.h has the layout); with
// a world, every rank checks what it loads before any rank changes anything.
#include <torch/torch.h>

#include <algorithm>
#include <map>
#include <set>

#include "runtime/checkpointer.h"

namespace push::detail {
namespace fs = std::filesystem;
using namespace checkpoint;

namespace {
// One particle of the checkpoint on its way in.
struct Incoming {
  ManifestEntry entry;
  int lane = 0;
  bool here = true;  // this rank loads it (false: another rank does)
  torch::serialize::InputArchive archive;
  ParticleRecord* live = nullptr;           // the particle here it overwrites, or
  std::unique_ptr<ParticleRecord> created;  // the new particle it becomes (already loaded)
};
}  // namespace

std::vector<Pid> Checkpointer::load(const fs::path& dir, const std::function<ParticleOptions(Pid)>& make_options,
                                    bool whole, const char* origin) {
  auto corrupt = [&](const std::exception_ptr& e) {
    return Error(c10::str("[", origin, "] checkpoint '", dir.string(), "' is corrupt: ", describe(e)));
  };

  std::vector<Incoming> incoming;
  std::map<Pid, ParticleOptions> to_create;  // new particles of this rank
  std::map<Pid, Where> elsewhere;            // new particles of other ranks
  // The ids of the particles to create are claimed now, so that no p_create running
  // meanwhile can take one (it would be registered twice); the claims are given back
  // when the load fails before registering them.
  std::vector<Pid> claimed;
  struct Release {
    Registry& registry;
    std::vector<Pid>& pids;
    ~Release() {
      for (Pid pid : pids) registry.release(pid);
    }
  } release{registry_, claimed};

  // Everything this rank loads is read, checked and loaded into scratch copies before
  // any live particle changes; with a world, every rank does so before any applies.
  std::exception_ptr failure;
  try {
    PUSH_CHECK(fs::is_directory(dir), origin, "checkpoint directory '", dir.string(), "' does not exist");
    try {
      for (const auto& e : read_manifest(dir)) incoming.push_back(Incoming{e, 0, true, {}, {}, {}});
    } catch (const Error&) {
      throw corrupt(std::current_exception());
    }

    // The ids must match (a whole load: extra ones here are an error); missing ones need
    // make_options.
    std::set<Pid> saved;
    for (const auto& in : incoming) saved.insert(in.entry.pid);
    std::string extra;
    for (Pid pid : registry_.particle_ids()) {
      if (!saved.count(pid)) extra += (extra.empty() ? "" : ", ") + std::to_string(pid);
    }
    PUSH_CHECK(!whole || extra.empty(), origin, "particles ", extra, " exist here but not in checkpoint '",
               dir.string(), "' (load_particles loads a checkpoint of some particles)");
    for (auto& in : incoming) {
      const std::optional<Where> placed = registry_.find(in.entry.pid);
      if (placed) in.live = placed->record;
      if (in.live) {
        in.lane = in.live->lane;
        continue;
      }
      if (placed) {  // lives on another rank, which loads it
        in.here = false;
        continue;
      }
      PUSH_CHECK(make_options != nullptr, origin, "checkpoint '", dir.string(), "' has particle ", in.entry.pid,
                 ", which this distribution lacks; pass make_options to create it");
      ParticleOptions options = make_options(in.entry.pid);
      // Without a world a particle returns to its saved lane when there is one; with one,
      // new particles are placed by the rule of this job (the saved job may have differed).
      if (!registry_.distributed() && !options.device() && in.entry.lane < lanes_.size()) options.device(in.entry.lane);
      const Where at = registry_.place(in.entry.pid, options, origin);
      if (at.rank != registry_.rank()) {
        in.here = false;
        elsewhere.emplace(in.entry.pid, at);
        continue;
      }
      in.lane = at.lane;
      options.device(at.lane);
      to_create.emplace(in.entry.pid, std::move(options));
    }
    for (const auto& [pid, options] : to_create) {
      registry_.claim(pid, origin);
      claimed.push_back(pid);
    }
    for (const auto& [pid, at] : elsewhere) {
      registry_.claim(pid, origin);
      claimed.push_back(pid);
    }

    // Every file this rank loads, checked and parsed.
    try {
      for (auto& in : incoming) {
        if (in.here) in.archive = open_particle(dir, in.entry, lanes_.at(in.lane).device());
      }
    } catch (const Error&) {
      throw corrupt(std::current_exception());
    }

    // Every particle, loaded into a scratch copy (or into the new particle it becomes).
    // A scratch copy is built by the same factories as the live particle, so what loads
    // into it loads into the live one.
    for (auto& in : incoming) {
      if (!in.here) continue;
      try {
        std::unique_ptr<ParticleRecord> scratch;
        const ParticleOptions options = in.live ? ParticleOptions()
                                                      .optimizer(in.live->make_optimizer)
                                                      .scheduler(in.live->make_scheduler)
                                                      .seed(in.live->seed)
                                                : to_create.at(in.entry.pid);
        scratch = builder_.build(options, in.entry.pid, in.lane, lanes_.at(in.lane).device(), runtime_, origin);
        load_into(*scratch, in.archive, in.entry);
        if (!in.live) in.created = std::move(scratch);
      } catch (...) {
        throw Error(c10::str("[", origin, "] particle ", in.entry.pid, " from '", dir.string(),
                             "' does not fit: ", describe(std::current_exception())));
      }
    }
  } catch (...) {
    failure = std::current_exception();
  }
  collectives_.agree(failure, "load (checking)", origin);

  // Everything fits everywhere: apply. New particles first (their ids are claimed), then
  // the live ones, each on its own lane, whose view caches forget what they kept (a new
  // particle's versions start again). A failure here (a lane that fails to take what its
  // scratch copy took) is reported by every rank but not undone.
  failure = nullptr;
  std::vector<Future<bool>> applied;  // outside the try: the lanes' jobs refer to `incoming`
  try {
    for (auto& in : incoming) {
      if (!in.created) continue;
      add_particle(lanes_, registry_, std::move(in.created));  // its id was claimed above
      std::erase(claimed, in.entry.pid);
    }
    for (const auto& [pid, at] : elsewhere) {
      registry_.add_elsewhere(pid, at);
      std::erase(claimed, pid);
    }
    for (int lane = 0; lane < lanes_.size(); ++lane) {
      applied.push_back(lanes_.call<bool>(lane, [&, lane] {
        ParticleCache& cache = lanes_.at(lane).cache();
        lanes_.at(lane).views().clear();
        for (auto& in : incoming) {
          if (!in.live || in.lane != lane) continue;
          ParticleRecord& r = *in.live;
          cache.pin(r);
          try {
            load_into(r, in.archive, in.entry);
          } catch (...) {
            cache.unpin(r);
            throw Error(c10::str(
                "[", origin, "] particle ", r.pid, " from '", dir.string(),
                "' loaded into a scratch copy but not into the particle: ", describe(std::current_exception())));
          }
          r.version.fetch_add(1, std::memory_order_acq_rel);
          cache.unpin(r);
        }
        return true;
      }));
    }
    wait_all(applied);
  } catch (...) {
    failure = std::current_exception();
  }
  for (const auto& f : applied) f.wait_ready();
  collectives_.agree(failure, "load (applying)", origin);
  std::vector<Pid> loaded;
  for (const auto& in : incoming) loaded.push_back(in.entry.pid);
  std::sort(loaded.begin(), loaded.end());
  return loaded;
}

}  // namespace push::detail
