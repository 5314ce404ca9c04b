#pragma once
// push train --nproc loads its data once. The process that starts the ranks loads and
// checks it (it must: whatever would fail on every rank fails there first, as one line),
// then hands the loaded rows to its ranks in a sealed memfd: an anonymous file that only
// the processes it starts inherit, and that nothing can change once sealed. The ranks
// find it by PUSH_TRAIN_DATA_FD and read it instead of loading --data again, when it was
// loaded for their own --data, --target, --task, --test-fraction, --limit and --seed.
// A rank started any other way (push launch, torchrun, mpirun, srun) loads --data itself.
#include <push/data.h>

#include <optional>
#include <utility>

#include "train_config.h"

namespace push::cli {

/// The rows of a run as loaded: the training and the test split, after --limit.
using LoadedRows = std::pair<data::Dataset, data::Dataset>;

/// Hands `rows`, loaded for `c`, to the ranks this process starts from now on (sets
/// PUSH_TRAIN_DATA_FD). Throws push::Error when no memfd can be made.
void hand_rows_to_ranks(const TrainConfig& c, const LoadedRows& rows);

/// The rows the process that started this rank handed over for `c`; nothing when none were
/// handed over, or not for these options (then this rank loads --data itself). Throws
/// push::Error when the handed-over file is not what push train wrote.
std::optional<LoadedRows> rows_from_launcher(const TrainConfig& c);

}  // namespace push::cli
