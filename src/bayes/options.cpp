#include <push/bayes/options.h>

#include <push/core/errors.h>

namespace push::bayes {

const char* to_string(Likelihood likelihood) {
  switch (likelihood) {
    case Likelihood::gaussian:
      return "gaussian";
    case Likelihood::heteroscedastic:
      return "heteroscedastic";
    case Likelihood::categorical:
      return "categorical";
    case Likelihood::learned_noise:
      return "learned-noise";
  }
  return "?";
}

int64_t output_units(Likelihood likelihood, int64_t n) { return likelihood == Likelihood::heteroscedastic ? 2 * n : n; }

const char* to_string(DataParallelMode mode) {
  switch (mode) {
    case DataParallelMode::blocking:
      return "blocking";
    case DataParallelMode::nonblocking:
      return "nonblocking";
    case DataParallelMode::daso:
      return "daso";
  }
  return "?";
}

DataParallelMode parse_data_parallel_mode(const std::string& text) {
  if (text == "blocking") return DataParallelMode::blocking;
  if (text == "nonblocking") return DataParallelMode::nonblocking;
  if (text == "daso") return DataParallelMode::daso;
  throw Error(c10::str("[push::bayes] unknown data-parallel mode '", text, "' (blocking, nonblocking or daso)"));
}

}  // namespace push::bayes
