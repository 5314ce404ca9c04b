#pragma once
// push train's command line: the option table that fills a TrainConfig, and --help.
#include <optional>

#include "train_config.h"

namespace push::cli {

/// Fills `c` from the command line. Returns the exit status when the run ends here: 0
/// after printing --help, 2 after a one-line usage error on stderr.
std::optional<int> parse_train_command_line(int argc, char** argv, TrainConfig& c);

}  // namespace push::cli
