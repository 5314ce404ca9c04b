// push train's algorithms and the table of the options that apply to some of them.
#include "train_algorithms.h"

#include <algorithm>
#include <utility>

namespace push::cli {

namespace {

/// Every algorithm and its name, in --help's order: the one list to_string and every_algo read.
constexpr std::pair<Algo, const char*> kAlgoNames[] = {
    {Algo::ensemble, "ensemble"}, {Algo::mswag, "mswag"}, {Algo::svgd, "svgd"},       {Algo::mcdropout, "mcdropout"},
    {Algo::sgld, "sgld"},         {Algo::sghmc, "sghmc"}, {Algo::laplace, "laplace"},
};

}  // namespace

const char* to_string(Algo algo) {
  for (const auto& [value, name] : kAlgoNames) {
    if (value == algo) return name;
  }
  return "?";
}

const char* to_string(LrSchedule schedule) { return schedule == LrSchedule::cosine ? "cosine" : "constant"; }

const std::vector<Algo>& every_algo() {
  static const std::vector<Algo> every = [] {
    std::vector<Algo> all;
    for (const auto& [value, name] : kAlgoNames) all.push_back(value);
    return all;
  }();
  return every;
}

const std::vector<AlgoOption>& algo_options() {
  using enum Algo;
  static const std::vector<AlgoOption> table = {
      {"--bootstrap", {ensemble, laplace}},
      {"--laplace", {ensemble, laplace}},
      {"--laplace-structure", {laplace}},
      {"--laplace-predictive", {laplace}},
      {"--laplace-prior-precision", {laplace}},
      {"--bandwidth", {svgd}},
      {"--rank", {mswag}},
      {"--pretrain-epochs", {mswag}},
      {"--swag-lr", {mswag}},
      {"--collect-every", {mswag}},
      {"--samples", {mswag, mcdropout, sgld, sghmc, laplace}},
      {"--dropout", {mcdropout}},
      {"--friction", {sghmc}},
      {"--preconditioned", {sgld}},
      {"--no-preconditioned", {sgld}},
      {"--cycles", {sgld, sghmc}},
      {"--burn-in", {sgld, sghmc}},
      {"--thin", {sgld, sghmc}},
      {"--lr-schedule", {ensemble, mswag, svgd, mcdropout, laplace}},
  };
  return table;
}

std::vector<Algo> algos_of(const std::string& option) {
  const auto& table = algo_options();
  const auto it = std::find_if(table.begin(), table.end(), [&](const AlgoOption& o) { return option == o.option; });
  if (it != table.end()) return it->algos;
  return every_algo();
}

}  // namespace push::cli
