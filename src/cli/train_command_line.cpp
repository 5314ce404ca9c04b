// The options of push train, with their help texts, defaults and allowed values.
#include "train_command_line.h"

#include <CLI/CLI.hpp>

#include <charconv>
#include <cmath>
#include <cstdint>
#include <functional>
#include <iostream>
#include <limits>

#include "core/user_text.h"
#include "train_choices.h"

namespace push::cli {

namespace {

constexpr double kNoLimit = std::numeric_limits<double>::infinity();

/// A finite decimal number from `lo` to `hi` (each excluded when `open_lo`, `open_hi`):
/// NaN and infinity are refused by name, and the message states the range as a person would.
CLI::Validator decimal_in(double lo, double hi, bool open_lo = false, bool open_hi = false) {
  std::string range = open_lo ? c10::str("greater than ", lo) : c10::str("at least ", lo);
  if (hi < kNoLimit) {
    range = open_lo || open_hi ? c10::str(range, open_hi ? " and less than " : " and at most ", hi)
                               : c10::str("from ", lo, " to ", hi);
  }
  return CLI::Validator(
      [=](std::string& text) -> std::string {
        const auto v = push::detail::parse_decimal(text);
        const std::string shown = "'" + push::detail::printable(text) + "'";
        if (!v || !std::isfinite(*v)) return shown + " is not a finite decimal number (it must be " + range + ")";
        if ((open_lo ? *v <= lo : *v < lo) || (open_hi ? *v >= hi : *v > hi)) return shown + " must be " + range;
        return "";
      },
      "");
}

/// A whole number from `lo` to `hi`.
CLI::Validator whole(int64_t lo, int64_t hi) {
  return CLI::Validator(
      [=](std::string& text) -> std::string {
        if (push::detail::parse_whole(text, lo, hi)) return "";
        return c10::str("'", push::detail::printable(text), "' must be a whole number from ", lo, " to ", hi);
      },
      "");
}

// --devices: N lanes on what the machine has, or the device type with an optional count.
void parse_devices(const std::string& text, TrainConfig& c) {
  auto digits = [](const std::string& t) {
    return !t.empty() && t.find_first_not_of("0123456789") == std::string::npos;
  };
  const auto colon = text.find(':');
  const std::string head = text.substr(0, colon);
  std::string count;
  if (head == "cpu" || head == "cuda") {
    c.device_type = head;
    if (colon == std::string::npos) return;
    count = text.substr(colon + 1);
  } else if (colon == std::string::npos && digits(text)) {
    count = text;
  } else {
    throw CLI::ValidationError("--devices",
                               "'" + push::detail::printable(text) + "' is not N, cpu, cpu:N, cuda or cuda:N");
  }
  // Read as every whole number of the command line is (0001 is 1).
  const auto n = push::detail::parse_whole(count, 1, 256);
  if (!n) {
    throw CLI::ValidationError(
        "--devices", "'" + push::detail::printable(text) + "': the lane count must be a whole number from 1 to 256");
  }
  c.devices = static_cast<int>(*n);
}

/// An option that takes one of `values` by name (train_choices.h): `set` gets the value; any
/// other word is one line naming the choices. --help shows them as CLI11 shows a set.
template <class E>
CLI::Option* add_choice(CLI::App& app, const std::string& name, std::vector<E> values, std::function<void(E)> set,
                        const std::string& help) {
  std::string shown;
  for (E v : values) shown += std::string(shown.empty() ? "" : ",") + to_string(v);
  return app
      .add_option_function<std::string>(
          name,
          [=](const std::string& text) {
            const auto value = parse_named(text, values);
            if (!value) {
              throw CLI::ValidationError(
                  name, "'" + push::detail::printable(text) + "' is not " + names_of(values, /*with_or=*/true));
            }
            set(*value);
          },
          help)
      ->type_name("TEXT:{" + shown + "}");
}

}  // namespace

std::optional<int> parse_train_command_line(int argc, char** argv, TrainConfig& c) {
  const auto up_to_2_40 = whole(1, int64_t{1} << 40);
  const auto up_to_100000 = whole(1, 100000);
  CLI::App app{"push train: train a distribution of networks and report its predictive uncertainty", "push train"};
  add_choice<Algo>(
      app, "--algo", every_algo(), [&c](Algo a) { c.algo = a; },
      "ensemble, mswag (MultiSWAG), svgd, mcdropout, sgld (stochastic gradient Langevin dynamics) or sghmc "
      "(stochastic gradient Hamiltonian Monte Carlo): each particle one chain, or laplace (each particle trained as "
      "an ensemble member, then a last-layer Laplace approximation)")
      ->default_str(to_string(c.algo));
  app.add_option("--particles", c.particles, "networks in the distribution")
      ->check(whole(1, 100000))
      ->capture_default_str();
  app.add_option_function<std::string>(
         "--devices", [&c](const std::string& text) { parse_devices(text, c); },
         "device lanes: N, cpu, cpu:N, cuda or cuda:N (default: every GPU, else 2 CPU lanes, 1 on a one-core machine)")
      ->type_name("N|cpu[:N]|cuda[:N]");
  // Small networks gain nothing from intra-op parallelism, and on a busy machine its
  // spinning threads cost more than they give: one per lane unless asked.
  app.add_option("--threads", c.threads, "intra-op threads per lane")->check(whole(1, 1024))->capture_default_str();
  app.add_option("--epochs", c.epochs, "training epochs (in all, counting resumed ones)")
      ->check(whole(0, int64_t{1} << 40))
      ->capture_default_str();
  app.add_option("--batch-size", c.batch_size, "minibatch size")->check(up_to_2_40)->capture_default_str();
  app.add_option("--lr", c.lr,
                 "learning rate (Adam; mswag collects with SGD, see --swag-lr; sgld, sghmc: the step size per "
                 "training point, default 0.001 for sghmc and pSGLD)")
      ->check(decimal_in(0, kNoLimit, true))
      ->capture_default_str();
  add_choice<LrSchedule>(
      app, "--lr-schedule", {LrSchedule::cosine, LrSchedule::constant}, [&c](LrSchedule v) { c.lr_schedule = v; },
      "cosine (the learning rate falls as a half cosine to 0 over --epochs; mswag: over its pretraining; "
      "a resumed run: over its new --epochs) or constant (default: cosine, for mswag constant; when "
      "resuming, the checkpoint's)");
  app.add_option("--model", c.model, "mlp:W1,W2,... or cnn[:C1,C2] (image data)")->capture_default_str();
  app.add_option("--data", c.data,
                 "built-in set (sine-gap, boston_house_prices, diabetes, iris, wine, breast_cancer, digits, "
                 "fashion-mnist), a CSV file with a header row, or an IDX directory")
      ->capture_default_str();
  app.add_option("--target", c.target, "target column of a CSV file (default: the last)");
  app.add_option("--task", c.task, "regression or classification (default: the data set's, regression for CSV)")
      ->check(CLI::IsMember({"regression", "classification"}));
  add_choice<bayes::Likelihood>(
      app, "--likelihood",
      {bayes::Likelihood::gaussian, bayes::Likelihood::heteroscedastic, bayes::Likelihood::learned_noise},
      [&c](bayes::Likelihood v) { c.likelihood = v; },
      "regression likelihood: heteroscedastic (the network predicts its noise; default), learned-noise "
      "(each particle learns one noise precision, Gamma(1, 0.1) prior, as in the SVGD paper) or gaussian "
      "(fixed --noise-std)");
  app.add_option("--noise-std", c.noise_std, "noise σ of the gaussian likelihood, in standardised units")
      ->check(decimal_in(0, kNoLimit, true))
      ->capture_default_str();
  app.add_option("--prior-std", c.prior_std, "σ of the Gaussian prior on the weights")
      ->check(decimal_in(0, kNoLimit, true))
      ->capture_default_str();
  app.add_option("--test-fraction", c.test_fraction, "held-out fraction (not for IDX data)")
      ->check(decimal_in(0, 1, true, true))
      ->capture_default_str();
  app.add_option("--limit", c.limit, "use at most this many training and test rows (0: all)")
      ->check(whole(0, int64_t{1} << 40));
  app.add_option_function<std::string>(
         "--seed",
         [&c](const std::string& text) {
           // CLI11 would wrap -1 to 2^64-1 and clamp what is beyond: read it here.
           uint64_t seed = 0;
           const auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), seed);
           if (text.empty() || error != std::errc() || end != text.data() + text.size()) {
             throw CLI::ValidationError("--seed", "'" + push::detail::printable(text) +
                                                      "' must be a whole number from 0 to 18446744073709551615");
           }
           c.seed = seed;
         },
         "seed of the split, initialisation, shuffling and sampling (default 0)")
      ->type_name("UINT64");
  app.add_option("--samples", c.samples,
                 "samples per particle at prediction (mswag, mcdropout; laplace with --laplace-predictive sampling), "
                 "or that each chain keeps, the latest, and predicts with (sgld, sghmc)")
      ->check(up_to_100000)
      ->capture_default_str();
  app.add_option("--rank", c.rank, "deviation columns K")->check(up_to_100000)->capture_default_str();
  app.add_option("--pretrain-epochs", c.pretrain_epochs,
                 "epochs before collecting moments (default: half of --epochs; when resuming, the checkpoint's)")
      ->check(whole(0, int64_t{1} << 40));
  app.add_option("--swag-lr", c.swag_lr,
                 "learning rate of the collection phase, SGD with momentum 0.9 (default: --lr x 0.1)")
      ->check(decimal_in(0, kNoLimit, true));
  app.add_option("--collect-every", c.collect_every, "collect every this many steps (default 0: every epoch)")
      ->check(whole(0, int64_t{1} << 40));
  app.add_option("--prior-scale", c.prior_scale,
                 "randomized prior functions: each particle adds this times the output of a frozen network of the "
                 "same --model, initialised under its own seed (Osband et al. 2018; default 0: none)")
      ->check(decimal_in(0, kNoLimit))
      ->capture_default_str();
  bool laplace = false;
  app.add_flag("--laplace", laplace,
               "approximate each trained member's last layer by a Laplace (a mixture of Laplaces; the same "
               "as --algo laplace)");
  add_choice<bayes::LaplaceStructure>(
      app, "--laplace-structure", {bayes::LaplaceStructure::full, bayes::LaplaceStructure::diagonal},
      [&c](bayes::LaplaceStructure v) { c.laplace_structure = v; }, "the last layer's covariance, full or diagonal")
      ->default_str(bayes::to_string(c.laplace_structure));
  add_choice<bayes::LaplacePredictive>(
      app, "--laplace-predictive", {bayes::LaplacePredictive::linearized, bayes::LaplacePredictive::sampling},
      [&c](bayes::LaplacePredictive v) { c.laplace_predictive = v; },
      "linearized (closed form; probit for classes) or sampling (--samples last layers)")
      ->default_str(bayes::to_string(c.laplace_predictive));
  app.add_option("--laplace-prior-precision", c.laplace_prior_precision,
                 "the last layer's prior precision (default: the marginal likelihood's maximiser)")
      ->check(decimal_in(0, kNoLimit, true));
  app.add_option("--friction", c.friction, "the fraction of the momentum lost per step, in (0, 1]")
      ->check(decimal_in(0, 1, true))
      ->capture_default_str();
  bool preconditioned = false, plain = false;
  auto* precondition = app.add_flag("--preconditioned", preconditioned,
                                    "precondition with RMSprop's second moment: pSGLD, the default (plain SGLD's "
                                    "steps fit the built-in sets poorly; when resuming, the checkpoint's choice)");
  auto* no_precondition =
      app.add_flag("--no-preconditioned", plain, "plain SGLD, without pSGLD's preconditioner")->excludes(precondition);
  app.add_option("--cycles", c.cycles,
                 "cycles of a cyclical step size over --epochs, each half exploring (no noise) and half "
                 "sampling (cSG-MCMC; default 0: a constant step size)")
      ->check(whole(0, int64_t{1} << 40));
  app.add_option("--burn-in", c.burn_in,
                 "epochs before samples are kept (default: half of --epochs, 0 with --cycles; when "
                 "resuming, the checkpoint's)")
      ->check(whole(0, int64_t{1} << 40));
  app.add_option("--thin", c.thin,
                 "keep one sample in this many steps (default: --samples spread over the sampling steps)")
      ->check(whole(1, int64_t{1} << 40));
  app.add_option("--dropout", c.dropout, "dropout probability")->check(decimal_in(0, 0.95))->capture_default_str();
  app.add_flag("--bootstrap", c.bootstrap, "train each particle on a bootstrap resample");
  app.add_option("--bandwidth", c.bandwidth, "RBF bandwidth h (default: median heuristic)")
      ->check(decimal_in(0, kNoLimit, true));
  app.add_option("--out", c.out, "output folder")->capture_default_str();
  app.add_option("--save", c.save, "write a checkpoint (particles + config) to this folder");
  app.add_option("--resume", c.resume, "continue from a checkpoint written by --save with the same configuration");
  app.add_flag("--quiet", c.quiet, "no progress bar");
  auto* fuse = app.add_flag_callback(
      "--fuse", [&c] { c.fuse = true; },
      "train each lane's particles as one stacked computation (the default for MLPs; "
      "models it cannot fuse train unfused)");
  app.add_flag_callback(
         "--no-fuse", [&c] { c.fuse = false; }, "train particles one by one (the default for the CNN)")
      ->excludes(fuse);
  add_choice<bayes::DataParallelMode>(
      app, "--data-parallel",
      {bayes::DataParallelMode::blocking, bayes::DataParallelMode::nonblocking, bayes::DataParallelMode::daso},
      [&c](bayes::DataParallelMode v) { c.data_parallel = v; },
      "blocking, nonblocking or daso: every rank trains every particle on its share of each epoch's rows "
      "(needs several ranks; default: the particles are spread over the ranks)");
  app.add_option("--ranks-per-node", c.ranks_per_node,
                 "daso: ranks per node, consecutive ranks (default: LOCAL_WORLD_SIZE); a divisor of the ranks that "
                 "leaves at least 2 nodes, e.g. 2 of 4 to simulate 2 nodes on one machine")
      ->check(whole(1, 1024));
  app.add_option("--nproc", c.nproc,
                 "start N local ranks (as push launch does) that train one distribution; under push launch, "
                 "torchrun --no-python or mpirun the job's ranks are used instead")
      ->check(whole(1, 1024))
      ->capture_default_str();
  app.add_option("--nnodes", c.nnodes,
                 "hosts of one job: run the same push train on each with its --node-rank, node 0's --master-addr, "
                 "a --master-port, and one PUSH_JOB_SECRET in every host's environment (each host starts --nproc "
                 "ranks)")
      ->check(whole(1, 1024))
      ->capture_default_str();
  app.add_option("--node-rank", c.node_rank, "with --nnodes: this host's place, 0 to --nnodes - 1")
      ->check(whole(0, 1023));
  app.add_option("--master-addr", c.master_addr, "with --nnodes: the address of node 0, which hosts the job's store");
  app.add_option("--master-port", c.master_port, "with --nnodes: the port of the job's store on node 0")
      ->check(whole(1, 65535));
  app.add_flag("--allow-data-change", c.allow_data_change,
               "with --resume: continue although the data differ from the checkpoint's (its fingerprint)");
  app.add_flag("--strict", c.strict,
               "fail the run (writing nothing) when a particle trained badly: its training loss ended far above its "
               "best, or it predicts the test set worse than the training mean; or when a regression's predictive "
               "intervals are far too wide or narrow for its test errors (default: a warning)");
  // Each option of some algorithms only says which, from the one table.
  for (const auto& [name, algos] : algo_options()) {
    auto* option = app.get_option(name);
    option->description(names_of(algos) + ": " + option->get_description());
  }
  try {
    app.parse(argc, argv);
    for (const auto* option : app.get_options()) {
      if (option->count() > 0) c.given.insert(option->get_name());
    }
    if (precondition->count() > 0 || no_precondition->count() > 0) c.preconditioned = precondition->count() > 0;
    // --algo ensemble --laplace is --algo laplace: one algorithm, one name in metrics.json
    // and checkpoints. With another algorithm, check_options_apply names the misfit.
    if (laplace && c.algo == Algo::ensemble) c.algo = Algo::laplace;
  } catch (const CLI::CallForHelp&) {
    std::cout << app.help();
    return 0;
  } catch (const CLI::ParseError& e) {
    std::cerr << "push train: " << push::detail::printable(e.what(), std::string::npos) << " (see push train --help)\n";
    return 2;
  }
  return std::nullopt;
}

}  // namespace push::cli
