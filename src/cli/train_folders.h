#pragma once
// Where push train's results go: --out (the report) and --save (the checkpoint), checked
// and staged before training, so that a folder push train may not replace, or cannot
// write, stops the run before any epoch is spent (core/staged_folder.h).
#include <optional>

#include "core/staged_folder.h"
#include "train_config.h"

namespace push::cli {

class TrainFolders {
 public:
  /// Checks that --save and --out do not overlap and, on the rank that writes (`lead`),
  /// that each is new, empty or what push train wrote there before; stages them.
  /// push::Error "[push train] ..." naming the folder and the reason otherwise.
  TrainFolders(const TrainConfig& c, bool lead);

  /// Marks --out as push train's and publishes it, with --save, together: both or neither
  /// (core/staged_folder.h's publish_together).
  void publish();

  std::optional<push::detail::StagedFolder> out;   // on the lead rank
  std::optional<push::detail::StagedFolder> save;  // on the lead rank, with --save
};

/// Writes `config` as the checkpoint's config.json, and the marker that covers it.
void write_checkpoint_config(const push::detail::StagedFolder& save, const std::string& config);
/// The config.json of the checkpoint at `dir`, checked against its marker: push::Error
/// "[push train] ..." when `dir` is not a checkpoint of push train or the file changed.
std::string read_checkpoint_config(const std::string& dir);

}  // namespace push::cli
