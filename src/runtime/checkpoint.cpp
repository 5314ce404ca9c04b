// Save and load of a whole distribution.
//
// Layout of a checkpoint directory:
//   push.manifest        "push-checkpoint 1", the particle count, one line per particle
//                        "<pid> <lane> <scheduler steps>", then "end"
//   particle-<pid>.pt    a LibTorch archive: "module", "optimizer" (nested archives),
//                        "push.pid", "push.state"
// save() writes everything into a sibling temporary directory, fsyncs it, then swaps it
// into place with renameat2(RENAME_EXCHANGE) (or rename when there is nothing to
// replace): a crash at any point leaves either the old checkpoint or the new one.
#include <torch/torch.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fcntl.h>
#include <fstream>
#include <set>
#include <sstream>
#include <unistd.h>

#include "runtime/runtime.h"

namespace push::detail {
namespace fs = std::filesystem;
namespace {

constexpr const char* kManifest = "push.manifest";
constexpr const char* kMagic = "push-checkpoint";
constexpr int kFormat = 1;

struct ManifestEntry {
  Pid pid = -1;
  int lane = 0;
  int64_t scheduler_steps = 0;
};

fs::path particle_file(const fs::path& dir, Pid pid) {
  return dir / ("particle-" + std::to_string(pid) + ".pt");
}

void fsync_path(const fs::path& path, bool directory) {
  int fd = ::open(path.c_str(), directory ? (O_RDONLY | O_DIRECTORY) : O_RDONLY);
  if (fd < 0) {
    throw Error(c10::str("cannot open '", path.string(), "' to sync it: ", std::strerror(errno)));
  }
  const int rc = ::fsync(fd);
  ::close(fd);
  if (rc != 0) throw Error(c10::str("cannot sync '", path.string(), "': ", std::strerror(errno)));
}

// Moves `staged` to `target`, atomically replacing a directory already there.
void publish(const fs::path& staged, const fs::path& target) {
  if (fs::exists(target)) {
    if (::renameat2(AT_FDCWD, staged.c_str(), AT_FDCWD, target.c_str(), RENAME_EXCHANGE) != 0) {
      throw Error(c10::str("cannot swap '", staged.string(), "' into '", target.string(),
                           "': ", std::strerror(errno)));
    }
    fs::remove_all(staged);  // now the previous checkpoint
  } else {
    fs::rename(staged, target);
  }
  fsync_path(target.parent_path(), /*directory=*/true);
}

std::vector<ManifestEntry> read_manifest(const fs::path& dir) {
  const fs::path path = dir / kManifest;
  std::ifstream in(path);
  if (!in) throw Error(c10::str("missing ", kManifest));
  std::string magic, word;
  int format = 0;
  int64_t count = -1;
  if (!(in >> magic >> format) || magic != kMagic) {
    throw Error(c10::str(kManifest, " does not start with '", kMagic, "'"));
  }
  if (format != kFormat) {
    throw Error(c10::str(kManifest, " has format ", format, "; this build reads format ", kFormat));
  }
  if (!(in >> word >> count) || word != "particles" || count < 0) {
    throw Error(c10::str(kManifest, " has no valid particle count"));
  }
  std::vector<ManifestEntry> entries;
  std::set<Pid> seen;
  for (int64_t i = 0; i < count; ++i) {
    ManifestEntry e;
    if (!(in >> e.pid >> e.lane >> e.scheduler_steps) || e.pid < 0 || e.lane < 0 ||
        e.scheduler_steps < 0) {
      throw Error(c10::str(kManifest, " line ", i + 3, " is not '<pid> <lane> <steps>'"));
    }
    if (!seen.insert(e.pid).second) {
      throw Error(c10::str(kManifest, " lists particle ", e.pid, " twice"));
    }
    entries.push_back(e);
  }
  if (!(in >> word) || word != "end") throw Error(c10::str(kManifest, " is truncated"));
  return entries;
}

// Every particle file, read and checked before anything in the distribution changes.
torch::serialize::InputArchive open_particle(const fs::path& dir, Pid pid,
                                             const torch::Device& device) {
  const fs::path path = particle_file(dir, pid);
  if (!fs::exists(path)) throw Error(c10::str("missing ", path.filename().string()));
  torch::serialize::InputArchive archive;
  try {
    archive.load_from(path.string(), device);
  } catch (...) {
    throw Error(c10::str(path.filename().string(), " is unreadable: ",
                         describe(std::current_exception())));
  }
  c10::IValue saved_pid;
  if (!archive.try_read("push.pid", saved_pid) || !saved_pid.isInt() ||
      saved_pid.toInt() != pid) {
    throw Error(c10::str(path.filename().string(), " does not hold particle ", pid));
  }
  return archive;
}

}  // namespace

void Runtime::save(const fs::path& dir) {
  constexpr const char* origin = "push::Push::save";
  check_open(origin);
  PUSH_CHECK(!dir.empty(), origin, "the checkpoint path is empty");
  const fs::path target = fs::absolute(dir).lexically_normal();
  static std::atomic<uint64_t> counter{0};
  const fs::path staged = target.parent_path() /
      (target.filename().string() + ".tmp-" + std::to_string(::getpid()) + "-" +
       std::to_string(counter.fetch_add(1)));
  try {
    fs::create_directories(target.parent_path());
    fs::remove_all(staged);
    fs::create_directory(staged);

    // Each lane writes its own particles, in parallel.
    std::vector<Future<std::vector<ManifestEntry>>> written;
    for (int lane = 0; lane < num_lanes(); ++lane) {
      auto records = records_on(lane);
      written.push_back(call_on_lane<std::vector<ManifestEntry>>(lane, [this, lane, records, staged] {
        std::vector<ManifestEntry> entries;
        ParticleCache& cache = lanes_[lane]->cache();
        for (ParticleRecord* r : records) {
          cache.pin(*r);
          try {
            torch::serialize::OutputArchive archive, module_archive;
            r->module.ptr()->save(module_archive);
            archive.write("module", module_archive);
            if (r->optimizer) {
              torch::serialize::OutputArchive optimizer_archive;
              r->optimizer->save(optimizer_archive);
              archive.write("optimizer", optimizer_archive);
            }
            archive.write("push.pid", c10::IValue(r->pid));
            c10::impl::GenericDict state(c10::StringType::get(), c10::AnyType::get());
            for (const auto& [key, value] : r->state) state.insert(key, value);
            archive.write("push.state", c10::IValue(state));
            const fs::path path = particle_file(staged, r->pid);
            archive.save_to(path.string());
            fsync_path(path, /*directory=*/false);
          } catch (...) {
            cache.unpin(*r);
            throw Error(c10::str("particle ", r->pid, ": ", describe(std::current_exception())));
          }
          cache.unpin(*r);
          entries.push_back({r->pid, r->lane, r->scheduler_steps});
        }
        return entries;
      }));
    }
    std::vector<ManifestEntry> entries;
    for (const auto& lane_entries : wait_all(written)) {
      entries.insert(entries.end(), lane_entries.begin(), lane_entries.end());
    }
    {
      std::ofstream out(staged / kManifest);
      out << kMagic << ' ' << kFormat << "\nparticles " << entries.size() << '\n';
      for (const auto& e : entries) out << e.pid << ' ' << e.lane << ' ' << e.scheduler_steps << '\n';
      out << "end\n";
      out.flush();
      if (!out) throw Error(c10::str("cannot write ", kManifest));
    }
    fsync_path(staged / kManifest, /*directory=*/false);
    fsync_path(staged, /*directory=*/true);
    publish(staged, target);
  } catch (...) {
    std::error_code ignored;
    fs::remove_all(staged, ignored);
    throw Error(c10::str("[", origin, "] cannot save to '", dir.string(), "': ",
                         describe(std::current_exception())));
  }
}

void Runtime::load(const fs::path& dir, const std::function<ParticleOptions(Pid)>& make_options) {
  constexpr const char* origin = "push::Push::load";
  check_open(origin);
  std::vector<ManifestEntry> entries;
  std::map<Pid, torch::serialize::InputArchive> archives;
  try {
    PUSH_CHECK(fs::is_directory(dir), origin, "checkpoint directory '", dir.string(),
               "' does not exist");
    entries = read_manifest(dir);
    for (const auto& e : entries) {
      const int lane = e.lane < num_lanes() ? e.lane : static_cast<int>(e.pid % num_lanes());
      archives.emplace(e.pid, open_particle(dir, e.pid, lanes_[lane]->device()));
    }
  } catch (const Error& e) {
    if (std::string(e.what()).rfind("[push::", 0) == 0) throw;
    throw Error(c10::str("[", origin, "] checkpoint '", dir.string(), "' is corrupt: ", e.what()));
  }

  // The ids must match: extra ones here are an error, missing ones are created.
  std::set<Pid> saved;
  for (const auto& e : entries) saved.insert(e.pid);
  std::string extra;
  for (Pid pid : particle_ids()) {
    if (!saved.count(pid)) extra += (extra.empty() ? "" : ", ") + std::to_string(pid);
  }
  PUSH_CHECK(extra.empty(), origin, "particles ", extra, " exist here but not in checkpoint '",
             dir.string(), "'");
  for (const auto& e : entries) {
    std::shared_lock<std::shared_mutex> lock(mutex_);
    if (records_.count(e.pid)) continue;
    lock.unlock();
    PUSH_CHECK(make_options != nullptr, origin, "checkpoint '", dir.string(), "' has particle ",
               e.pid, ", which this distribution lacks; pass make_options to create it");
    ParticleOptions options = make_options(e.pid);
    if (!options.device() && e.lane < num_lanes()) options.device(e.lane);
    create(options, e.pid);
  }

  std::vector<Future<bool>> applied;
  for (int lane = 0; lane < num_lanes(); ++lane) {
    auto records = records_on(lane);
    applied.push_back(call_on_lane<bool>(lane, [&, lane, records] {
      ParticleCache& cache = lanes_[lane]->cache();
      for (ParticleRecord* r : records) {
        const auto& entry = *std::find_if(entries.begin(), entries.end(),
                                          [&](const ManifestEntry& e) { return e.pid == r->pid; });
        auto& archive = archives.at(r->pid);
        cache.pin(*r);
        try {
          torch::serialize::InputArchive module_archive;
          archive.read("module", module_archive);
          r->module.ptr()->load(module_archive);
          torch::serialize::InputArchive optimizer_archive;
          const bool has_optimizer = archive.try_read("optimizer", optimizer_archive);
          PUSH_CHECK(has_optimizer == (r->optimizer != nullptr), origin, "particle ", r->pid,
                     has_optimizer ? " was saved with an optimizer but has none here"
                                   : " has an optimizer here but was saved without one");
          if (r->make_scheduler) {
            // A LibTorch scheduler's only state is its step count: replay it on a fresh
            // one; the optimizer's saved learning rates are loaded right after.
            r->scheduler = r->make_scheduler(*r->optimizer);
            for (int64_t i = 0; i < entry.scheduler_steps; ++i) r->scheduler->step();
          }
          r->scheduler_steps = entry.scheduler_steps;
          if (r->optimizer) r->optimizer->load(optimizer_archive);
          c10::IValue state;
          if (archive.try_read("push.state", state) && state.isGenericDict()) {
            r->state.clear();
            for (const auto& item : state.toGenericDict()) {
              r->state[item.key().toStringRef()] = item.value();
            }
          }
          r->version.fetch_add(1, std::memory_order_acq_rel);
        } catch (...) {
          cache.unpin(*r);
          throw Error(c10::str("[", origin, "] particle ", r->pid, " from '", dir.string(),
                               "': ", describe(std::current_exception())));
        }
        cache.unpin(*r);
      }
      return true;
    }));
  }
  wait_all(applied);
}

}  // namespace push::detail
