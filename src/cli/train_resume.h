#pragma once
// --resume: a run continues a checkpoint only with the settings it was trained with.
#include "train_config.h"

namespace push::cli {

/// Settles MultiSWAG's default pre-training in `c` (half of --epochs of the run that
/// starts training; with --resume, the checkpoint's) and the default --lr-schedule (cosine,
/// mswag constant; with --resume, the checkpoint's) and, with --resume, checks the
/// checkpoint's config.json (its checksum, train_folders.h): --epochs at least the epochs
/// it has trained, and every setting of TrainConfig::identity() the same, the data's
/// fingerprint too unless --allow-data-change. push::Error "[push train] cannot resume
/// from 'DIR': it was trained with KEY=..., this run has KEY=..." otherwise.
void match_checkpoint(TrainConfig& c);

}  // namespace push::cli
