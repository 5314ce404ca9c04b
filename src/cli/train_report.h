#pragma once
// What `push train` reports about a trained distribution: the test metrics (checked
// finite), predictions.csv, metrics.json and the table on stdout. The pictures are
// train_pictures.h.
#include <push/bayes.h>

#include <nlohmann/json.hpp>

#include <filesystem>
#include <string>
#include <utility>
#include <vector>

#include "train_config.h"
#include "train_data.h"

namespace push::cli {

struct Evaluation {
  std::vector<std::pair<std::string, double>> table;  // printed on stdout
  nlohmann::ordered_json metrics;                     // metrics.json's "metrics"
  std::string predictions_csv;
  std::string reliability_data;  // classification: "center accuracy confidence count" per bin
};

/// Seconds spent on each part of the run: metrics.json's "timings".
struct Timings {
  double load_s = 0, train_s = 0, predict_s = 0, total_s = 0;
};

/// The test metrics of `pred` (on `test`, standardised like the training data; `test_raw`
/// in the data's own units and labels). Throws push::Error when a metric is not finite:
/// a diverged run has no result to publish.
Evaluation evaluate(const bayes::Predictive& pred, const data::Dataset& test_raw, const data::Dataset& test,
                    const data::Standardizer& scaler, const std::vector<double>& losses);

/// metrics.json: the configuration, how the run ran (on `ranks` ranks), the data, the
/// metrics, the loss curve, the timings and the names of the `pictures` written.
nlohmann::ordered_json metrics_document(const TrainConfig& c, bayes::Infer& infer, int ranks, const TrainData& d,
                                        const Evaluation& e, const Timings& t,
                                        const std::vector<std::string>& pictures);

/// The table on stdout: what ran on which data, the test metrics, the training time and
/// where the outputs are.
void print_summary(const TrainConfig& c, const bayes::Infer& infer, const TrainData& d, const Evaluation& e,
                   double train_s, const std::filesystem::path& out);

/// `t` in float64 on the CPU, to be read element by element.
torch::Tensor cpu_double(const torch::Tensor& t);
/// A number as push train's CSV files write it (8 significant digits).
std::string number(double v);

}  // namespace push::cli
