// push train: trains a distribution of networks (deep ensemble, MultiSWAG, SVGD or MC
// dropout) on built-in or CSV/IDX data and writes its predictive uncertainty: a metrics
// table on stdout, and metrics.json, predictions.csv and PNG pictures in --out.
//   push train                                   # ensemble on the 1-D sine-with-a-gap set
//   push train --algo svgd --data iris --epochs 100 --out runs/iris
// Everything is checked before training: the input, and that --out and --save can be
// written (core/staged_folder.h). Outputs and the checkpoint are written in staging folders
// and published whole, only when the run succeeded (finite metrics, every write checked).
// The parts, in the order a run takes them: train_command_line.h, train_folders.h,
// train_ranks.h, train_checks.h, train_data.h, train_infer.h, train_resume.h, progress_bar.h,
// train_report.h, train_warnings.h, train_pictures.h, train_checkpoint.h.
#include <push/bayes.h>

#include <csignal>
#include <exception>
#include <filesystem>
#include <iostream>
#include <optional>
#include <string>
#include <vector>

#include "command.h"
#include "core/user_text.h"
#include "last_resort.h"
#include "progress_bar.h"
#include "stopwatch.h"
#include "train_checkpoint.h"
#include "train_checks.h"
#include "train_command_line.h"
#include "train_config.h"
#include "train_data.h"
#include "train_data_handoff.h"
#include "train_folders.h"
#include "train_infer.h"
#include "train_pictures.h"
#include "train_ranks.h"
#include "train_report.h"
#include "train_resume.h"
#include "train_warnings.h"

