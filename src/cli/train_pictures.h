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

/// The predictive band at `grid` (raw inputs), predicted as `band`, in the data's units:
/// [G, 4] doubles, each row x, predictive mean, σ and epistemic σ (the members'
/// disagreement: the variance less its aleatoric part).
torch::Tensor band_table(const torch::Tensor& grid, const bayes::Predictive& band, const data::Standardizer& scaler);
/// band.csv: the table with a header row.
std::string band_csv(const torch::Tensor& table);

/// Renders the run's pictures into `out` (loss curve; reliability diagram or, for 1-D
/// regression, the predictive band `band`, a band_table); returns the names of those
/// written. gnuplot missing or failing skips a picture with a warning; a failed write is
/// an error.
std::vector<std::string> write_pictures(const push::detail::StagedFolder& out, const TrainConfig& c,
                                        const Evaluation& e, const bayes::Infer& infer, const data::Dataset& train_raw,
                                        const std::optional<torch::Tensor>& band);

}  // namespace push::cli
