// Loading push train's data.
#include "train_data.h"

#include <tuple>

#include "core/crc32c.h"
#include "core/user_text.h"
#include "stopwatch.h"
#include "train_data_handoff.h"

namespace push::cli {
namespace {

/// CRC-32C of the rows as trained and tested (after --limit), shapes included: another
/// file, an edited row or another split give another fingerprint.
std::string fingerprint(const TrainData& d) {
  uint32_t crc = 0;
  for (const auto* t : {&d.train_raw.x, &d.train_raw.y, &d.test_raw.x, &d.test_raw.y}) {
    const auto dense = t->contiguous();
    const auto sizes = dense.sizes().vec();
    crc = push::detail::crc32c(sizes.data(), sizes.size() * sizeof(int64_t), crc);
    crc = push::detail::crc32c(dense.data_ptr(), dense.numel() * dense.element_size(), crc);
  }
  return push::detail::crc32c_hex(crc);
}

}  // namespace

TrainData load_train_data(TrainConfig& c) {
  TrainData d;
  // An empty value is a mistake (an unset shell variable), not "the default column".
  PUSH_CHECK(!c.given.count("--target") || !c.target.empty(), "push train",
             "--target is empty: name the target column, or leave --target out for the last column");
  data::CsvOptions csv;
  csv.target = c.target;
  if (!c.task.empty()) csv.task = data::parse_task(c.task);
  PUSH_CHECK(!c.given.count("--test-fraction") || data::idx_directory(c.data).empty(), "push train",
             "--test-fraction is not for IDX data ('", c.data, "' has its own test set)");
  const Stopwatch load;
  if (auto handed = rows_from_launcher(c)) {
    std::tie(d.train_raw, d.test_raw) = std::move(*handed);  // loaded and checked by push train --nproc
    d.handed_over = true;
  } else {
    std::tie(d.train_raw, d.test_raw) = data::load_split(c.data, csv, c.test_fraction, c.seed);
    if (!c.task.empty()) {
      PUSH_CHECK(data::parse_task(c.task) == d.train_raw.task, "push train", "data set '", c.data, "' is a ",
                 data::to_string(d.train_raw.task), " data set, not ", c.task);
    }
    d.train_raw = data::subsample(d.train_raw, c.limit, c.seed);
    d.test_raw = data::subsample(d.test_raw, c.limit, c.seed + 1);
  }
  d.load_s = load.seconds();
  c.data_fingerprint = fingerprint(d);
  if (!c.likelihood) c.likelihood = d.classify() ? bayes::Likelihood::categorical : bayes::Likelihood::heteroscedastic;
  PUSH_CHECK(!d.classify() || c.likelihood == bayes::Likelihood::categorical, "push train", "--likelihood ",
             bayes::to_string(*c.likelihood), " is for regression; ", c.data, " is a classification data set");
  c.task = data::to_string(d.train_raw.task);

  // A regression target that never changes leaves nothing to learn (and every member
  // "worse than the mean" by rounding alone).
  if (!d.classify() && d.train_raw.size() > 0) {
    const auto y = d.train_raw.y.to(torch::kFloat64);
    PUSH_CHECK((y.max() != y.min()).item<bool>(), "push train", "the target column '",
               push::detail::printable(d.train_raw.target_name), "' of ", push::detail::printable(c.data),
               " has the same value (", y.max().item<double>(),
               ") in every training row: there is nothing to learn; choose another --target");
  }
  d.scaler = data::Standardizer::fit(d.train_raw);
  d.train = d.scaler.apply(d.train_raw);
  d.test = d.scaler.apply(d.test_raw);
  return d;
}

}  // namespace push::cli
