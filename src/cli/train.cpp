// push train: trains a distribution of networks (deep ensemble, MultiSWAG, SVGD or MC
// dropout) on built-in or CSV/IDX data and writes its predictive uncertainty: a metrics
// table on stdout, and metrics.json, predictions.csv and PNG pictures in --out.
//   push train                                   # ensemble on the 1-D sine-with-a-gap set
//   push train --algo svgd --data iris --epochs 100 --out runs/iris
// Everything is checked before --out is touched; outputs are written to a staging
// folder and moved into --out only once complete.
#include <push/bayes.h>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <sstream>
#include <thread>
#include <unistd.h>

#include "command.h"

namespace push::cli {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::ordered_json;
using Clock = std::chrono::steady_clock;

struct TrainConfig {
  std::string algo = "ensemble", model = "mlp:64,64", data = "sine-gap", target, task, likelihood;
  std::string out = "push-out", save, resume;
  int particles = 8, devices = 0, threads = 1;  // devices 0: every GPU, else 2 CPU lanes
  int64_t epochs = 150, batch_size = 64, samples = 20, rank = 10, pretrain_epochs = -1, limit = 0, collect_every = 0;
  double lr = 1e-2, swag_lr = 0, test_fraction = 0.2, dropout = 0.1, noise_std = 1.0, prior_std = 1.0, bandwidth = 0;
  uint64_t seed = 0;
  bool bootstrap = false, quiet = false;

  /// The settings a checkpoint depends on (--resume must match them all).
  json identity() const {
    return json{{"algo", algo},           {"model", model},         {"data", data},
                {"target", target},       {"task", task},           {"likelihood", likelihood},
                {"particles", particles}, {"batch_size", batch_size}, {"lr", lr},
                {"test_fraction", test_fraction}, {"seed", seed},   {"limit", limit},
                {"dropout", algo == "mcdropout" ? dropout : 0.0},
                {"rank", algo == "mswag" ? rank : 0}, {"pretrain_epochs", algo == "mswag" ? pretrain_epochs : 0},
                {"swag_lr", algo == "mswag" ? swag_lr : 0.0}, {"collect_every", algo == "mswag" ? collect_every : 0},
                {"bootstrap", bootstrap}, {"bandwidth", bandwidth}, {"noise_std", noise_std},
                {"prior_std", prior_std}};
  }
};

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

/// A one-line progress bar on stderr: epochs x particles, running loss, ETA.
class ProgressBar {
 public:
  ProgressBar(int64_t first_epoch, int64_t last_epoch, int particles, bool quiet)
      : first_(first_epoch), last_(last_epoch), particles_(particles), quiet_(quiet) {}
  void update(const bayes::Progress& p) {
    if (quiet_) return;
    const int64_t total = (last_ - first_) * particles_;
    const int64_t done = (p.epoch - 1 - first_) * particles_ + p.particles_done;
    const double elapsed = seconds_since(t0_);
    const bool end = done >= total;
    if (!end && elapsed - last_print_ < 0.1) return;
    last_print_ = elapsed;
    const double eta = done > 0 ? elapsed / done * (total - done) : 0;
    const int width = 30, filled = total > 0 ? static_cast<int>(width * done / total) : width;
    std::fprintf(stderr, "\r[%s%s] epoch %lld/%lld  particle %lld/%d  loss %.4f  ETA %.1fs  ",
                 std::string(filled, '#').c_str(), std::string(width - filled, '.').c_str(),
                 static_cast<long long>(p.epoch), static_cast<long long>(last_),
                 static_cast<long long>(p.particles_done), particles_, p.loss, eta);
    if (end) std::fprintf(stderr, "\n");
  }

