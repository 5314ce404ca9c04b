// Save of a whole distribution (checkpoint_format.h has the layout); with a world, every
// rank writes its own particles and rank 0 the manifest, last.
#include <torch/torch.h>

#include <sys/types.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <fstream>
#include <set>

#include "runtime/checkpoint_format.h"
#include "runtime/runtime.h"

namespace push::detail {
namespace fs = std::filesystem;
using namespace checkpoint;

// With a world, save and load are collective: every step that can fail on one rank ends
// with every rank learning whether all of them succeeded (agree), so all return or all
// throw, and nothing is published or changed unless every rank got that far.
void Runtime::agree(std::exception_ptr failure, const std::string& step, const char* origin) {
  if (!peers_) {
    if (failure) std::rethrow_exception(failure);
    return;
  }
  const auto all = gather(failure ? c10::IValue(describe(failure)) : c10::IValue(), step, origin);
  if (failure) std::rethrow_exception(failure);
  for (size_t r = 0; r < all.size(); ++r) {
    if (all[r].isString()) {
      throw Error(c10::str("[", origin, "] failed on ", peers_->describe(static_cast<int>(r)), ": ",
                           all[r].toStringRef()));
    }
  }
}

void Runtime::save(const fs::path& dir) {
  constexpr const char* origin = "push::Push::save";
  check_open(origin);
  PUSH_CHECK(!dir.empty(), origin, "the checkpoint path is empty");
  fs::path target = fs::absolute(dir).lexically_normal();
  // "ck/" names the folder ck: drop the empty last component it leaves.
  if (!target.has_filename() && target != target.root_path()) target = target.parent_path();
  auto fail = [&](const std::exception_ptr& e) {
    return Error(c10::str("[", origin, "] cannot save to '", dir.string(), "': ", describe(e)));
  };

  // Rank 0 (the only rank without a world) checks the folder and makes the staging one;
  // every rank writes its own particles there; rank 0 writes the manifest last and swaps
  // the folder into place.
  fs::path staged;
  std::exception_ptr failure;
  if (rank_ == 0) {
    try {
      staged = stage_checkpoint(dir, target);
    } catch (...) {
      failure = std::current_exception();
    }
  }
  // Rank 0 removes the staging folder on any way out but publishing it (another rank's
  // failure, a rank lost, ranks out of step).
  struct Discard {
    const fs::path* dir = nullptr;
    ~Discard() {
      std::error_code ignored;
      if (dir != nullptr) fs::remove_all(*dir, ignored);
    }
  } discard;
  if (rank_ == 0 && !failure) discard.dir = &staged;
  agree(failure, "save (checking the folder)", origin);
  if (peers_) {
    const std::string path = gather(c10::IValue(staged.string()), "save (staging folder)", origin).at(0).toStringRef();
    if (rank_ != 0) staged = path;
  }
  std::vector<ManifestEntry> entries;
  try {
    entries = write_particles(staged);
  } catch (...) {
    failure = std::make_exception_ptr(fail(std::current_exception()));
  }
  agree(failure, "save (writing particles)", origin);
  if (peers_) {
    c10::impl::GenericList mine(c10::AnyType::get());
    for (const auto& e : entries) {
      mine.push_back(c10::ivalue::Tuple::create({e.pid, static_cast<int64_t>(e.lane), e.scheduler_steps,
                                                 static_cast<int64_t>(e.bytes), static_cast<int64_t>(e.crc)}));
    }
    entries.clear();
    for (const auto& rank_entries : gather(mine, "save (manifest entries)", origin)) {
      for (const auto& item : rank_entries.toListRef()) {
        const auto& t = item.toTupleRef().elements();
        entries.push_back(ManifestEntry{t[0].toInt(), static_cast<int>(t[1].toInt()), t[2].toInt(),
                                        static_cast<uint64_t>(t[3].toInt()), static_cast<uint32_t>(t[4].toInt())});
      }
    }
    std::sort(entries.begin(), entries.end(),
              [](const ManifestEntry& a, const ManifestEntry& b) { return a.pid < b.pid; });
  }
  if (rank_ == 0) {
    try {
      std::ofstream out(staged / kManifest, std::ios::binary);
      out << manifest_text(entries);
      out.flush();
      if (!out) throw Error(c10::str("cannot write ", kManifest));
      out.close();
      fsync_path(staged / kManifest, /*directory=*/false);
      fsync_path(staged, /*directory=*/true);
      publish(staged, target);
      discard.dir = nullptr;
    } catch (...) {
      failure = std::make_exception_ptr(fail(std::current_exception()));
    }
  }
  // A rank lost during this last step makes the others throw although rank 0 may have
  // published the checkpoint (it is whole either way).
  agree(failure, "save (publishing)", origin);
}

fs::path Runtime::stage_checkpoint(const fs::path& dir, const fs::path& target) {
  constexpr const char* origin = "push::Push::save";
  PUSH_CHECK(target != target.root_path(), origin, "cannot save into the root folder");
  // The folder is replaced as a whole: never one that holds something else.
  std::error_code ec;
  if (fs::is_directory(target, ec) && !fs::is_empty(target, ec) && !fs::exists(target / kManifest, ec)) {
    throw Error(c10::str("[", origin, "] '", dir.string(),
                         "' is a folder that holds something other than a push checkpoint; "
                         "save into a new, empty or checkpoint folder"));
  }
  PUSH_CHECK(!fs::exists(target, ec) || fs::is_directory(target, ec), origin, "'", dir.string(),
             "' exists and is not a folder");
  static std::atomic<uint64_t> counter{0};
  const fs::path staged = target.parent_path() /
      (target.filename().string() + ".tmp-" + std::to_string(::getpid()) + "-" +
       std::to_string(counter.fetch_add(1)));
  try {
    fs::create_directories(target.parent_path());
    fs::remove_all(staged);
    fs::create_directory(staged);
  } catch (...) {
    std::error_code ignored;
    fs::remove_all(staged, ignored);
    throw Error(c10::str("[", origin, "] cannot save to '", dir.string(), "': ",
                         describe(std::current_exception())));
  }
  return staged;
}

std::vector<ManifestEntry> Runtime::write_particles(const fs::path& staged) {
  // Outside the try: the futures (and the error a lane stored in one) outlive the catch
  // that reads the error, so the lane never frees an exception this thread still reads.
  std::vector<Future<std::vector<ManifestEntry>>> written;
  // Each lane writes its own particles, in parallel (the caller's own lane, when save
  // is called from a handler, inline in that handler).
  for (int lane = 0; lane < num_lanes(); ++lane) {
    auto records = records_on(lane);
    written.push_back(call_on_lane<std::vector<ManifestEntry>>(lane, [this, lane, records, staged] {
      std::vector<ManifestEntry> entries;
      ParticleCache& cache = lanes_[lane]->cache();
      for (ParticleRecord* r : records) {
        // The lane in every rank's numbering: a job of another shape re-places from it.
        ManifestEntry entry{r->pid, global_lane(r->lane), r->scheduler_steps};
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
