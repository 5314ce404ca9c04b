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

  std::optional<push::detail::StagedFolder> out;   // on the lead rank
  std::optional<push::detail::StagedFolder> save;  // on the lead rank, with --save
};

}  // namespace push::cli