 private:
  int64_t first_, last_;
  int particles_;
  bool quiet_;
  Clock::time_point t0_ = Clock::now();
  double last_print_ = -1;
};

std::unique_ptr<bayes::Infer> make_infer(const TrainConfig& c, ModuleFactory model, bayes::InferOptions options) {
  if (c.algo == "ensemble") return std::make_unique<bayes::Ensemble>(model, options, bayes::EnsembleOptions().bootstrap(c.bootstrap));
  if (c.algo == "mswag") {
    auto s = bayes::SWAGOptions().pretrain_epochs(c.pretrain_epochs).rank(c.rank).samples(c.samples)
                 .collect_every_steps(c.collect_every);
    if (c.swag_lr > 0) s.swag_lr(c.swag_lr);
    return std::make_unique<bayes::MultiSWAG>(model, options, s);
  }
  if (c.algo == "svgd") {
    auto s = bayes::SVGDOptions();
    if (c.bandwidth > 0) s.bandwidth(c.bandwidth);
    return std::make_unique<bayes::SVGD>(model, options, s);
  }
  if (c.algo == "mcdropout") return std::make_unique<bayes::MCDropout>(model, options, bayes::McDropoutOptions().samples(c.samples));
  throw Error("[push train] unknown algorithm '" + c.algo + "'");
}

std::string csv_number(double v) {
  std::ostringstream s;
  s.precision(8);
  s << v;
  return s.str();
}

/// Runs gnuplot on `script` in `dir`; false (and a warning) when it is missing or fails.
bool gnuplot(const fs::path& dir, const std::string& name, const std::string& script) {
  if (std::system("command -v gnuplot >/dev/null 2>&1") != 0) {
    std::cerr << "push train: gnuplot not found; skipping " << name << ".png\n";
    return false;
  }
  auto gp = dir / (name + ".gp");
  std::ofstream(gp) << "set terminal pngcairo size 900,560 font 'sans,11'\nset output '" << name << ".png'\n"
                    << "set key outside top center horizontal\nset grid\n"
                    << script;
  const std::string cmd = "cd '" + dir.string() + "' && gnuplot '" + gp.filename().string() + "' >/dev/null 2>&1";
  bool ok = std::system(cmd.c_str()) == 0 && fs::exists(dir / (name + ".png"));
  if (!ok) std::cerr << "push train: gnuplot failed; skipping " << name << ".png\n";
  return ok;
}

/// Moves every file of `staging` into `out` (created if needed), replacing old ones.
void publish(const fs::path& staging, const fs::path& out) {
  fs::create_directories(out);
  for (const auto& entry : fs::directory_iterator(staging)) {
    fs::rename(entry.path(), out / entry.path().filename());
  }
  fs::remove_all(staging);
}

int run_train(int argc, char** argv);

/// LibTorch's own errors carry a C++ backtrace: report their first line only.
int train_main(int argc, char** argv) {
  try {
    return run_train(argc, argv);
  } catch (const c10::Error& e) {
    std::string msg = e.what_without_backtrace();
    std::cerr << "push train: " << msg.substr(0, msg.find('\n')) << "\n";
    return 1;
  }
}

int run_train(int argc, char** argv) {
  const auto t_start = Clock::now();
  TrainConfig c;
  CLI::App app{"push train: train a distribution of networks and report its predictive uncertainty", "push train"};
  app.add_option("--algo", c.algo, "ensemble, mswag (MultiSWAG), svgd or mcdropout")
      ->check(CLI::IsMember({"ensemble", "mswag", "svgd", "mcdropout"}))
      ->capture_default_str();
  app.add_option("--particles", c.particles, "networks in the distribution")->check(CLI::Range(1, 100000))->capture_default_str();
  app.add_option("--devices", c.devices, "device lanes: GPUs, or CPU event loops without CUDA (default: every GPU, else 2)")
      ->check(CLI::Range(1, 256));
  // Small networks gain nothing from intra-op parallelism, and on a busy machine its
  // spinning threads cost more than they give: one per lane unless asked.
  app.add_option("--threads", c.threads, "intra-op threads per lane")->check(CLI::Range(1, 1024))->capture_default_str();
  app.add_option("--epochs", c.epochs, "training epochs (in all, counting resumed ones)")->check(CLI::Range(int64_t{0}, int64_t{1} << 40))->capture_default_str();
  app.add_option("--batch-size", c.batch_size, "minibatch size")->check(CLI::Range(int64_t{1}, int64_t{1} << 40))->capture_default_str();
  app.add_option("--lr", c.lr, "learning rate (Adam; mswag collects with SGD, see --swag-lr)")->check(CLI::PositiveNumber)->capture_default_str();
  app.add_option("--model", c.model, "mlp:W1,W2,... or cnn[:C1,C2] (image data)")->capture_default_str();
  app.add_option("--data", c.data,
                 "built-in set (sine-gap, boston_house_prices, diabetes, iris, wine, breast_cancer, digits, "
                 "fashion-mnist), a CSV file with a header row, or an IDX directory")
      ->capture_default_str();
  app.add_option("--target", c.target, "target column of a CSV file (default: the last)");
  app.add_option("--task", c.task, "regression or classification (default: the data set's, regression for CSV)")
      ->check(CLI::IsMember({"regression", "classification"}));
  app.add_option("--likelihood", c.likelihood,
                 "regression likelihood: heteroscedastic (the network predicts its noise; default), learned-noise "
                 "(each particle learns one noise precision, Gamma(1, 0.1) prior, as in the SVGD paper) or gaussian "
                 "(fixed --noise-std)")
      ->check(CLI::IsMember({"gaussian", "heteroscedastic", "learned-noise"}));
  app.add_option("--noise-std", c.noise_std, "noise σ of the gaussian likelihood, in standardised units")->check(CLI::PositiveNumber)->capture_default_str();
  app.add_option("--prior-std", c.prior_std, "σ of the Gaussian prior on the weights")->check(CLI::PositiveNumber)->capture_default_str();
  app.add_option("--test-fraction", c.test_fraction, "held-out fraction (not for IDX data)")->check(CLI::Range(0.0, 1.0))->capture_default_str();
  app.add_option("--limit", c.limit, "use at most this many training and test rows (0: all)")->check(CLI::NonNegativeNumber);
  app.add_option("--seed", c.seed, "seed of the split, initialisation, shuffling and sampling")->capture_default_str();
  app.add_option("--samples", c.samples, "mswag / mcdropout: samples per particle at prediction")->check(CLI::Range(int64_t{1}, int64_t{100000}))->capture_default_str();
  app.add_option("--rank", c.rank, "mswag: deviation columns K")->check(CLI::Range(int64_t{1}, int64_t{100000}))->capture_default_str();
  app.add_option("--pretrain-epochs", c.pretrain_epochs, "mswag: epochs before collecting moments (default: half of --epochs)");
  app.add_option("--swag-lr", c.swag_lr, "mswag: learning rate of the collection phase, SGD with momentum 0.9 (default: --lr x 0.1)")->check(CLI::PositiveNumber);
  app.add_option("--collect-every", c.collect_every, "mswag: collect every this many steps (default 0: every epoch)")->check(CLI::NonNegativeNumber);
  app.add_option("--dropout", c.dropout, "mcdropout: dropout probability")->check(CLI::Range(0.0, 0.95))->capture_default_str();
  app.add_flag("--bootstrap", c.bootstrap, "ensemble: train each particle on a bootstrap resample");
  app.add_option("--bandwidth", c.bandwidth, "svgd: RBF bandwidth h (default: median heuristic)")->check(CLI::PositiveNumber);
  app.add_option("--out", c.out, "output folder")->capture_default_str();
  app.add_option("--save", c.save, "write a checkpoint (particles + config) to this folder");
  app.add_option("--resume", c.resume, "continue from a checkpoint written by --save with the same configuration");
  app.add_flag("--quiet", c.quiet, "no progress bar");
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp&) {
    std::cout << app.help();
    return 0;
  } catch (const CLI::ParseError& e) {
    std::cerr << "push train: " << e.what() << " (see push train --help)\n";
    return 2;
  }

