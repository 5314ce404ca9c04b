// Save and load of a whole distribution.
//
// Layout of a checkpoint directory:
//   push.manifest        "push-checkpoint 2", "particles <n>", one line per particle
//                        "<pid> <lane> <scheduler steps> <bytes> <crc32c>", then
//                        "end <crc32c of every byte before 'end'>"
//   particle-<pid>.pt    a LibTorch archive: "module", "optimizer" (nested archives),
//                        "push.pid", "push.state"
// save() writes everything into a sibling temporary directory, fsyncs it, then swaps it
// into place with renameat2(RENAME_EXCHANGE) (or rename when there is nothing to
// replace): a crash at any point leaves either the old checkpoint or the new one.
// LibTorch's archives carry no checksum of their tensor bytes, so the manifest records
// each file's size and CRC-32C: a file changed after save (a flipped bit, a truncation)
// is refused by load, naming the file, before anything is read from it.
//
// load() is all or nothing: every file is read and checked, then every particle is
// loaded into a scratch copy (a fresh module from the same factory, an optimizer and
// scheduler from the particle's own factories) and only when all of them load is any
// live particle touched or any missing one added.
#include <torch/torch.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fcntl.h>
#include <fstream>
#include <iomanip>
#include <iterator>
#include <set>
#include <sstream>
#include <unistd.h>

#include "runtime/crc32c.h"
#include "runtime/runtime.h"

