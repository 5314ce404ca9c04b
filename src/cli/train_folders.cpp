// What push train may replace: a folder holding its marker (.push-train, sealed) and its
// own files only; --out and --save neither inside the other, since each is replaced as a
// whole, and published together.
#include "train_folders.h"

#include <push/core/errors.h>

#include <filesystem>
#include <set>
#include <string>

#include "core/files.h"
#include "core/sealed_text.h"
#include "core/user_text.h"

namespace push::cli {
namespace {

namespace fs = std::filesystem;
constexpr const char* kOutputs = "push train outputs";
constexpr const char* kCheckpoint = "push train checkpoint";

/// The marker push train leaves in every folder it publishes (core/sealed_text.h): its
/// first line names the kind of folder; a checkpoint's adds the checksum of config.json.
/// A folder is push train's to replace only when it holds a valid marker of its kind.
constexpr const char* kMarker = ".push-train";

std::string marker_kind(const fs::path& dir) {
  std::error_code ec;
  if (!fs::is_regular_file(dir / kMarker, ec)) return "";
  try {
    const std::string body = push::detail::unseal(push::detail::read_file(dir / kMarker, nullptr), kMarker);
    return body.substr(0, body.find('\n'));
  } catch (const Error&) {
    return "";
  }
}

/// The first name in `dir` (sorted), to name what a refused folder holds.
std::string first_entry(const fs::path& dir) {
  std::string first;
  for (const auto& entry : fs::directory_iterator(dir)) {
    const std::string name = entry.path().filename().string();
    if (first.empty() || name < first) first = name;
  }
  return push::detail::printable(first);
}

/// What --out may hold to be replaced: push train's marker and its own outputs only.
std::string replaceable_outputs(const fs::path& dir) {
  static const std::set<std::string> ours = {kMarker,    "metrics.json",   "predictions.csv", "band.csv",
                                             "loss.png", "predictive.png", "reliability.png"};
  if (fs::is_empty(dir)) return "";
  if (marker_kind(dir) != kOutputs) {
    return "holds '" + first_entry(dir) +
           "' but was not written by push train (it has no valid .push-train marker; push train replaces --out as "
           "a whole)";
  }
  for (const auto& entry : fs::directory_iterator(dir)) {
    const std::string name = entry.path().filename().string();
    if (!ours.count(name) || !entry.is_regular_file()) {
      return "holds '" + name + "', which push train does not write (it replaces --out as a whole)";
    }
  }
  return "";
}

/// What --save may replace: an empty folder or a push train checkpoint.
std::string replaceable_checkpoint(const fs::path& dir) {
  if (fs::is_empty(dir)) return "";
  if (marker_kind(dir) != kCheckpoint) {
    return "is not a push train checkpoint (it holds '" + first_entry(dir) + "' but no valid .push-train marker)";
  }
  for (const auto& entry : fs::directory_iterator(dir)) {
    const std::string name = entry.path().filename().string();
    const bool ours = (name == kMarker || name == "config.json") ? entry.is_regular_file()
                                                                 : name == "checkpoint" && entry.is_directory();
    if (!ours) return "is not a push train checkpoint (it holds '" + name + "')";
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
  out->write(kMarker, push::detail::seal(std::string(kOutputs) + "\n"));
  if (save) {
    push::detail::StagedFolder::publish_together(*save, *out);
  } else {
    out->publish();
  }
}

void write_checkpoint_config(const push::detail::StagedFolder& save, const std::string& config) {
  save.write("config.json", config);
  save.write(kMarker, push::detail::seal(c10::str(kCheckpoint, "\nconfig.json ", push::detail::crc_hex(config), "\n")));
}

std::string read_checkpoint_config(const std::string& dir) {
  const fs::path d(dir);
  PUSH_CHECK(fs::is_directory(d), "push train", "no checkpoint to resume at '", dir, "'");
  PUSH_CHECK(marker_kind(d) == kCheckpoint, "push train", "'", dir,
             "' is not a push train checkpoint, or its marker was changed (no valid .push-train)");
  const std::string body = push::detail::unseal(push::detail::read_file(d / kMarker, nullptr), kMarker);
  PUSH_CHECK(fs::exists(d / "config.json"), "push train", "cannot resume from '", dir, "': it has no config.json");
  const std::string config = push::detail::read_file(d / "config.json", "push train");
  PUSH_CHECK(body.find("\nconfig.json " + push::detail::crc_hex(config) + "\n") != std::string::npos, "push train",
             "cannot resume from '", dir, "': its config.json fails its checksum (it changed after it was saved)");
  return config;
}

}  // namespace push::cli
