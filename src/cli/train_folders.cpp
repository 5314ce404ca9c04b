// What push train may replace: --out holding its own outputs only, --save holding a
// checkpoint; neither inside the other, since each is replaced as a whole.
#include "train_folders.h"

#include <push/core/errors.h>

#include <filesystem>
#include <set>
#include <string>

#include "core/files.h"

namespace push::cli {
namespace {

namespace fs = std::filesystem;

/// What --out may hold to be replaced: nothing but push train's own outputs.
std::string replaceable_outputs(const fs::path& dir) {
  static const std::set<std::string> ours = {"metrics.json", "predictions.csv", "band.csv",
                                             "loss.png",     "predictive.png",  "reliability.png"};
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
  bool empty = true, has_config = false;
  for (const auto& entry : fs::directory_iterator(dir)) {
    const std::string name = entry.path().filename().string();
    empty = false;
    if (name == "config.json" && entry.is_regular_file()) {
      has_config = true;
    } else if (!(name == "checkpoint" && entry.is_directory())) {
      return "is not a push train checkpoint (it holds '" + name + "')";
    }
  }
  if (!empty && !has_config) return "is not a push train checkpoint (it has no config.json)";
  return "";
}

}  // namespace

TrainFolders::TrainFolders(const TrainConfig& c, bool lead) {
  using push::detail::resolve_path;
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

}  // namespace push::cli