namespace push::detail {
namespace fs = std::filesystem;
namespace {

constexpr const char* kManifest = "push.manifest";
constexpr const char* kMagic = "push-checkpoint";
constexpr int kFormat = 2;

struct ManifestEntry {
  Pid pid = -1;
  int lane = 0;
  int64_t scheduler_steps = 0;
  uint64_t bytes = 0;  // of the particle file
  uint32_t crc = 0;    // CRC-32C of the particle file
};

std::string hex(uint32_t crc) {
  std::ostringstream out;
  out << std::hex << std::setw(8) << std::setfill('0') << crc;
  return out.str();
}

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

std::string read_file(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw Error(c10::str("cannot open ", path.filename().string()));
  std::string bytes{std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
  if (in.bad()) throw Error(c10::str("cannot read ", path.filename().string()));
  return bytes;
}

// The manifest's text: everything up to "end" is covered by the checksum after it.
std::string manifest_text(const std::vector<ManifestEntry>& entries) {
  std::ostringstream body;
  body << kMagic << ' ' << kFormat << "\nparticles " << entries.size() << '\n';
  for (const auto& e : entries) {
    body << e.pid << ' ' << e.lane << ' ' << e.scheduler_steps << ' ' << e.bytes << ' '
         << hex(e.crc) << '\n';
  }
  std::string text = body.str();
  return text + "end " + hex(crc32c(text.data(), text.size())) + '\n';
}

std::vector<ManifestEntry> read_manifest(const fs::path& dir) {
  const fs::path path = dir / kManifest;
  if (!fs::exists(path)) throw Error(c10::str("missing ", kManifest));
  const std::string text = read_file(path);
  std::istringstream in(text);
  std::string magic, word;
  int format = 0;
  int64_t count = -1;
  if (!(in >> magic >> format) || magic != kMagic) {
    throw Error(c10::str(kManifest, " does not start with '", kMagic, "'"));
  }
  if (format != kFormat) {
    throw Error(c10::str(kManifest, " has format ", format, "; this build reads format ", kFormat));
  }
  const size_t end = text.rfind("\nend ");
  if (end == std::string::npos) throw Error(c10::str(kManifest, " is truncated"));
  uint32_t recorded = 0;
  {
    std::istringstream tail(text.substr(end + 5));
    if (!(tail >> std::hex >> recorded)) throw Error(c10::str(kManifest, " has no checksum"));
  }
  if (crc32c(text.data(), end + 1) != recorded) {
    throw Error(c10::str(kManifest, " fails its checksum: it changed after it was saved"));
  }
  if (!(in >> word >> count) || word != "particles" || count < 0) {
    throw Error(c10::str(kManifest, " has no valid particle count"));
  }
  std::vector<ManifestEntry> entries;
  std::set<Pid> seen;
  for (int64_t i = 0; i < count; ++i) {
    ManifestEntry e;
    if (!(in >> e.pid >> e.lane >> e.scheduler_steps >> e.bytes >> std::hex >> e.crc >> std::dec) ||
        e.pid < 0 || e.lane < 0 || e.scheduler_steps < 0) {
      throw Error(c10::str(kManifest, " line ", i + 3,
                           " is not '<pid> <lane> <steps> <bytes> <crc32c>'"));
    }
    if (!seen.insert(e.pid).second) {
      throw Error(c10::str(kManifest, " lists particle ", e.pid, " twice"));
    }
    entries.push_back(e);
  }
  if (!(in >> word) || word != "end") throw Error(c10::str(kManifest, " is truncated"));
  return entries;
}

// Writes `archive` to `path` through our own checked writes (LibTorch's file writer
// reports a failed write by throwing from a destructor), recording size and CRC-32C.
void write_particle(torch::serialize::OutputArchive& archive, const fs::path& path,
                    ManifestEntry& entry) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) {
    throw Error(c10::str("cannot create ", path.filename().string(), ": ", std::strerror(errno)));
  }
  int error = 0;
  uint64_t bytes = 0;
  uint32_t crc = 0;
  archive.save_to([&](const void* data, size_t size) -> size_t {
    const std::string zeros(data == nullptr ? size : 0, '\0');
    const char* p = data == nullptr ? zeros.data() : static_cast<const char*>(data);
    crc = crc32c(p, size, crc);
    bytes += size;
    for (size_t left = size; left > 0 && error == 0;) {
      const ssize_t n = ::write(fd, p, left);
      if (n < 0) {
        if (errno != EINTR) error = errno;
        continue;
      }
      p += n;
      left -= static_cast<size_t>(n);
    }
    return size;  // always: a short count makes LibTorch throw from a destructor
  });
  if (error == 0 && ::fsync(fd) != 0) error = errno;
  if (::close(fd) != 0 && error == 0) error = errno;
  if (error != 0) {
    throw Error(c10::str("cannot write ", path.filename().string(), ": ", std::strerror(error)));
  }
  entry.bytes = bytes;
  entry.crc = crc;
}

// A particle file, checked against the manifest before LibTorch parses a byte of it.
// The bytes are parsed from memory, so what was checked is what is loaded; the archive
// copies every tensor out of them (jit::load is eager), so they are freed on return.
torch::serialize::InputArchive open_particle(const fs::path& dir, const ManifestEntry& e,
                                             const torch::Device& device) {
  const fs::path path = particle_file(dir, e.pid);
  const std::string name = path.filename().string();
  if (!fs::exists(path)) throw Error(c10::str("missing ", name));
  const std::string bytes = read_file(path);
  if (bytes.size() != e.bytes) {
    throw Error(c10::str(name, " has ", bytes.size(), " bytes but ", e.bytes,
                         " were saved (truncated or replaced)"));
  }
  const uint32_t crc = crc32c(bytes.data(), bytes.size());
  if (crc != e.crc) {
    throw Error(c10::str(name, " fails its checksum (crc32c ", hex(crc), ", saved ", hex(e.crc),
                         "): its bytes changed after it was saved"));
  }
  torch::serialize::InputArchive archive;
  try {
    archive.load_from(bytes.data(), bytes.size(), device);
  } catch (...) {
    throw Error(c10::str(name, " is unreadable: ", describe(std::current_exception())));
  }
  c10::IValue saved_pid;
  if (!archive.try_read("push.pid", saved_pid) || !saved_pid.isInt() ||
      saved_pid.toInt() != e.pid) {
    throw Error(c10::str(name, " does not hold particle ", e.pid));
  }
  return archive;
}

struct TensorLayout {
  std::string kind, name;
  std::vector<int64_t> sizes;
  c10::ScalarType dtype;
};

// Every parameter and buffer (duplicates included) with its shape and type.
std::vector<TensorLayout> layout_of(torch::nn::Module& module) {
  std::vector<TensorLayout> out;
  for (const auto& item : module.named_parameters()) {
    out.push_back({"parameter", item.key(), item.value().sizes().vec(), item.value().scalar_type()});
  }
  for (const auto& item : module.named_buffers()) {
    out.push_back({"buffer", item.key(), item.value().sizes().vec(), item.value().scalar_type()});
  }
  return out;
}

// Loads one saved particle into `r`: a scratch copy (to check it) or the live particle
// (pinned, on its lane). LibTorch's Module::load adopts a saved tensor of any shape, so
// shapes and types are compared here.
void load_into(ParticleRecord& r, torch::serialize::InputArchive& archive, const ManifestEntry& e) {
  const auto expected = layout_of(*r.module.ptr());
  torch::serialize::InputArchive module_archive;
  archive.read("module", module_archive);
  r.module.ptr()->load(module_archive);
  const auto loaded = layout_of(*r.module.ptr());
  for (size_t i = 0; i < expected.size() && i < loaded.size(); ++i) {
    const TensorLayout &want = expected[i], &got = loaded[i];
    if (want.sizes != got.sizes || want.dtype != got.dtype) {
      throw Error(c10::str(want.kind, " '", want.name, "' is ", got.dtype, c10::IntArrayRef(got.sizes),
                           " in the checkpoint but ", want.dtype, c10::IntArrayRef(want.sizes),
                           " here"));
    }
  }
  torch::serialize::InputArchive optimizer_archive;
  const bool has_optimizer = archive.try_read("optimizer", optimizer_archive);
  if (has_optimizer != (r.optimizer != nullptr)) {
    throw Error(has_optimizer ? "it was saved with an optimizer but has none here"
                              : "it has an optimizer here but was saved without one");
  }
  if (r.make_scheduler) {
    // A LibTorch scheduler's only state is its step count: replay it on a fresh one; the
    // optimizer's saved learning rates are loaded right after.
    r.scheduler = r.make_scheduler(*r.optimizer);
    for (int64_t i = 0; i < e.scheduler_steps; ++i) r.scheduler->step();
  }
  r.scheduler_steps = e.scheduler_steps;
  if (r.optimizer) {
    try {
      r.optimizer->load(optimizer_archive);
    } catch (...) {
      // LibTorch reports a state of another optimizer type as an internal assert.
      throw Error(c10::str("its saved optimizer state does not fit its ",
                           c10::demangle(typeid(*r.optimizer).name()), " here (",
                           describe(std::current_exception()), ")"));
    }
  }
  c10::IValue state;
  if (archive.try_read("push.state", state)) {
    if (!state.isGenericDict()) throw Error("its saved user state is not a dictionary");
    State loaded_state;
    for (const auto& item : state.toGenericDict()) {
      if (!item.key().isString()) throw Error("its saved user state has a key that is not a string");
      loaded_state[item.key().toStringRef()] = item.value();
    }
    r.state = std::move(loaded_state);
  }
}

}  // namespace