  if (c.devices == 0) {
    c.devices = torch::cuda::is_available() ? static_cast<int>(torch::cuda::device_count())
                                            : std::clamp(static_cast<int>(std::thread::hardware_concurrency()), 1, 2);
  }

  // ---- check everything before anything is written ----
  auto spec = bayes::parse_model_spec(c.model);
  data::CsvOptions csv;
  csv.target = c.target;
  if (!c.task.empty()) csv.task = data::parse_task(c.task);
  const auto t_load = Clock::now();
  auto [train_raw, test_raw] = data::load_split(c.data, csv, c.test_fraction, c.seed);
  if (!c.task.empty()) {
    PUSH_CHECK(data::parse_task(c.task) == train_raw.task, "push train", "data set '", c.data, "' is a ",
               data::to_string(train_raw.task), " data set, not ", c.task);
  }
  train_raw = data::subsample(train_raw, c.limit, c.seed);
  test_raw = data::subsample(test_raw, c.limit, c.seed + 1);
  const double load_s = seconds_since(t_load);
  const bool classify = train_raw.task == data::Task::classification;
  if (c.likelihood.empty()) c.likelihood = classify ? "categorical" : "heteroscedastic";
  PUSH_CHECK(!classify || c.likelihood == "categorical", "push train", "--likelihood ", c.likelihood,
             " is for regression; ", c.data, " is a classification data set");
  if (c.pretrain_epochs < 0) c.pretrain_epochs = c.epochs / 2;
  c.task = data::to_string(train_raw.task);

