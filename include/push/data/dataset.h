#pragma once
// Data sets for the Bayesian algorithms and the `push train` command.
//
//   auto all = push::data::load("iris");                  // built-in, or a CSV path,
//   auto [train, test] = push::data::split(all, 0.2, 7);   // or an IDX directory
//   auto scaler = push::data::Standardizer::fit(train);    // training-set statistics
//   train = scaler.apply(train);  test = scaler.apply(test);
//
// Every loader throws push::Error with a one-line message naming the file, line and
// column of the problem (a missing file, a non-numeric cell, NaN or Inf, a value beyond
// float32's range, an unknown target column, an IDX file shorter or longer than its
// header says).
#include <torch/types.h>

#include <push/core/errors.h>

#include <filesystem>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace push::data {

enum class Task { regression, classification };
const char* to_string(Task task);
/// "regression" or "classification"; throws push::Error otherwise.
Task parse_task(const std::string& text);

/// Inputs and targets. Regression: y is floating [N, outputs] (CSV data: float64, the
/// cells as parsed; built-in synthetic and image data: float32). Classification: y is int64
/// [N] with classes 0..num_classes-1 (class k stands for the label class_labels[k] of the
/// file). Images: x is [N, C, H, W], otherwise [N, features]. x and y hold finite values.
struct Dataset {
  std::string name;
  Task task = Task::regression;
  torch::Tensor x, y;
  std::vector<std::string> feature_names;
  std::string target_name;
  int64_t num_classes = 0;  // classification only
  /// Classification: the label in the source data of each class, ascending (a CSV target
  /// column of {0, 7} gives classes 0, 1 and class_labels {0, 7}).
  std::vector<double> class_labels;
  int64_t size() const { return x.defined() ? x.size(0) : 0; }
  /// Shape of one input ({features} or {C, H, W}).
  std::vector<int64_t> input_shape() const;
  /// The rows `index` (int64) of this data set.
  Dataset subset(const torch::Tensor& index) const;
};

struct CsvOptions {
  /// Target column by name; empty: the last column.
  std::string target;
  /// Task; unset: regression.
  std::optional<Task> task;
};

/// A CSV file with a header row of column names and numeric cells only.
Dataset load_csv(const std::filesystem::path& path, const CsvOptions& options = {});

/// Fashion-MNIST style IDX directory (train-images-idx3-ubyte, ...), train or test part,
/// pixels scaled to [0, 1]. Each file's size must match its header, and the image and
/// label counts must agree.
Dataset load_idx(const std::filesystem::path& dir, bool train);

/// Synthetic 1-D regression: y = sin(x) + noise · ε with ε ~ N(0, 1), the first half of
/// the points with x uniform in [-4, -1.5), the second half uniform in [1.5, 4). The gap
/// (-1.5, 1.5) holds no data: there a good posterior is uncertain.
Dataset synthetic_gap(int64_t points, uint64_t seed, double noise = 0.1);

/// Names of the built-in data sets.
std::vector<std::string> builtin_names();
/// The directory `scripts/fetch-data` fills: $PUSH_DATA_DIR, else
/// ${XDG_CACHE_HOME:-$HOME/.cache}/push/data.
std::filesystem::path data_dir();

/// A built-in name ("sine-gap", "iris", "fashion-mnist", ...), a CSV path or an IDX
/// directory (its training part).
Dataset load(const std::string& spec, const CsvOptions& options = {}, uint64_t seed = 0);

/// A seeded random split: (train, test) with round(fraction * N) test rows.
std::pair<Dataset, Dataset> split(const Dataset& all, double test_fraction, uint64_t seed);

/// The IDX directory `spec` names (fashion-mnist's, or `spec` itself), or an empty path
/// for other data. IDX data keeps its own test set.
std::filesystem::path idx_directory(const std::string& spec);

/// (train, test) of `spec`: IDX data (fashion-mnist, an IDX directory) keeps its own
/// test set; everything else is load() then split().
std::pair<Dataset, Dataset> load_split(const std::string& spec, const CsvOptions& options, double test_fraction,
                                       uint64_t seed);

/// At most `rows` rows of `d`, drawn without replacement by `seed` (all rows if fewer).
Dataset subsample(const Dataset& d, int64_t rows, uint64_t seed);

/// Per-column standardisation with statistics of the set it was fit on, computed in
/// double; what it gives the networks is float32. Regression targets are standardised too;
/// predictions are mapped back with unscale_* (in double, on the CPU). fit() throws
/// push::Error naming a column whose spread is lost to rounding (1e9 + 1e-4·k) or
/// overflows; a constant column becomes zeros.
struct Standardizer {
  torch::Tensor x_mean, x_std, y_mean, y_std;  // float64; y_* undefined for classification
  bool images = false;                         // images: one mean/std over all pixels
  static Standardizer fit(const Dataset& train);
  Dataset apply(const Dataset& d) const;
  /// Inputs `x` (in the data's units) as the networks see them: float32.
  torch::Tensor scale_x(const torch::Tensor& x) const;
  torch::Tensor unscale_mean(const torch::Tensor& mean) const;
  torch::Tensor unscale_variance(const torch::Tensor& variance) const;
};

}  // namespace push::data
