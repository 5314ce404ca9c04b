// Save of a whole distribution (checkpoint_format.h has the layout); with a world, every
// rank writes its own particles and rank 0 the manifest, last.
#include <torch/torch.h>

#include <algorithm>
#include <optional>

#include "core/files.h"
#include "core/staged_folder.h"
#include "runtime/checkpointer.h"

namespace push::detail {
namespace fs = std::filesystem;
using namespace checkpoint;

void Checkpointer::save(const fs::path& dir, const std::optional<std::set<Pid>>& only, const char* origin) {
  PUSH_CHECK(!dir.empty(), origin, "the checkpoint path is empty");
  if (only) {
    // Every rank knows every id: all ranks refuse the same list, before anything is made.
    PUSH_CHECK(!only->empty(), origin, "no particles given to save");
    for (Pid pid : *only) {
      PUSH_CHECK(registry_.find(pid).has_value(), origin, "particle ", pid, " does not exist");
    }
  }
  const bool lead = registry_.rank() == 0;
  auto fail = [&](const std::exception_ptr& e) {
    return Error(c10::str("[", origin, "] cannot save to '", dir.string(), "': ", describe(e)));
  };

  // Rank 0 (the only rank without a world) checks the folder and makes the staging one;
  // every rank writes its own particles there; rank 0 writes the manifest last and swaps
  // the folder into place. Any other way out (another rank's failure, a rank lost, ranks
  // out of step) removes the staging folder: StagedFolder's destructor.
  std::optional<StagedFolder> staged;
  std::exception_ptr failure;
  if (lead) {
    try {
      staged.emplace(dir, origin, "checkpoint", replaceable);
    } catch (...) {
      failure = std::current_exception();
    }
  }
  auto where = collectives_.agree(c10::IValue(staged ? staged->path().string() : std::string()), failure,
                                  "save (checking the folder)", origin);
  const fs::path staging = where.at(0).toStringRef();
  std::vector<ManifestEntry> entries;
  try {
    entries = write_particles(staging, only);
  } catch (...) {
    failure = std::make_exception_ptr(fail(std::current_exception()));
  }
  if (registry_.distributed()) {
    c10::impl::GenericList mine(c10::ListType::ofInts());
    for (const auto& e : entries) {
      mine.push_back(c10::List<int64_t>(
          {e.pid, e.lane, e.scheduler_steps, static_cast<int64_t>(e.bytes), static_cast<int64_t>(e.crc)}));
    }
    entries.clear();
    for (const auto& rank_entries : collectives_.agree(mine, failure, "save (writing particles)", origin)) {
      for (const auto& item : rank_entries.toListRef()) {
        const auto t = item.toIntVector();
        entries.push_back(ManifestEntry{t.at(0), static_cast<int>(t.at(1)), t.at(2), static_cast<uint64_t>(t.at(3)),
                                        static_cast<uint32_t>(t.at(4))});
      }
    }
    std::sort(entries.begin(), entries.end(),
              [](const ManifestEntry& a, const ManifestEntry& b) { return a.pid < b.pid; });
  } else if (failure) {
    std::rethrow_exception(failure);
  }
  if (lead) {
    try {
      staged->write(kManifest, manifest_text(entries));
      staged->publish();
    } catch (...) {
      failure = std::make_exception_ptr(fail(std::current_exception()));
    }
  }
  // A rank lost during this last step makes the others throw although rank 0 may have
  // published the checkpoint (it is whole either way).
  collectives_.agree(failure, "save (publishing)", origin);
}

std::vector<ManifestEntry> Checkpointer::write_particles(const fs::path& staged,
                                                         const std::optional<std::set<Pid>>& only) {
  // Outside the try: the futures (and the error a lane stored in one) outlive the catch
  // that reads the error, so the lane never frees an exception this thread still reads.
  std::vector<Future<std::vector<ManifestEntry>>> written;
  // Each lane writes its own particles, in parallel (the caller's own lane, when save
  // is called from a handler, inline in that handler).
  for (int lane = 0; lane < lanes_.size(); ++lane) {
    auto records = registry_.records_on(lane);
    if (only) std::erase_if(records, [&](const ParticleRecord* r) { return !only->count(r->pid); });
    written.push_back(lanes_.call<std::vector<ManifestEntry>>(lane, [this, lane, records, staged] {
      std::vector<ManifestEntry> entries;
      ParticleCache& cache = lanes_.at(lane).cache();
      for (ParticleRecord* r : records) {
        // The lane in every rank's numbering: a job of another shape re-places from it.
        ManifestEntry entry{r->pid, registry_.global_lane(r->lane), r->scheduler_steps};
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
          write_particle(archive, particle_file(staged, r->pid), entry);
        } catch (...) {
          cache.unpin(*r);
          throw Error(c10::str("particle ", r->pid, ": ", describe(std::current_exception())));
        }
        cache.unpin(*r);
        entries.push_back(entry);
      }
      return entries;
    }));
  }
  std::vector<ManifestEntry> entries;
  for (const auto& lane_entries : wait_all(written)) {
    entries.insert(entries.end(), lane_entries.begin(), lane_entries.end());
  }
  return entries;
}

}  // namespace push::detail