  auto scaler = data::Standardizer::fit(train_raw);
  auto train = scaler.apply(train_raw), test = scaler.apply(test_raw);
  const auto likelihood = classify ? bayes::Likelihood::categorical
                          : c.likelihood == "gaussian"      ? bayes::Likelihood::gaussian
                          : c.likelihood == "learned-noise" ? bayes::Likelihood::learned_noise
                                                            : bayes::Likelihood::heteroscedastic;
  const int64_t outputs = bayes::output_units(likelihood, classify ? train.num_classes : train.y.size(1));
  auto model = bayes::make_model(spec, train.input_shape(), outputs, c.algo == "mcdropout" ? c.dropout : 0.0);

  json resume_config;
  if (!c.resume.empty()) {
    std::ifstream in(fs::path(c.resume) / "config.json");
    PUSH_CHECK(in, "push train", "no checkpoint to resume at '", c.resume, "' (missing config.json)");
    try {
      resume_config = json::parse(in);
    } catch (const json::exception& e) {
      throw Error(c10::str("[push train] '", c.resume, "/config.json' is not valid JSON"));
    }
    auto want = c.identity();
    for (const auto& [key, value] : want.items()) {
      PUSH_CHECK(resume_config.contains(key) && resume_config[key] == value, "push train", "cannot resume from '",
                 c.resume, "': it was trained with ", key, "=",
                 resume_config.contains(key) ? resume_config[key].dump() : "(unset)", ", this run has ", key, "=",
                 value.dump());
    }
  }

  bayes::InferOptions options;
  options.particles(c.particles)
      .devices(c.devices)
      .intra_op_threads(c.threads)
      .cache_size(std::max(1, (c.particles + c.devices - 1) / c.devices))
      .likelihood(likelihood)
      .noise_std(c.noise_std)
      .prior_std(c.prior_std)
      .batch_size(c.batch_size)
      .lr(c.lr)
      .seed(c.seed);
  std::unique_ptr<ProgressBar> bar;
  options.on_progress([&bar](const bayes::Progress& p) {
    if (bar) bar->update(p);
  });
  auto infer = make_infer(c, model, options);
  if (!c.resume.empty()) infer->load(fs::path(c.resume) / "checkpoint");

  // ---- train ----
  const int64_t first = infer->epochs_done(), todo = std::max<int64_t>(0, c.epochs - first);
  bar = std::make_unique<ProgressBar>(first, first + todo, c.particles, c.quiet);
  const auto t_train = Clock::now();
  infer->fit(train, todo);
  const double train_s = seconds_since(t_train);

  // ---- evaluate ----
  const auto t_predict = Clock::now();
  auto pred = infer->predict(test.x);
  const double predict_s = seconds_since(t_predict);

  // Staging folder next to --out: a failure below leaves --out as it was.
  fs::path out = fs::absolute(c.out);
  fs::create_directories(out.parent_path());
  fs::path staging = out.parent_path() / ("." + out.filename().string() + ".partial-" + std::to_string(::getpid()));
  fs::remove_all(staging);
  fs::create_directories(staging);
  struct Cleanup {
    fs::path dir;
    ~Cleanup() {
      std::error_code ec;
      if (!dir.empty()) fs::remove_all(dir, ec);
    }
  } cleanup{staging};

