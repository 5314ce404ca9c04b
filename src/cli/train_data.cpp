// Loading push train's data.
#include "train_data.h"

#include <tuple>

#include "stopwatch.h"

namespace push::cli {

TrainData load_train_data(TrainConfig& c) {
  TrainData d;
  data::CsvOptions csv;
  csv.target = c.target;
  if (!c.task.empty()) csv.task = data::parse_task(c.task);
  const Stopwatch load;
  std::tie(d.train_raw, d.test_raw) = data::load_split(c.data, csv, c.test_fraction, c.seed);
  if (!c.task.empty()) {
    PUSH_CHECK(data::parse_task(c.task) == d.train_raw.task, "push train", "data set '", c.data, "' is a ",
               data::to_string(d.train_raw.task), " data set, not ", c.task);
  }
  d.train_raw = data::subsample(d.train_raw, c.limit, c.seed);
  d.test_raw = data::subsample(d.test_raw, c.limit, c.seed + 1);
  d.load_s = load.seconds();
  if (c.likelihood.empty()) c.likelihood = d.classify() ? "categorical" : "heteroscedastic";
  PUSH_CHECK(!d.classify() || c.likelihood == "categorical", "push train", "--likelihood ", c.likelihood,
             " is for regression; ", c.data, " is a classification data set");
  c.task = data::to_string(d.train_raw.task);

  d.scaler = data::Standardizer::fit(d.train_raw);
  d.train = d.scaler.apply(d.train_raw);
  d.test = d.scaler.apply(d.test_raw);
  return d;
}

}  // namespace push::cli
