// The checkpoint format: files, manifest, checks (checkpoint_format.h describes it).
#include "runtime/checkpoint_format.h"

#include <torch/torch.h>

#include <fcntl.h>
#include <unistd.h>

#include <cstring>
#include <iomanip>
#include <map>
#include <set>
#include <sstream>

#include "core/crc32c.h"
#include "core/files.h"
#include "core/sealed_text.h"
#include "core/user_text.h"

namespace push::detail {
namespace fs = std::filesystem;
namespace checkpoint {

namespace {
constexpr const char* kMagic = "push-checkpoint";
constexpr int kFormat = 2;

/// The manifest of a folder written by this build (or an earlier one of format 2).
std::string checked_manifest_body(const fs::path& dir) {
  const std::string text = read_file(dir / kManifest, nullptr);
  std::istringstream in(text);
  std::string magic;
  int format = 0;
  if (!(in >> magic >> format) || magic != kMagic) {
    throw Error(c10::str(kManifest, " does not start with '", kMagic, "'"));
  }
  if (format != kFormat) {
    throw Error(c10::str(kManifest, " has format ", format, "; this build reads format ", kFormat));
  }
  return unseal(text, kManifest);
}

}  // namespace

std::string replaceable(const fs::path& dir) {
  // The folder is replaced as a whole: never one that holds something else. A push
  // checkpoint is known by its manifest, checked (a file merely named so is not one), and
  // holds nothing but the manifest and the particle files it lists, as they were saved: a
  // file of the user's named like a particle's, or a particle file overwritten, is named.
  std::error_code ec;
  if (fs::is_empty(dir, ec)) return "";
  std::vector<ManifestEntry> entries;
  try {
    if (!fs::exists(dir / kManifest, ec)) return "holds something other than a push checkpoint";
    entries = read_manifest(dir);
  } catch (const Error&) {
    return "holds something other than a push checkpoint";
  }
  std::map<std::string, const ManifestEntry*> listed;
  for (const auto& e : entries) listed[particle_file(dir, e.pid).filename().string()] = &e;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    const bool file = it->symlink_status().type() == fs::file_type::regular;
    const auto found = listed.find(name);
    if (name == kManifest && file) continue;
    if (found == listed.end() || !file) {
      return c10::str("is a push checkpoint that also holds '", printable(name), "', which push did not write there");
    }
    try {
      particle_bytes(dir, *found->second);
    } catch (const Error& e) {
      return c10::str("is a push checkpoint whose ", e.what(), "; push did not write it so");
    }
  }
  if (ec) return c10::str("cannot be listed: ", ec.message());
  return "";
}

std::string particle_bytes(const fs::path& dir, const ManifestEntry& e) {
  const fs::path path = particle_file(dir, e.pid);
  const std::string name = path.filename().string();
  if (!fs::exists(path)) throw Error(c10::str("missing ", name));
  std::string bytes = read_file(path, nullptr);
  if (bytes.size() != e.bytes) {
    throw Error(c10::str(name, " has ", bytes.size(), " bytes but ", e.bytes, " were saved (truncated or replaced)"));
  }
  const uint32_t crc = crc32c(bytes.data(), bytes.size());
  if (crc != e.crc) {
    throw Error(c10::str(name, " fails its checksum (crc32c ", crc32c_hex(crc), ", saved ", crc32c_hex(e.crc),
                         "): its bytes changed after it was saved"));
  }
  return bytes;
}

fs::path particle_file(const fs::path& dir, Pid pid) { return dir / ("particle-" + std::to_string(pid) + ".pt"); }

// The manifest's text: everything up to "end" is covered by the checksum after it.
std::string manifest_text(const std::vector<ManifestEntry>& entries) {
  std::ostringstream body;
  body << kMagic << ' ' << kFormat << "\nparticles " << entries.size() << '\n';
  for (const auto& e : entries) {
    body << e.pid << ' ' << e.lane << ' ' << e.scheduler_steps << ' ' << e.bytes << ' ' << crc32c_hex(e.crc) << '\n';
  }
  return seal(body.str());
}

std::vector<ManifestEntry> read_manifest(const fs::path& dir) {
  if (!fs::exists(dir / kManifest)) throw Error(c10::str("missing ", kManifest));
  std::istringstream in(checked_manifest_body(dir));
  std::string magic, word;
  int format = 0;
  int64_t count = -1;
  in >> magic >> format;
  if (!(in >> word >> count) || word != "particles" || count < 0) {
    throw Error(c10::str(kManifest, " has no valid particle count"));
  }
  std::vector<ManifestEntry> entries;
  std::set<Pid> seen;
  for (int64_t i = 0; i < count; ++i) {
    ManifestEntry e;
    if (!(in >> e.pid >> e.lane >> e.scheduler_steps >> e.bytes >> std::hex >> e.crc >> std::dec) || e.pid < 0 ||
        e.lane < 0 || e.scheduler_steps < 0) {
      throw Error(c10::str(kManifest, " line ", i + 3, " is not '<pid> <lane> <steps> <bytes> <crc32c>'"));
    }
    if (!seen.insert(e.pid).second) {
      throw Error(c10::str(kManifest, " lists particle ", e.pid, " twice"));
    }
    entries.push_back(e);
  }
  if (in >> word) throw Error(c10::str(kManifest, " has more lines than its ", count, " particles"));
  return entries;
}

// Writes `archive` to `path` through our own checked writes (LibTorch's file writer
// reports a failed write by throwing from a destructor), recording size and CRC-32C.
void write_particle(torch::serialize::OutputArchive& archive, const fs::path& path, ManifestEntry& entry) {
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
    if (error == 0) error = write_full(fd, p, size);
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
torch::serialize::InputArchive open_particle(const fs::path& dir, const ManifestEntry& e, const torch::Device& device) {
  const std::string name = particle_file(dir, e.pid).filename().string();
  const std::string bytes = particle_bytes(dir, e);
  torch::serialize::InputArchive archive;
  try {
    archive.load_from(bytes.data(), bytes.size(), device);
  } catch (...) {
    throw Error(c10::str(name, " is unreadable: ", describe(std::current_exception())));
  }
  c10::IValue saved_pid;
  if (!archive.try_read("push.pid", saved_pid) || !saved_pid.isInt() || saved_pid.toInt() != e.pid) {
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
namespace {
// The learning rate of each of the first `groups` parameter groups in a saved optimizer
// (LibTorch writes each group's options under param_groups/param_groups/<i>/options; an
// option type without an "lr" gives nothing for its group). The saved group count is the
// file's word: it is read no further than the groups here.
std::vector<std::optional<double>> saved_learning_rates(torch::serialize::InputArchive& optimizer_archive,
                                                        size_t groups_here) {
  std::vector<std::optional<double>> out;
  torch::serialize::InputArchive groups;
  if (!optimizer_archive.try_read("param_groups", groups)) return out;
  torch::Tensor size;
  if (!groups.try_read("param_groups/size", size)) return out;
  const int64_t n = std::min<int64_t>(size.numel() == 1 ? size.item<int64_t>() : 0, static_cast<int64_t>(groups_here));
  for (int64_t i = 0; i < n; ++i) {
    torch::serialize::InputArchive group, options;
    c10::IValue lr;
    const bool found = groups.try_read(c10::str("param_groups/", i), group) && group.try_read("options", options) &&
                       options.try_read("lr", lr) && lr.isDouble();
    out.push_back(found ? std::optional<double>(lr.toDouble()) : std::nullopt);
  }
  return out;
}
}  // namespace

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
                           " in the checkpoint but ", want.dtype, c10::IntArrayRef(want.sizes), " here"));
    }
  }
  torch::serialize::InputArchive optimizer_archive;
  const bool has_optimizer = archive.try_read("optimizer", optimizer_archive);
  if (has_optimizer != (r.optimizer != nullptr)) {
    throw Error(has_optimizer ? "it was saved with an optimizer but has none here"
                              : "it has an optimizer here but was saved without one");
  }
  std::vector<std::optional<double>> lrs;
  if (r.optimizer) {
    lrs = saved_learning_rates(optimizer_archive, r.optimizer->param_groups().size());
  }
  if (r.make_scheduler) {
    // A LibTorch scheduler's only state is its step count: replay it on a fresh one; the
    // optimizer's saved learning rates are set right after.
    r.scheduler = r.make_scheduler(*r.optimizer);
    for (int64_t i = 0; i < e.scheduler_steps; ++i) r.scheduler->step();
  }
  r.scheduler_steps = e.scheduler_steps;
  if (r.optimizer) {
    // LibTorch's Optimizer::load replaces the per-parameter state it finds in the archive
    // and keeps the rest, and reads the groups' options without applying them: a particle
    // that trained on past the checkpoint would keep moments and learning rates it has
    // no business having.
    r.optimizer->state().clear();
    try {
      r.optimizer->load(optimizer_archive);
    } catch (...) {
      // LibTorch reports a state of another optimizer type as an internal assert.
      throw Error(c10::str("its saved optimizer state does not fit its ", c10::demangle(typeid(*r.optimizer).name()),
                           " here (", describe(std::current_exception()), ")"));
    }
    // Optimizer::load has checked that the groups match in number.
    for (size_t g = 0; g < lrs.size() && g < r.optimizer->param_groups().size(); ++g) {
      if (lrs[g]) r.optimizer->param_groups()[g].options().set_lr(*lrs[g]);
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

}  // namespace checkpoint

}  // namespace push::detail