  json metrics = json::object();
  std::vector<std::pair<std::string, double>> table;
  std::ofstream pred_csv(staging / "predictions.csv");
  if (classify) {
    auto m = metrics::classification(pred.probs, test.y);
    table = {{"accuracy", m.accuracy}, {"nll", m.nll}, {"brier", m.brier}, {"ece (15 bins)", m.ece}};
    metrics = {{"accuracy", m.accuracy}, {"nll", m.nll}, {"brier", m.brier}, {"ece", m.ece}};
    json bins = json::array();
    std::ofstream rel(staging / "reliability.dat");
    for (const auto& b : m.bins) {
      bins.push_back({{"lower", b.lower}, {"upper", b.upper}, {"count", b.count}, {"accuracy", b.accuracy},
                      {"confidence", b.confidence}});
      rel << (b.lower + b.upper) / 2 << ' ' << b.accuracy << ' ' << b.confidence << ' ' << b.count << "\n";
    }
    metrics["reliability_bins"] = bins;
    pred_csv << "index,label,predicted,confidence";
    for (int64_t k = 0; k < pred.probs.size(1); ++k) pred_csv << ",p" << k;
    pred_csv << "\n";
    auto [conf, arg] = pred.probs.max(1);
    for (int64_t i = 0; i < pred.probs.size(0); ++i) {
      pred_csv << i << ',' << test.y[i].item<int64_t>() << ',' << arg[i].item<int64_t>() << ','
               << csv_number(conf[i].item<double>());
      for (int64_t k = 0; k < pred.probs.size(1); ++k) pred_csv << ',' << csv_number(pred.probs[i][k].item<double>());
      pred_csv << "\n";
    }
  } else {
    auto mean = scaler.unscale_mean(pred.mean), var = scaler.unscale_variance(pred.variance);
    auto alea = scaler.unscale_variance(pred.aleatoric);
    auto y = test_raw.y.to(torch::kFloat64);
    auto m = metrics::regression(mean, var, y);
    table = {{"rmse", m.rmse}, {"nll (per point)", m.nll}};
    metrics = {{"rmse", m.rmse}, {"nll", m.nll}, {"mean_predictive_sd", var.sqrt().mean().item<double>()},
               {"mean_aleatoric_sd", alea.sqrt().mean().item<double>()}};
    pred_csv << "index,y,mean,sd,aleatoric_sd\n";
    for (int64_t i = 0; i < mean.size(0); ++i) {
      pred_csv << i << ',' << csv_number(y[i][0].item<double>()) << ',' << csv_number(mean[i][0].item<double>())
               << ',' << csv_number(std::sqrt(var[i][0].item<double>())) << ','
               << csv_number(std::sqrt(alea[i][0].item<double>())) << "\n";
    }
  }
  pred_csv.close();
  PUSH_CHECK(pred_csv.good(), "push train", "cannot write ", (staging / "predictions.csv").string());