void Runtime::save(const fs::path& dir) {
  constexpr const char* origin = "push::Push::save";
  check_open(origin);
  PUSH_CHECK(!dir.empty(), origin, "the checkpoint path is empty");
  fs::path target = fs::absolute(dir).lexically_normal();
  // "ck/" names the folder ck: drop the empty last component it leaves.
  if (!target.has_filename() && target != target.root_path()) target = target.parent_path();
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
  // Outside the try: the futures (and the error a lane stored in one) outlive the catch
  // that reads the error, so the lane never frees an exception this thread still reads.
  std::vector<Future<std::vector<ManifestEntry>>> written;
  try {
    fs::create_directories(target.parent_path());
    fs::remove_all(staged);
    fs::create_directory(staged);

    // Each lane writes its own particles, in parallel (the caller's own lane, when save
    // is called from a handler, inline in that handler).
    for (int lane = 0; lane < num_lanes(); ++lane) {
      auto records = records_on(lane);
      written.push_back(call_on_lane<std::vector<ManifestEntry>>(lane, [this, lane, records, staged] {
        std::vector<ManifestEntry> entries;
        ParticleCache& cache = lanes_[lane]->cache();
        for (ParticleRecord* r : records) {
          ManifestEntry entry{r->pid, r->lane, r->scheduler_steps};
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
    {
      std::ofstream out(staged / kManifest, std::ios::binary);
      out << manifest_text(entries);
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

namespace {
// One particle of the checkpoint on its way in.
struct Incoming {
  ManifestEntry entry;
  int lane = 0;
  torch::serialize::InputArchive archive;
  ParticleRecord* live = nullptr;           // the particle here it overwrites, or
  std::unique_ptr<ParticleRecord> created;  // the new particle it becomes (already loaded)
};
}  // namespace

void Runtime::load(const fs::path& dir, const std::function<ParticleOptions(Pid)>& make_options) {
  constexpr const char* origin = "push::Push::load";
  check_open(origin);
  PUSH_CHECK(fs::is_directory(dir), origin, "checkpoint directory '", dir.string(),
             "' does not exist");
  auto corrupt = [&](const std::exception_ptr& e) {
    return Error(c10::str("[", origin, "] checkpoint '", dir.string(), "' is corrupt: ", describe(e)));
  };

  std::vector<Incoming> incoming;
  try {
    for (const auto& e : read_manifest(dir)) incoming.push_back(Incoming{e, {}, {}, {}, {}});
  } catch (const Error&) {
    throw corrupt(std::current_exception());
  }

  // The ids must match: extra ones here are an error, missing ones need make_options.
  std::set<Pid> saved;
  for (const auto& in : incoming) saved.insert(in.entry.pid);
  std::string extra;
  for (Pid pid : particle_ids()) {
    if (!saved.count(pid)) extra += (extra.empty() ? "" : ", ") + std::to_string(pid);
  }
  PUSH_CHECK(extra.empty(), origin, "particles ", extra, " exist here but not in checkpoint '",
             dir.string(), "'");
  std::map<Pid, ParticleOptions> to_create;
  for (auto& in : incoming) {
    {
      std::shared_lock<std::shared_mutex> lock(mutex_);
      auto it = records_.find(in.entry.pid);
      if (it != records_.end()) in.live = it->second.get();
    }
    if (in.live) {
      in.lane = in.live->lane;
      continue;
    }
    PUSH_CHECK(make_options != nullptr, origin, "checkpoint '", dir.string(), "' has particle ",
               in.entry.pid, ", which this distribution lacks; pass make_options to create it");
    ParticleOptions options = make_options(in.entry.pid);
    if (!options.device() && in.entry.lane < num_lanes()) options.device(in.entry.lane);
    in.lane = options.device().value_or(static_cast<int>(in.entry.pid % num_lanes()));
    PUSH_CHECK(in.lane >= 0 && in.lane < num_lanes(), origin, "make_options gave particle ",
               in.entry.pid, " device ", in.lane, ", out of range 0..", num_lanes() - 1);
    to_create.emplace(in.entry.pid, std::move(options));
  }

  // The ids of the particles to create are claimed now, so that no p_create running
  // meanwhile can take one (it would be registered twice); the claims are given back
  // when the load fails before registering them.
  std::vector<Pid> claimed;
  struct Release {
    Runtime& runtime;
    std::vector<Pid>& pids;
    ~Release() {
      for (Pid pid : pids) runtime.release_pid(pid);
    }
  } release{*this, claimed};
  for (const auto& [pid, options] : to_create) {
    reserve_pid(pid, origin);
    claimed.push_back(pid);
  }

  // Every file, checked and parsed.
  try {
    for (auto& in : incoming) {
      in.archive = open_particle(dir, in.entry, lanes_[in.lane]->device());
    }
  } catch (const Error&) {
    throw corrupt(std::current_exception());
  }

  // Every particle, loaded into a scratch copy (or into the new particle it becomes),
  // before any live one changes. A scratch copy is built by the same factories as the
  // live particle, so what loads into it loads into the live one.
  for (auto& in : incoming) {
    try {
      std::unique_ptr<ParticleRecord> scratch;
      if (in.live) {
        scratch = build_record(ParticleOptions()
                                   .optimizer(in.live->make_optimizer)
                                   .scheduler(in.live->make_scheduler)
                                   .seed(in.live->seed)
                                   .device(in.lane),
                               in.entry.pid, origin);
      } else {
        scratch = build_record(to_create.at(in.entry.pid), in.entry.pid, origin);
      }
      load_into(*scratch, in.archive, in.entry);
      if (!in.live) in.created = std::move(scratch);
    } catch (...) {
      throw Error(c10::str("[", origin, "] particle ", in.entry.pid, " from '", dir.string(),
                           "' does not fit: ", describe(std::current_exception())));
    }
  }

  // Everything fits: apply. New particles first (their ids are claimed), then the live
  // ones, each on its own lane.
  for (auto& in : incoming) {
    if (!in.created) continue;
    register_record(std::move(in.created));  // its id was claimed above
    std::erase(claimed, in.entry.pid);
  }
  std::vector<Future<bool>> applied;
  for (int lane = 0; lane < num_lanes(); ++lane) {
    applied.push_back(call_on_lane<bool>(lane, [&, lane] {
      ParticleCache& cache = lanes_[lane]->cache();
      for (auto& in : incoming) {
        if (!in.live || in.lane != lane) continue;
        ParticleRecord& r = *in.live;
        cache.pin(r);
        try {
          load_into(r, in.archive, in.entry);
        } catch (...) {
          cache.unpin(r);
          throw Error(c10::str("[", origin, "] particle ", r.pid, " from '", dir.string(),
                               "' loaded into a scratch copy but not into the particle: ",
                               describe(std::current_exception())));
        }
        r.version.fetch_add(1, std::memory_order_acq_rel);
        cache.unpin(r);
      }
      return true;
    }));
  }
  wait_all(applied);
}

}  // namespace push::detail
