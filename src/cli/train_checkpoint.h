#pragma once
// push train's checkpoint (--save), written by every rank: without --data-parallel each
// rank writes its own particles into rank 0's staging folder; data-parallel ranks hold the
// same particles, so rank 0 writes them alone.
#include <push/bayes.h>

#include <exception>
#include <optional>

#include "core/staged_folder.h"
#include "train_config.h"
#include "train_ranks.h"

namespace push::cli {

/// Rank 0 first tells the other ranks whether its report succeeded (`report_failed`: its
/// error, rethrown here once they know, so that they stop with status 1 and it reports
/// why) and where its staging folder `save` is. Then every rank writes, with --save, its
/// part of the checkpoint (rank 0 adds config.json). Returns the exit status of a rank
/// other than 0, whose run ends here; nothing on rank 0, which goes on to publish.
std::optional<int> save_checkpoint(const TrainConfig& c, bayes::Infer& infer, const TrainRanks& ranks,
                                   const std::optional<push::detail::StagedFolder>& save,
                                   std::exception_ptr report_failed);

}  // namespace push::cli