  // Loss curve.
  {
    std::ofstream loss(staging / "loss.dat");
    for (size_t e = 0; e < infer->losses().size(); ++e) loss << e + 1 << ' ' << infer->losses()[e] << "\n";
  }
  std::vector<std::string> pictures;
  if (gnuplot(staging, "loss",
              "set xlabel 'epoch'\nset ylabel 'training loss (nll per point)'\n"
              "plot 'loss.dat' using 1:2 with lines lw 2 title '" + c.algo + "'\n")) {
    pictures.push_back("loss.png");
  }
  if (classify) {
    if (gnuplot(staging, "reliability",
                "set xlabel 'confidence'\nset ylabel 'accuracy'\nset xrange [0:1]\nset yrange [0:1]\n"
                "set style fill solid 0.6 border -1\nset boxwidth 1.0/15\n"
                "plot 'reliability.dat' using 1:($4 > 0 ? $2 : 1/0) with boxes title 'accuracy per bin', "
                "x with lines dt 2 lc rgb 'gray40' title 'perfect calibration'\n")) {
      pictures.push_back("reliability.png");
    }
  } else if (train_raw.x.dim() == 2 && train_raw.x.size(1) == 1) {
    // 1-D inputs: the predictive band over a grid wider than the data.
    double lo = train_raw.x.min().item<double>(), hi = train_raw.x.max().item<double>(), pad = 0.25 * (hi - lo);
    auto grid_raw = torch::linspace(lo - pad, hi + pad, 300).unsqueeze(1);
    auto grid = (grid_raw - scaler.x_mean) / scaler.x_std;
    auto gp = infer->predict(grid);
    auto gm = scaler.unscale_mean(gp.mean), gs = scaler.unscale_variance(gp.variance).sqrt();
    auto ge = scaler.unscale_variance(torch::clamp_min(gp.variance - gp.aleatoric, 0)).sqrt();
    {
      std::ofstream band(staging / "band.dat");
      for (int64_t i = 0; i < grid_raw.size(0); ++i) {
        double m = gm[i][0].item<double>(), s = gs[i][0].item<double>(), e = ge[i][0].item<double>();
        band << grid_raw[i][0].item<double>() << ' ' << m << ' ' << m - 2 * s << ' ' << m + 2 * s << ' '
             << m - 2 * e << ' ' << m + 2 * e << "\n";
      }
      std::ofstream pts(staging / "points.dat");
      for (int64_t i = 0; i < train_raw.size(); ++i) {
        pts << train_raw.x[i][0].item<double>() << ' ' << train_raw.y[i][0].item<double>() << "\n";
      }
    }
    if (gnuplot(staging, "predictive",
                "set xlabel '" + train_raw.feature_names.at(0) + "'\nset ylabel '" + train_raw.target_name + "'\n"
                "plot 'band.dat' using 1:3:4 with filledcurves fc rgb '#9ecae1' fs transparent solid 0.6 title "
                "'mean ± 2σ (total)', '' using 1:5:6 with filledcurves fc rgb '#3182bd' fs transparent solid 0.5 "
                "title '± 2σ epistemic (members disagree)', '' using 1:2 with lines lw 2 lc rgb '#08519c' title 'predictive mean', "
                "'points.dat' using 1:2 with points pt 7 ps 0.4 lc rgb '#d95f02' title 'training data'\n")) {
      pictures.push_back("predictive.png");
    }
  }
  for (const char* scratch : {"loss.dat", "loss.gp", "reliability.dat", "reliability.gp", "band.dat", "points.dat",
                              "predictive.gp"}) {
    fs::remove(staging / scratch);
  }

  // ---- checkpoint ----
  if (!c.save.empty()) {
    fs::path save = fs::absolute(c.save);
    fs::path partial = save.parent_path() / ("." + save.filename().string() + ".partial-" + std::to_string(::getpid()));
    fs::remove_all(partial);
    infer->save(partial / "checkpoint");
    std::ofstream(partial / "config.json") << c.identity().dump(2) << "\n";
    fs::remove_all(save);
    fs::create_directories(save.parent_path());
    fs::rename(partial, save);
  }

  const double total_s = seconds_since(t_start);
  json doc = {{"algorithm", c.algo},
              {"config", c.identity()},
              {"run", {{"epochs", infer->epochs_done()}, {"devices", c.devices}, {"threads", c.threads}, {"resumed_from", c.resume}}},
              {"data",
               {{"name", c.data},
                {"task", c.task},
                {"train_size", train.size()},
                {"test_size", test.size()},
                {"input_shape", train.input_shape()},
                {"classes", train.num_classes}}},
              {"metrics", metrics},
              {"loss_curve", infer->losses()},
              {"timings", {{"load_s", load_s}, {"train_s", train_s}, {"predict_s", predict_s}, {"total_s", total_s}}},
              {"pictures", pictures}};
  std::ofstream(staging / "metrics.json") << doc.dump(2) << "\n";
  publish(staging, out);
  cleanup.dir.clear();

  std::printf("%s on %s (%s): %d particles, %lld epochs, %lld train / %lld test points\n", c.algo.c_str(),
              c.data.c_str(), c.task.c_str(), c.particles, static_cast<long long>(infer->epochs_done()),
              static_cast<long long>(train.size()), static_cast<long long>(test.size()));
  std::printf("%-22s %12s\n", "test metric", "value");
  for (const auto& [name, value] : table) std::printf("%-22s %12.4f\n", name.c_str(), value);
  std::printf("%-22s %12.2f\n", "train seconds", train_s);
  std::printf("outputs in %s\n", out.string().c_str());
  return 0;
}

}  // namespace

PUSH_CLI_COMMAND(train, "train a Bayesian distribution of networks (ensemble, mswag, svgd, mcdropout)", train_main);

}  // namespace push::cli
