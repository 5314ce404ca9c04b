// push train: trains a distribution of networks (deep ensemble, MultiSWAG, SVGD or MC
// dropout) on built-in or CSV/IDX data and writes its predictive uncertainty: a metrics
// table on stdout, and metrics.json, predictions.csv and PNG pictures in --out.
//   push train                                   # ensemble on the 1-D sine-with-a-gap set
//   push train --algo svgd --data iris --epochs 100 --out runs/iris
// Everything is checked before training: the input, and that --out and --save can be
// written (core/staged_folder.h). Outputs and the checkpoint are written in staging folders
// and published whole, only when the run succeeded (finite metrics, every write checked).
#include <push/bayes.h>
#include <push/parallel/daso.h>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <csignal>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <optional>
#include <set>
#include <thread>

#include "command.h"
#include "core/files.h"
#include "core/staged_folder.h"
#include "last_resort.h"
#include "train_config.h"
#include "train_report.h"

namespace push::cli {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::ordered_json;
using Clock = std::chrono::steady_clock;
using push::detail::paths_overlap;
using push::detail::resolve_path;
using push::detail::StagedFolder;

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

/// A one-line progress bar on stderr: epochs x particles, running loss, ETA.
class ProgressBar {
 public:
  ProgressBar(int64_t first_epoch, int64_t last_epoch, int particles, bool quiet)
      : first_(first_epoch), last_(last_epoch), particles_(particles), quiet_(quiet) {}
  /// A run stopped mid-way: end the bar's line, so that an error gets its own.
  ~ProgressBar() {
    if (open_line_) std::fprintf(stderr, "\n");
  }
  ProgressBar(const ProgressBar&) = delete;
  ProgressBar& operator=(const ProgressBar&) = delete;
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
    open_line_ = !end;
  }

 private:
  int64_t first_, last_;
  int particles_;
  bool quiet_;
  Clock::time_point t0_ = Clock::now();
  double last_print_ = -1;
  bool open_line_ = false;
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

/// What --out may hold to be replaced: nothing but push train's own outputs.
std::string replaceable_outputs(const fs::path& dir) {
  static const std::set<std::string> ours = {"metrics.json", "predictions.csv", "loss.png", "predictive.png",
                                             "reliability.png"};
  for (const auto& entry : fs::directory_iterator(dir)) {
    const std::string name = entry.path().filename().string();
    if (!ours.count(name) || !entry.is_regular_file()) {
      return "holds '" + name + "', which push train does not write (it replaces --out as a whole)";
    }
  }
  return "";
}

/// What --save may replace: an empty folder or a push train checkpoint.
std::string replaceable_checkpoint(const fs::path& dir) {
  bool empty = true, has_config = false;
  for (const auto& entry : fs::directory_iterator(dir)) {
    const std::string name = entry.path().filename().string();
    empty = false;
    if (name == "config.json" && entry.is_regular_file()) has_config = true;
    else if (!(name == "checkpoint" && entry.is_directory())) return "is not a push train checkpoint (it holds '" + name + "')";
  }
  if (!empty && !has_config) return "is not a push train checkpoint (it has no config.json)";
  return "";
}

int run_train(int argc, char** argv);

/// `push train --nproc N ...` outside a job: `push launch --nproc N -- <this program>
/// train ...` (without --nproc), so the ranks find each other as under any launcher.
int relaunch(int argc, char** argv, int nproc) {
  std::error_code ec;
  const auto self = fs::read_symlink("/proc/self/exe", ec);
  PUSH_CHECK(!ec, "push train", "cannot find this program to start its ranks: ", ec.message());
  std::vector<std::string> args = {"launch", "--nproc", std::to_string(nproc), "--", self.string(), "train"};
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--nproc") {
      ++i;
      continue;
    }
    if (a.rfind("--nproc=", 0) == 0) continue;
    args.push_back(a);
  }
  std::vector<char*> pointers;
  for (auto& a : args) pointers.push_back(a.data());
  pointers.push_back(nullptr);
  return commands().at("launch").run(static_cast<int>(args.size()), pointers.data());
}

