// push train's report: metrics, predictions.csv, pictures.
#include "train_report.h"

#include <cmath>
#include <cstdio>
#include <sstream>

#include "gnuplot.h"

namespace push::cli {
namespace {

using json = nlohmann::ordered_json;

std::string number(double v) {
  std::ostringstream s;
  s.precision(8);
  s << v;
  return s.str();
}

/// The label class k stands for in the data (class_labels), as the data wrote it.
std::string label_of(const data::Dataset& d, int64_t k) {
  if (k < 0 || k >= static_cast<int64_t>(d.class_labels.size())) return std::to_string(k);
  char text[32];
  std::snprintf(text, sizeof(text), "%.17g", d.class_labels[k]);
  return text;
}

/// `text` inside a gnuplot single-quoted string.
std::string gnuplot_quoted(const std::string& text) {
  std::string q = "'";
  for (char ch : text) q += ch == '\'' ? std::string("''") : std::string(1, ch);
  return q + "'";
}

torch::Tensor cpu_double(const torch::Tensor& t) { return t.detach().to(torch::kCPU, torch::kFloat64).contiguous(); }

/// Names and values that are not finite, "rmse=nan, nll=inf"; empty when all are.
std::string non_finite(const std::vector<std::pair<std::string, double>>& values) {
  std::string bad;
  for (const auto& [name, value] : values) {
    if (!std::isfinite(value)) bad += (bad.empty() ? "" : ", ") + name + "=" + number(value);
  }
  return bad;
}

}  // namespace

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
      bins.push_back({{"lower", b.lower}, {"upper", b.upper}, {"count", b.count}, {"accuracy", b.accuracy},
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
    if (!std::isfinite(losses[epoch])) bad = "training loss of epoch " + std::to_string(epoch + 1) + "=" + number(losses[epoch]);
  }
  PUSH_CHECK(bad.empty(), "push train", "the run diverged: non-finite ", bad,
             " (try a smaller --lr); nothing was written");
  e.predictions_csv = csv.str();
  return e;
}

std::optional<torch::Tensor> band_grid(const data::Dataset& train_raw) {
  if (train_raw.task == data::Task::classification || train_raw.x.dim() != 2 || train_raw.x.size(1) != 1) {
    return std::nullopt;
  }
  const double lo = train_raw.x.min().item<double>(), hi = train_raw.x.max().item<double>(), pad = 0.25 * (hi - lo);
  return torch::linspace(lo - pad, hi + pad, 300).unsqueeze(1);
}

std::vector<std::string> write_pictures(const push::detail::StagedFolder& out, const TrainConfig& c, const Evaluation& e,
                                        bayes::Infer& infer, const data::Dataset& train_raw,
                                        const data::Standardizer& scaler, const std::optional<torch::Tensor>& grid,
                                        const std::optional<bayes::Predictive>& band) {
  std::vector<std::string> written;
  auto picture = [&](const std::string& name, const std::string& script) {
    if (auto png = render_png(name, script)) {
      out.write(name + ".png", *png);
      written.push_back(name + ".png");
    }
  };
  std::ostringstream loss;
  for (size_t i = 0; i < infer.losses().size(); ++i) loss << i + 1 << ' ' << infer.losses()[i] << "\n";
  picture("loss", "$loss << EOD\n" + loss.str() + "EOD\nset xlabel 'epoch'\nset ylabel 'training loss (nll per point)'\n"
          "plot $loss using 1:2 with lines lw 2 title " + gnuplot_quoted(c.algo) + "\n");
  if (train_raw.task == data::Task::classification) {
    picture("reliability", "$bins << EOD\n" + e.reliability_data +
            "EOD\nset xlabel 'confidence'\nset ylabel 'accuracy'\nset xrange [0:1]\nset yrange [0:1]\n"
            "set style fill solid 0.6 border -1\nset boxwidth 1.0/15\n"
            "plot $bins using 1:($4 > 0 ? $2 : 1/0) with boxes title 'accuracy per bin', "
            "x with lines dt 2 lc rgb 'gray40' title 'perfect calibration'\n");
  } else if (grid && band) {
    // 1-D inputs: the predictive band over a grid wider than the data.
    const auto& grid_raw = *grid;
    const auto& gp = *band;
    auto gm = cpu_double(scaler.unscale_mean(gp.mean)), gs = cpu_double(scaler.unscale_variance(gp.variance).sqrt());
    auto ge = cpu_double(scaler.unscale_variance(torch::clamp_min(gp.variance - gp.aleatoric, 0)).sqrt());
    auto gx = cpu_double(grid_raw);
    std::ostringstream band, points;
    for (int64_t i = 0; i < gx.size(0); ++i) {
      const double m = gm[i][0].item<double>(), s = gs[i][0].item<double>(), ep = ge[i][0].item<double>();
      band << gx[i][0].item<double>() << ' ' << m << ' ' << m - 2 * s << ' ' << m + 2 * s << ' ' << m - 2 * ep << ' '
           << m + 2 * ep << "\n";
    }
    auto tx = cpu_double(train_raw.x), ty = cpu_double(train_raw.y);
    for (int64_t i = 0; i < tx.size(0); ++i) points << tx[i][0].item<double>() << ' ' << ty[i][0].item<double>() << "\n";
    picture("predictive",
            "$band << EOD\n" + band.str() + "EOD\n$points << EOD\n" + points.str() + "EOD\n" +
            "set xlabel " + gnuplot_quoted(train_raw.feature_names.at(0)) + "\nset ylabel " +
            gnuplot_quoted(train_raw.target_name) + "\n"
            "plot $band using 1:3:4 with filledcurves fc rgb '#9ecae1' fs transparent solid 0.6 title "
            "'mean ± 2σ (total)', '' using 1:5:6 with filledcurves fc rgb '#3182bd' fs transparent solid 0.5 "
            "title '± 2σ epistemic (members disagree)', '' using 1:2 with lines lw 2 lc rgb '#08519c' title "
            "'predictive mean', $points using 1:2 with points pt 7 ps 0.4 lc rgb '#d95f02' title 'training data'\n");
  }
  return written;
}

}  // namespace push::cli
