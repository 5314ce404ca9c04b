// push train's pictures: gnuplot scripts with the run's numbers inline.
#include "train_pictures.h"

#include <sstream>

#include "gnuplot.h"

namespace push::cli {
namespace {

/// `text` inside a gnuplot single-quoted string.
std::string gnuplot_quoted(const std::string& text) {
  std::string q = "'";
  for (char ch : text) q += ch == '\'' ? std::string("''") : std::string(1, ch);
  return q + "'";
}

}  // namespace

std::optional<torch::Tensor> band_grid(const data::Dataset& train_raw) {
  if (train_raw.task == data::Task::classification || train_raw.x.dim() != 2 || train_raw.x.size(1) != 1) {
    return std::nullopt;
  }
  const double lo = train_raw.x.min().item<double>(), hi = train_raw.x.max().item<double>(), pad = 0.25 * (hi - lo);
  return torch::linspace(lo - pad, hi + pad, 300, torch::kFloat64).unsqueeze(1);
}

torch::Tensor band_table(const torch::Tensor& grid, const bayes::Predictive& band, const data::Standardizer& scaler) {
  return torch::cat({cpu_double(grid), cpu_double(scaler.unscale_mean(band.mean)),
                     cpu_double(scaler.unscale_variance(band.variance).sqrt()),
                     cpu_double(scaler.unscale_variance(torch::clamp_min(band.variance - band.aleatoric, 0)).sqrt())},
                    1);
}

std::string band_csv(const torch::Tensor& table) {
  std::string csv = "x,mean,sd,epistemic_sd\n";
  const auto t = table.accessor<double, 2>();
  for (int64_t i = 0; i < table.size(0); ++i) {
    csv += number(t[i][0]) + ',' + number(t[i][1]) + ',' + number(t[i][2]) + ',' + number(t[i][3]) + '\n';
  }
  return csv;
}

std::vector<std::string> write_pictures(const push::detail::StagedFolder& out, const TrainConfig& c,
                                        const Evaluation& e, const bayes::Infer& infer, const data::Dataset& train_raw,
                                        const std::optional<torch::Tensor>& band) {
  std::vector<std::string> written;
  auto picture = [&](const std::string& name, const std::string& script) {
    if (auto png = render_png(name, script)) {
      out.write(name + ".png", *png);
      written.push_back(name + ".png");
    }
  };
  std::ostringstream loss;
  for (size_t i = 0; i < infer.losses().size(); ++i) loss << i + 1 << ' ' << infer.losses()[i] << "\n";
  // No epoch trained (--epochs 0): no curve to draw.
  if (!infer.losses().empty())
    picture("loss", "$loss << EOD\n" + loss.str() +
                        "EOD\nset xlabel 'epoch'\nset ylabel 'training loss (nll per point)'\n"
                        "plot $loss using 1:2 with lines lw 2 title " +
                        gnuplot_quoted(to_string(c.algo)) + "\n");
  if (train_raw.task == data::Task::classification) {
    // Room above the bars (yrange to 1.1) for each bin's count of test points.
    const std::string script =
        "EOD\n"
        "set xlabel 'confidence'\n"
        "set ylabel 'accuracy'\n"
        "set xrange [0:1]\n"
        "set yrange [0:1.1]\n"
        "set ytics 0,0.2,1\n"
        "set style fill solid 0.6 border -1\n"
        "set boxwidth 1.0/15\n"
        "plot $bins using 1:($4 > 0 ? $2 : 1/0) with boxes title 'accuracy per bin', "
        "'' using 1:($4 > 0 ? $2 : 1/0):(sprintf('%d', $4)) with labels offset 0,0.8 font ',8' "
        "title 'test points in the bin', "
        "x with lines dt 2 lc rgb 'gray40' title 'perfect calibration'\n";
    picture("reliability", "$bins << EOD\n" + e.reliability_data + script);
  } else if (band) {
    // 1-D inputs: the predictive band over a grid wider than the data.
    const auto t = band->accessor<double, 2>();
    std::ostringstream band_rows, points;
    for (int64_t i = 0; i < band->size(0); ++i) {
      const double m = t[i][1], s = t[i][2], ep = t[i][3];
      band_rows << t[i][0] << ' ' << m << ' ' << m - 2 * s << ' ' << m + 2 * s << ' ' << m - 2 * ep << ' ' << m + 2 * ep
                << "\n";
    }
    const auto tx = cpu_double(train_raw.x), ty = cpu_double(train_raw.y);
    for (int64_t i = 0; i < tx.size(0); ++i) {
      points << tx[i][0].item<double>() << ' ' << ty[i][0].item<double>() << "\n";
    }
    picture(
        "predictive",
        "$band << EOD\n" + band_rows.str() + "EOD\n$points << EOD\n" + points.str() + "EOD\n" + "set xlabel " +
            gnuplot_quoted(train_raw.feature_names.at(0)) + "\nset ylabel " + gnuplot_quoted(train_raw.target_name) +
            "\n"
            "plot $band using 1:3:4 with filledcurves fc rgb '#9ecae1' fs transparent solid 0.6 title "
            "'mean ± 2σ (total)', '' using 1:5:6 with filledcurves fc rgb '#3182bd' fs transparent solid 0.5 "
            "title '± 2σ epistemic (members disagree)', '' using 1:2 with lines lw 2 lc rgb '#08519c' title "
            "'predictive mean', $points using 1:2 with points pt 7 ps 0.4 lc rgb '#d95f02' title 'training data'\n");
  }
  return written;
}

}  // namespace push::cli