namespace push::cli {
namespace {

/// What a run needs before it makes its particles, every input checked: the model, the
/// data, the likelihood and the networks' factory; the checkpoint's settings matched and
/// the memory estimated. `ranks` (`ranks_on_host` of them on this machine) share the work.
struct Prepared {
  bayes::ModelSpec spec;
  TrainData data;
  bayes::Likelihood likelihood;
  ModuleFactory model;
};

Prepared prepare(TrainConfig& c, int ranks, int ranks_on_host) {
  check_options_apply(c);
  Prepared p;
  p.spec = bayes::parse_model_spec(c.model);
  p.data = load_train_data(c);
  p.likelihood = likelihood_of(c, p.data.classify());
  match_checkpoint(c);
  settle_chains(c, p.data.train.size());
  check_collection(c, p.data.train.size());
  // The networks first, before any is built; then (laplace) one scratch network tells the
  // last layer, whose covariances count too.
  const double parameters = train_model_parameters(p.spec, p.data, p.likelihood);
  check_memory(c, parameters, ranks, ranks_on_host);
  p.model = make_train_model(c, p.spec, p.data, p.likelihood);
  if (c.algo == Algo::laplace) {
    const int64_t last_layer = bayes::last_layer_parameters(p.model);
    PUSH_CHECK(c.laplace_structure == bayes::LaplaceStructure::diagonal || last_layer <= bayes::kMaxFullParameters,
               "push train", "--model ", c.model, " has ", last_layer,
               " parameters in its last layer, too many for a full covariance (at most ", bayes::kMaxFullParameters,
               "): use --laplace-structure diagonal");
    check_memory(c, parameters, ranks, ranks_on_host, last_layer);
  }
  return p;
}

int run_train(int argc, char** argv) {
  const Stopwatch total;
  Timings timings;
  TrainConfig c;
  if (const auto exit_status = parse_train_command_line(argc, argv, c)) return *exit_status;
  check_nodes(c);
  // Before any BLAS call: under a limit too small for OpenBLAS's buffers, its threads retry
  // their allocation forever and the process could not even exit (the full check, with the
  // particles, follows once the model is known).
  check_address_space(c, 0);
  check_stack();
  const bool starts_ranks = starts_its_ranks(c);
  // Where the results go: checked (on the rank that writes them: rank 0, on node 0) before
  // the ranks meet, so that a refused --out or --save ends the run at once with one line,
  // on every rank.
  std::optional<TrainFolders> folders(std::in_place, c,
                                      dist::WorldOptions::launched_rank().value_or(c.node_rank * c.nproc) == 0);
  if (starts_ranks) {
    // Several ranks started here (--nproc, --nnodes): whatever would fail on every rank
    // fails here first, as one line, before any rank starts.
    check_data_parallel(c, started_ranks(c));
    TrainConfig checked = c;
    settle_devices(checked);
    const Prepared prepared = prepare(checked, started_ranks(c), c.nproc);
    // The ranks take the rows loaded here rather than load --data again.
    hand_rows_to_ranks(c, {prepared.data.train_raw, prepared.data.test_raw});
    folders.reset();
    return relaunch(argc, argv, c);
  }
  const TrainRanks ranks = join_ranks(c);
  if (!ranks.lead()) c.quiet = true;
  settle_devices(c);
  if (ranks.lead()) warn_about_threads(c);

  // ---- check everything before anything is written ----
  const int on_host = ranks.world ? dist::WorldOptions::launched_local_world_size().value_or(1) : 1;
  const Prepared prepared = prepare(c, ranks.size(), on_host);
  const auto& [spec, data, likelihood, model] = prepared;
  timings.load_s = data.load_s;

  ProgressBar bar(c.particles, c.quiet);
  auto options = infer_options(c, spec, likelihood, ranks.world);
  options.on_progress([&bar](const bayes::Progress& p) { bar.update(p); });
  auto [infer, after_fit] = make_infer(c, model, options);
  if (!c.resume.empty()) infer->load(std::filesystem::path(c.resume) / "checkpoint");

  // ---- train and predict (collective: every rank takes part) ----
  const int64_t first = infer->epochs_done(), todo = std::max<int64_t>(0, c.epochs - first);
  bar.start(first, first + todo);
  const Stopwatch training;
  infer->fit(data.train, todo);
  // laplace: each particle's last-layer posterior, on the training set (collective).
  if (after_fit) after_fit(data.train);
  timings.train_s = training.seconds();
  const Stopwatch predicting;
  auto pred = infer->predict(data.test.x);
  timings.predict_s = predicting.seconds();
  std::optional<torch::Tensor> band;  // 1-D regression: the predictive band, band.csv and its picture
  if (const auto grid = band_grid(data.train_raw)) {
    band = band_table(*grid, infer->predict(data.scaler.scale_x(*grid)), data.scaler);
  }

  // ---- report (rank 0): nothing is written when a metric is not finite ----
  std::optional<Evaluation> evaluation;
  std::vector<bayes::MemberWarning> warnings;
  std::optional<bayes::ChainMixing> mixing;
  std::vector<std::string> pictures;
  std::exception_ptr report_failed;
  if (ranks.lead()) {
    try {
      evaluation = evaluate(pred, data.test_raw, data.test, data.scaler, infer->losses());
      warnings = member_warnings(c, *infer, pred, data);
      report_warnings(c, *infer, warnings);  // with --strict: fails the run
      mixing = report_mixing(c, pred);
      folders->out->write("predictions.csv", evaluation->predictions_csv);
      if (band) folders->out->write("band.csv", band_csv(*band));
      pictures = write_pictures(*folders->out, c, *evaluation, *infer, data.train_raw, band);
    } catch (...) {
      report_failed = std::current_exception();
    }
  }
  if (const auto exit_status = save_checkpoint(c, *infer, ranks, folders->save, report_failed)) return *exit_status;

  // ---- publish (rank 0) ----
  timings.total_s = total.seconds();
  auto doc = metrics_document(c, *infer, ranks.size(), data, *evaluation, timings, pictures);
  doc["warnings"] = warnings_json(c, *infer, warnings);
  if (mixing) doc["mixing"] = mixing_json(*mixing);
  doc["particle_losses"] = particle_losses_json(*infer);
  folders->out->write("metrics.json", doc.dump(2) + "\n");
  folders->publish();
  print_summary(c, *infer, data, *evaluation, timings.train_s, folders->out->target());
  return 0;
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
    std::cerr << "push train: " << push::detail::printable(msg.substr(0, msg.find('\n')), std::string::npos) << "\n";
    return 1;
  }
}

}  // namespace

PUSH_CLI_COMMAND(train, "train a Bayesian distribution of networks (ensemble, mswag, svgd, mcdropout, sgld, sghmc)",
                 train_main);

}  // namespace push::cli
