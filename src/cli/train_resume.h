#pragma once
// --resume: a run continues a checkpoint only with the settings it was trained with.
#include "train_config.h"

namespace push::cli {

/// Settles MultiSWAG's default pre-training in `c` (half of --epochs of the run that
/// starts training; with --resume, the checkpoint's) and the default --lr-schedule (cosine,
/// mswag constant; with --resume, the checkpoint's: constant for one written before the
/// option) and, with --resume, checks that every
/// setting of TrainConfig::identity() matches the checkpoint's config.json. push::Error
/// "[push train] cannot resume from 'DIR': it was trained with KEY=..., this run has KEY=...".
void match_checkpoint(TrainConfig& c);

}  // namespace push::cli
