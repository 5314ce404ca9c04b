// What push train may replace: a folder holding its marker (.push-train, sealed) and its
// own files only; --out and --save neither inside the other, since each is replaced as a
// whole, and published together.
#include "train_folders.h"

#include <push/core/errors.h>

#include <algorithm>
#include <filesystem>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "core/files.h"
#include "core/sealed_text.h"
#include "core/user_text.h"
#include "runtime/checkpoint_format.h"
#include "train_marker.h"

namespace push::cli {
namespace {

namespace fs = std::filesystem;

/// The folder of a push train checkpoint that Push::save writes (its manifest and files).
constexpr const char* kParticles = "checkpoint/particles";

/// The first name in `dir` (sorted), to name what a refused folder holds.
std::string first_entry(const fs::path& dir) {
  std::string first;
  for (const auto& entry : fs::directory_iterator(dir)) {
    const std::string name = entry.path().filename().string();
    if (first.empty() || name < first) first = name;
  }
  return push::detail::printable(first);
}

/// What --out may hold to be replaced: push train's marker and the files it lists, as it
/// wrote them.
std::string replaceable_outputs(const fs::path& dir) {
  if (fs::is_empty(dir)) return "";
  const auto marker = read_marker(dir);
  if (marker && marker->kind != kOutputsKind) {
    return "is not push train's outputs but a checkpoint (its .push-train marker says '" +
           push::detail::printable(marker->kind) + "'): name another folder for --out";
  }
  if (!marker) {
    return "holds '" + first_entry(dir) +
           "' but was not written by push train (it has no valid .push-train marker; push train replaces --out as "
           "a whole)";
  }
  for (const auto& entry : fs::directory_iterator(dir)) {
    const std::string name = entry.path().filename().string();
    if (name != kMarkerName && !marker->files.count(name)) {
      return "holds '" + push::detail::printable(name) +
             "', which push train did not write there (it replaces --out as a whole)";
    }
  }
  const std::string changed = changed_file(*marker, dir);
  if (!changed.empty()) {
    std::error_code ec;
    const bool removed = !fs::exists(fs::symlink_status(dir / changed, ec));
    return (removed ? "lacks '" : "holds '") + push::detail::printable(changed) + "', " +
           (removed ? "removed" : "changed") + " since push train wrote it (it replaces --out as a whole)";
  }
  return "";
}

/// What --save may replace: an empty folder or a push train checkpoint holding nothing
/// push train did not write (at any depth), every file as it was written: the files its
/// marker lists by their checksums, the particle files by their manifest's
/// (runtime/checkpoint_format.h), so a file of the user's named like a particle's, or a
/// particle file overwritten, is named and nothing is replaced.
std::string replaceable_checkpoint(const fs::path& dir) {
  if (fs::is_empty(dir)) return "";
  const auto marker = read_marker(dir);
  if (!marker) {
    return "is not a push train checkpoint (it holds '" + first_entry(dir) + "' but no valid .push-train marker)";
  }
  if (marker->kind != kCheckpointKind) {
    return "is not a push train checkpoint but push train's outputs (its .push-train marker says '" +
           push::detail::printable(marker->kind) + "'): name another folder for --save";
  }
  const std::string changed = changed_file(*marker, dir);
  if (!changed.empty()) {
    return "is a push train checkpoint whose '" + push::detail::printable(changed) +
           "' changed since push train wrote it (it replaces --save as a whole)";
  }
  namespace checkpoint = push::detail::checkpoint;
  std::map<std::string, checkpoint::ManifestEntry> particles;  // relative path -> its manifest line
  try {
    for (const auto& e : checkpoint::read_manifest(dir / kParticles)) {
      particles[fs::relative(checkpoint::particle_file(dir / kParticles, e.pid), dir).generic_string()] = e;
    }
  } catch (const Error& e) {
    return "is a push train checkpoint whose particle manifest is unreadable (" + std::string(e.what()) + ")";
  }
  static const std::set<std::string> folders = {"checkpoint", kParticles};
  for (auto it = fs::recursive_directory_iterator(dir); it != fs::recursive_directory_iterator(); ++it) {
    const std::string relative = fs::relative(it->path(), dir).generic_string();
    const auto type = it->symlink_status().type();
    const auto particle = particles.find(relative);
    const bool ours =
        type == fs::file_type::directory
            ? folders.count(relative) > 0
            : type == fs::file_type::regular &&
                  (relative == kMarkerName || marker->files.count(relative) || particle != particles.end());
    if (!ours) {
      return "is a push train checkpoint that also holds '" + push::detail::printable(relative) +
             "', which push train did not write (it replaces --save as a whole)";
    }
    if (particle == particles.end()) continue;
    try {
      checkpoint::particle_bytes(dir / kParticles, particle->second);
    } catch (const Error&) {
      return "is a push train checkpoint whose '" + push::detail::printable(relative) +
             "' changed since push train wrote it (it replaces --save as a whole)";
    }
  }
  return "";
}

}  // namespace

TrainFolders::TrainFolders(const TrainConfig& c, bool lead) {
  using push::detail::resolve_path;
  PUSH_CHECK(!c.out.empty(), "push train", "--out is empty: name the folder for the results");
  PUSH_CHECK(!c.given.count("--save") || !c.save.empty(), "push train",
             "--save is empty: name the checkpoint's folder");
  PUSH_CHECK(!c.given.count("--resume") || !c.resume.empty(), "push train",
             "--resume is empty: name the checkpoint's folder");
  if (!c.save.empty()) {
    PUSH_CHECK(!push::detail::paths_overlap(resolve_path(c.save), resolve_path(c.out)), "push train", "--save '",
               c.save, "' and --out '", c.out,
               "' overlap: push train replaces each folder as a whole, so neither may be or hold the other");
  }
  if (lead) {
    out.emplace(c.out, "push train", "--out", replaceable_outputs);
    if (!c.save.empty()) save.emplace(c.save, "push train", "--save", replaceable_checkpoint);
  }
}

void TrainFolders::publish() {
  std::vector<std::string> files;
  for (const auto& entry : fs::directory_iterator(out->path())) files.push_back(entry.path().filename().string());
  std::sort(files.begin(), files.end());
  out->write(kMarkerName, marker_text(kOutputsKind, out->path(), files));
  if (save) {
    push::detail::StagedFolder::publish_together(*save, *out);
  } else {
    out->publish();
  }
}

void write_checkpoint_config(const push::detail::StagedFolder& save, const std::string& config) {
  save.write("config.json", config);
  save.write(kMarkerName, marker_text(kCheckpointKind, save.path(),
                                      {"config.json", "checkpoint/infer.meta", "checkpoint/particles/push.manifest"}));
}

std::string read_checkpoint_config(const std::string& dir) {
  const fs::path d(dir);
  PUSH_CHECK(fs::is_directory(d), "push train", "no checkpoint to resume at '", dir, "'");
  const auto marker = read_marker(d);
  PUSH_CHECK(marker && marker->kind == kCheckpointKind, "push train", "'", dir,
             "' is not a push train checkpoint, or its marker was changed (no valid .push-train)");
  const std::string changed = changed_file(*marker, d);
  PUSH_CHECK(changed.empty(), "push train", "cannot resume from '", dir, "': its ", changed,
             " fails its checksum (it changed after it was saved, or comes from another checkpoint)");
  return push::detail::read_file(d / "config.json", "push train");
}

}  // namespace push::cli
