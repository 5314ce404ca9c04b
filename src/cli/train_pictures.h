#pragma once
// push train's pictures, rendered with gnuplot (gnuplot.h): the loss curve, and the
// reliability diagram (classification) or the predictive band (1-D regression).
#include <push/bayes.h>

#include <optional>
#include <string>
#include <vector>

#include "core/staged_folder.h"
#include "train_config.h"
#include "train_report.h"

namespace push::cli {

/// The raw inputs of the predictive-band picture (1-D regression: a grid wider than the
/// data), or nothing when the run has no such picture.
std::optional<torch::Tensor> band_grid(const data::Dataset& train_raw);

/// Renders the run's pictures into `out` (loss curve; reliability diagram or, for 1-D
/// regression, the predictive band at `grid`, predicted as `band`); returns the names of
/// those written. gnuplot missing or failing skips a picture with a warning; a failed
/// write is an error.
std::vector<std::string> write_pictures(const push::detail::StagedFolder& out, const TrainConfig& c,
                                        const Evaluation& e, const bayes::Infer& infer, const data::Dataset& train_raw,
                                        const data::Standardizer& scaler, const std::optional<torch::Tensor>& grid,
                                        const std::optional<bayes::Predictive>& band);

}  // namespace push::cli
