#pragma once
// push train's algorithms as a type, and the one table of which option applies to which:
// the command line parses --algo once into an Algo, --help prefixes each such option's
// text with its algorithms, check_options_apply refuses one given for another, and
// docs/cli.md's "Per algorithm" table is checked against --help
// (Cli.TheOptionReferenceNamesExactlyTheToolsOptions).
#include <string>
#include <vector>

#include "train_choices.h"

namespace push::cli {

enum class Algo { ensemble, mswag, svgd, mcdropout, sgld, sghmc, laplace };
/// --lr-schedule.
enum class LrSchedule { cosine, constant };
const char* to_string(LrSchedule schedule);

/// The name --algo takes, metrics.json and checkpoints record.
const char* to_string(Algo algo);
/// Every algorithm, in --help's order.
const std::vector<Algo>& every_algo();
/// sgld and sghmc: each particle one chain.
inline bool is_sgmcmc(Algo algo) { return algo == Algo::sgld || algo == Algo::sghmc; }

/// An option that applies to some algorithms only.
struct AlgoOption {
  const char* option;       // "--rank"
  std::vector<Algo> algos;  // in --help's order
};

/// The table.
const std::vector<AlgoOption>& algo_options();
/// The algorithms `option` applies to; every algorithm for an option not in the table.
std::vector<Algo> algos_of(const std::string& option);

}  // namespace push::cli
