#pragma once
// push::data: the data sets of push train (built-in, CSV, IDX), splits and standardising.
//   auto [train, test] = push::data::load_split("iris", {}, 0.2, /*seed=*/0);
#include <push/data/dataset.h>
