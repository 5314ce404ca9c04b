// push train's report: metrics, predictions.csv, metrics.json and the table on stdout.
#include "train_report.h"

#include <push/metrics.h>

#include <cmath>
#include <cstdio>
#include <sstream>

#include "core/user_text.h"

namespace push::cli {
namespace {

using json = nlohmann::ordered_json;

/// The label class k stands for in the data (class_labels), as the data wrote it.
std::string label_of(const data::Dataset& d, int64_t k) {
  if (k < 0 || k >= static_cast<int64_t>(d.class_labels.size())) return std::to_string(k);
  char text[32];
  std::snprintf(text, sizeof(text), "%.17g", d.class_labels[k]);
  return text;
}

/// Names and values that are not finite, "rmse=nan, nll=inf"; empty when all are.
std::string non_finite(const std::vector<std::pair<std::string, double>>& values) {
  std::string bad;
  for (const auto& [name, value] : values) {
    if (!std::isfinite(value)) bad += (bad.empty() ? "" : ", ") + name + "=" + number(value);
  }
  return bad;
}

}  // namespace

std::string number(double v) {
  std::ostringstream s;
  s.precision(8);
  s << v;
  return s.str();
}

torch::Tensor cpu_double(const torch::Tensor& t) { return t.detach().to(torch::kCPU, torch::kFloat64).contiguous(); }

Evaluation evaluate(const bayes::Predictive& pred, const data::Dataset& test_raw, const data::Dataset& test,
                    const data::Standardizer& scaler, const std::vector<double>& losses) {
  Evaluation e;
  std::ostringstream csv;
  std::vector<std::pair<std::string, double>> checked;
  if (test.task == data::Task::classification) {
    auto m = metrics::classification(pred.probs, test.y);
    e.table = {{"accuracy", m.accuracy}, {"nll", m.nll}, {"brier", m.brier}, {"ece (15 bins)", m.ece}};
    e.metrics = {{"accuracy", m.accuracy}, {"nll", m.nll}, {"brier", m.brier}, {"ece", m.ece}};
    checked = {{"accuracy", m.accuracy}, {"nll", m.nll}, {"brier", m.brier}, {"ece", m.ece}};
    json bins = json::array();
    std::ostringstream rel;
    for (const auto& b : m.bins) {
      bins.push_back({{"lower", b.lower},
                      {"upper", b.upper},
                      {"count", b.count},
                      {"accuracy", b.accuracy},
                      {"confidence", b.confidence}});
      rel << (b.lower + b.upper) / 2 << ' ' << b.accuracy << ' ' << b.confidence << ' ' << b.count << "\n";
    }
    e.metrics["reliability_bins"] = bins;
    e.reliability_data = rel.str();
    const auto probs = cpu_double(pred.probs);
    const auto [conf, arg] = probs.max(1);
    const auto labels = test.y.to(torch::kCPU).contiguous();
    const auto p = probs.accessor<double, 2>();
    const auto c = conf.accessor<double, 1>();
    const auto a = arg.accessor<int64_t, 1>();
    const auto y = labels.accessor<int64_t, 1>();
    csv << "index,label,predicted,confidence";
    for (int64_t k = 0; k < probs.size(1); ++k) csv << ",p" << label_of(test_raw, k);
    csv << "\n";
    for (int64_t i = 0; i < probs.size(0); ++i) {
      csv << i << ',' << label_of(test_raw, y[i]) << ',' << label_of(test_raw, a[i]) << ',' << number(c[i]);
      for (int64_t k = 0; k < probs.size(1); ++k) csv << ',' << number(p[i][k]);
      csv << "\n";
    }
  } else {
    const auto mean = cpu_double(scaler.unscale_mean(pred.mean));
    const auto var = cpu_double(scaler.unscale_variance(pred.variance));
    const auto alea = cpu_double(scaler.unscale_variance(pred.aleatoric));
    const auto y = cpu_double(test_raw.y);
    auto m = metrics::regression(mean, var, y);
    const double sd = var.sqrt().mean().item<double>(), alea_sd = alea.sqrt().mean().item<double>();
    e.table = {{"rmse", m.rmse}, {"nll (per point)", m.nll}};
    e.metrics = {{"rmse", m.rmse}, {"nll", m.nll}, {"mean_predictive_sd", sd}, {"mean_aleatoric_sd", alea_sd}};
    checked = {{"rmse", m.rmse}, {"nll", m.nll}, {"mean_predictive_sd", sd}, {"mean_aleatoric_sd", alea_sd}};
    const auto ym = y.accessor<double, 2>(), mm = mean.accessor<double, 2>(), vm = var.accessor<double, 2>(),
               am = alea.accessor<double, 2>();
    csv << "index,y,mean,sd,aleatoric_sd\n";
    for (int64_t i = 0; i < mean.size(0); ++i) {
      csv << i << ',' << number(ym[i][0]) << ',' << number(mm[i][0]) << ',' << number(std::sqrt(vm[i][0])) << ','
          << number(std::sqrt(am[i][0])) << "\n";
    }
  }
  std::string bad = non_finite(checked);
  for (size_t epoch = 0; epoch < losses.size() && bad.empty(); ++epoch) {
    if (!std::isfinite(losses[epoch])) {
      bad = "training loss of epoch " + std::to_string(epoch + 1) + "=" + number(losses[epoch]);
    }
  }
  PUSH_CHECK(bad.empty(), "push train", "the run diverged: non-finite ", bad,
             " (try a smaller --lr); nothing was written");
  e.predictions_csv = csv.str();
  return e;
}

json metrics_document(const TrainConfig& c, bayes::Infer& infer, int ranks, const TrainData& d, const Evaluation& e,
                      const Timings& t, const std::vector<std::string>& pictures) {
  json data_info = {{"name", c.data},
                    {"task", c.task},
                    {"train_size", d.train.size()},
                    {"test_size", d.test.size()},
                    {"input_shape", d.train.input_shape()},
                    {"classes", d.train.num_classes},
                    {"loaded_by", d.handed_over ? "push train --nproc, once for its ranks" : "this rank"}};
  if (d.classify()) data_info["class_labels"] = d.train_raw.class_labels;
  json run = {{"epochs", infer.epochs_done()},
              {"ranks", ranks},
              {"devices", c.devices},
              {"device_type", c.device_type},
              {"threads", c.threads},
              {"fused", infer.fused()},
              {"data_parallel", c.data_parallel ? bayes::to_string(*c.data_parallel) : "no"},
              {"resumed_from", c.resume}};
  json timings = {{"load_s", t.load_s}, {"train_s", t.train_s}, {"predict_s", t.predict_s}, {"total_s", t.total_s}};
  return {
      {"algorithm", to_string(c.algo)}, {"config", c.identity()},       {"run", run},         {"data", data_info},
      {"metrics", e.metrics},           {"loss_curve", infer.losses()}, {"timings", timings}, {"pictures", pictures}};
}

void print_summary(const TrainConfig& c, const bayes::Infer& infer, const TrainData& d, const Evaluation& e,
                   double train_s, const std::filesystem::path& out) {
  std::printf("%s on %s (%s): %d particles, %lld epochs, %lld train / %lld test points\n", to_string(c.algo),
              c.data.c_str(), c.task.c_str(), c.particles, static_cast<long long>(infer.epochs_done()),
              static_cast<long long>(d.train.size()), static_cast<long long>(d.test.size()));
  std::printf("%-22s %12s\n", "test metric", "value");
  for (const auto& [name, value] : e.table) std::printf("%-22s %12.4f\n", name.c_str(), value);
  std::printf("%-22s %12.2f\n", "train seconds", train_s);
  std::printf("outputs in %s\n", push::detail::printable(out.string(), std::string::npos).c_str());
}

}  // namespace push::cli