/// LibTorch's own errors carry a C++ backtrace: report their first line only.
int train_main(int argc, char** argv) {
  install_last_resort("push train");
  // A file size limit is one more way for a disk to be full: fail the write, not the process.
  std::signal(SIGXFSZ, SIG_IGN);
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
  app.add_option("--pretrain-epochs", c.pretrain_epochs,
                 "mswag: epochs before collecting moments (default: half of --epochs; when resuming, the checkpoint's)")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--swag-lr", c.swag_lr, "mswag: learning rate of the collection phase, SGD with momentum 0.9 (default: --lr x 0.1)")->check(CLI::PositiveNumber);
  app.add_option("--collect-every", c.collect_every, "mswag: collect every this many steps (default 0: every epoch)")->check(CLI::NonNegativeNumber);
  app.add_option("--dropout", c.dropout, "mcdropout: dropout probability")->check(CLI::Range(0.0, 0.95))->capture_default_str();
  app.add_flag("--bootstrap", c.bootstrap, "ensemble: train each particle on a bootstrap resample");
  app.add_option("--bandwidth", c.bandwidth, "svgd: RBF bandwidth h (default: median heuristic)")->check(CLI::PositiveNumber);
  app.add_option("--out", c.out, "output folder")->capture_default_str();
  app.add_option("--save", c.save, "write a checkpoint (particles + config) to this folder");
  app.add_option("--resume", c.resume, "continue from a checkpoint written by --save with the same configuration");
  app.add_flag("--quiet", c.quiet, "no progress bar");
  auto* fuse = app.add_flag_callback("--fuse", [&c] { c.fuse = true; },
                                     "train each lane's particles as one stacked computation (the default for MLPs; "
                                     "models it cannot fuse train unfused)");
  app.add_flag_callback("--no-fuse", [&c] { c.fuse = false; }, "train particles one by one (the default for the CNN)")
      ->excludes(fuse);
  app.add_option("--data-parallel", c.data_parallel,
                 "blocking, nonblocking or daso: every rank trains every particle on its share of each epoch's rows "
                 "(needs several ranks; default: the particles are spread over the ranks)")
      ->check(CLI::IsMember({"blocking", "nonblocking", "daso"}));
  app.add_option("--ranks-per-node", c.ranks_per_node,
                 "daso: ranks per node, consecutive ranks (default: LOCAL_WORLD_SIZE); a divisor of the ranks that "
                 "leaves at least 2 nodes, e.g. 2 of 4 to simulate 2 nodes on one machine")
      ->check(CLI::Range(1, 1024));
  app.add_option("--nproc", c.nproc,
                 "start N local ranks (as push launch does) that train one distribution; under push launch, "
                 "torchrun --no-python or mpirun the job's ranks are used instead")
      ->check(CLI::Range(1, 1024))->capture_default_str();
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp&) {
    std::cout << app.help();
    return 0;
  } catch (const CLI::ParseError& e) {
    std::cerr << "push train: " << e.what() << " (see push train --help)\n";
    return 2;
  }

  // Several ranks: started here (--nproc), or by a launcher (its WORLD_SIZE).
  const char* world_size = std::getenv("WORLD_SIZE");
  if (c.nproc > 1 && world_size == nullptr) return relaunch(argc, argv, c.nproc);
  std::optional<dist::World> world;
  if (world_size != nullptr) {
    PUSH_CHECK(c.nproc == 1 || c.nproc == std::atoi(world_size), "push train", "--nproc ", c.nproc,
               " differs from the job's ", world_size, " ranks (WORLD_SIZE)");
  }
  if (world_size != nullptr && std::atoi(world_size) > 1) world.emplace(dist::World::from_env());
  // Rank 0 reports and writes; every rank trains its own particles (or, data-parallel,
  // its share of every particle's rows).
  const bool lead = !world || world->rank() == 0;
  const bool data_parallel = !c.data_parallel.empty();
  PUSH_CHECK(!data_parallel || world, "push train", "--data-parallel ", c.data_parallel,
             " needs several ranks: add --nproc N (N >= 2), or start push train under a launcher");
  PUSH_CHECK(c.ranks_per_node == 0 || c.data_parallel == "daso", "push train",
             "--ranks-per-node is for --data-parallel daso");
  PUSH_CHECK(!data_parallel || c.algo != "svgd", "push train",
             "--data-parallel does not train svgd (its update couples the particles); without --data-parallel the "
             "ranks share the particles");
  PUSH_CHECK(!data_parallel || c.algo != "mswag" || c.data_parallel == "blocking", "push train",
             "--algo mswag trains data-parallel only with --data-parallel blocking (it collects every step's "
             "parameters, which differ between the ranks in ", c.data_parallel, " mode)");
  PUSH_CHECK(!data_parallel || !c.fuse.value_or(false), "push train",
             "--fuse does not combine with --data-parallel (data-parallel particles train unfused)");
  if (c.data_parallel == "daso") {
    const int per_node = parallel::DasoGroups::resolve_ranks_per_node(c.ranks_per_node, world->size());
    const char* source = c.ranks_per_node > 0                      ? ""
                         : std::getenv("LOCAL_WORLD_SIZE") != nullptr ? " (LOCAL_WORLD_SIZE)"
                                                                      : " (all of them: LOCAL_WORLD_SIZE is unset)";
    PUSH_CHECK(world->size() % per_node == 0 && world->size() / per_node >= 2, "push train",
               "--data-parallel daso needs at least 2 nodes of equal size: ", world->size(), " ranks with ",
               per_node, " ranks per node", source, " do not make them; set --ranks-per-node (e.g. ",
               std::max(1, world->size() / 2), ") to simulate nodes on one machine");
  }
  if (!lead) c.quiet = true;

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
  }
  // MultiSWAG's default pre-training is half of the epochs of the run that starts
  // training; a resumed run keeps the checkpoint's, whatever its new total.
  if (c.pretrain_epochs < 0) {
    const bool saved = resume_config.contains("pretrain_epochs") && resume_config["pretrain_epochs"].is_number_integer();
    c.pretrain_epochs = saved ? resume_config["pretrain_epochs"].get<int64_t>() : c.epochs / 2;
  }
  if (!c.resume.empty()) {
    const auto want = c.identity();  // items() refers to it: it must outlive the loop
    for (const auto& [key, value] : want.items()) {
      PUSH_CHECK(resume_config.contains(key) && resume_config[key] == value, "push train", "cannot resume from '",
                 c.resume, "': it was trained with ", key, "=",
                 resume_config.contains(key) ? resume_config[key].dump() : "(unset)", ", this run has ", key, "=",
                 value.dump());
    }
  }

  // ---- where the results go: checked now, not after training ----
  if (!c.save.empty()) {
    PUSH_CHECK(!paths_overlap(resolve_path(c.save), resolve_path(c.out)), "push train", "--save '", c.save,
               "' and --out '", c.out, "' overlap: push train replaces each folder as a whole, so neither may be "
               "or hold the other");
  }
  std::optional<StagedFolder> out, save;
  if (lead) {
    out.emplace(c.out, "push train", "--out", replaceable_outputs);
    if (!c.save.empty()) save.emplace(c.save, "push train", "--save", replaceable_checkpoint);
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
      .seed(c.seed)
      .fuse(!data_parallel && c.fuse.value_or(spec.kind != "cnn"));
  if (data_parallel) {
    options.data_parallel(bayes::DataParallelSpec(*world, bayes::parse_data_parallel_mode(c.data_parallel))
                              .ranks_per_node(c.ranks_per_node));
  } else {
    options.world(world);
  }
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

  // The band picture's predictions: collective too, so every rank makes them.
  const auto grid = band_grid(train_raw);
  std::optional<bayes::Predictive> band;
  if (grid) band = infer->predict((*grid - scaler.x_mean) / scaler.x_std);

  // ---- report (rank 0): nothing is written when a metric is not finite ----
  std::optional<Evaluation> evaluation;
  std::vector<std::string> pictures;
  std::exception_ptr failed;
  if (lead) {
    try {
      evaluation = evaluate(pred, test_raw, test, scaler, infer->losses());
      out->write("predictions.csv", evaluation->predictions_csv);
      pictures = write_pictures(*out, c, *evaluation, *infer, train_raw, scaler, grid, band);
    } catch (...) {
      failed = std::current_exception();
    }
  }

  // ---- checkpoint (collective: every rank writes its particles into rank 0's staging) ----
  // Rank 0 tells the others whether the run got this far and where the checkpoint goes.
  std::string staged = save ? save->path().string() : std::string();
  // Data-parallel: every rank holds the same particles, so rank 0 alone saves them.
  if (data_parallel && !lead) return 0;
  if (world && !data_parallel) {
    const auto verdict = infer->dist().all_gather(failed ? c10::IValue() : c10::IValue(staged), "push train: report").at(0);
    if (!lead && !verdict.isString()) return 1;  // rank 0 reports why
    if (!lead) staged = verdict.toStringRef();
  }
  if (failed) std::rethrow_exception(failed);
  if (!c.save.empty()) {
    Activity activity("cannot save the checkpoint to '" + c.save + "'");
    infer->save(fs::path(staged) / "checkpoint");
    if (save) save->write("config.json", c.identity().dump(2) + "\n");
  }
  if (!lead) return 0;

  const double total_s = seconds_since(t_start);
  json data_info = {{"name", c.data},
                    {"task", c.task},
                    {"train_size", train.size()},
                    {"test_size", test.size()},
                    {"input_shape", train.input_shape()},
                    {"classes", train.num_classes}};
  if (classify) data_info["class_labels"] = train_raw.class_labels;
  json doc = {{"algorithm", c.algo},
              {"config", c.identity()},
              {"run", {{"epochs", infer->epochs_done()}, {"ranks", world ? world->size() : 1}, {"devices", c.devices}, {"threads", c.threads}, {"fused", infer->fused()}, {"data_parallel", c.data_parallel.empty() ? "no" : c.data_parallel}, {"resumed_from", c.resume}}},
              {"data", data_info},
              {"metrics", evaluation->metrics},
              {"loss_curve", infer->losses()},
              {"timings", {{"load_s", load_s}, {"train_s", train_s}, {"predict_s", predict_s}, {"total_s", total_s}}},
              {"pictures", pictures}};
  out->write("metrics.json", doc.dump(2) + "\n");
  if (save) save->publish();
  out->publish();

  std::printf("%s on %s (%s): %d particles, %lld epochs, %lld train / %lld test points\n", c.algo.c_str(),
              c.data.c_str(), c.task.c_str(), c.particles, static_cast<long long>(infer->epochs_done()),
              static_cast<long long>(train.size()), static_cast<long long>(test.size()));
  std::printf("%-22s %12s\n", "test metric", "value");
  for (const auto& [name, value] : evaluation->table) std::printf("%-22s %12.4f\n", name.c_str(), value);
  std::printf("%-22s %12.2f\n", "train seconds", train_s);
  std::printf("outputs in %s\n", out->target().string().c_str());
  return 0;
}

}  // namespace

PUSH_CLI_COMMAND(train, "train a Bayesian distribution of networks (ensemble, mswag, svgd, mcdropout)", train_main);

}  // namespace push::cli
