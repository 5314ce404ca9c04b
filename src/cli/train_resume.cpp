// Checking a run against the checkpoint it resumes.
#include "train_resume.h"

#include <push/core/errors.h>

#include <filesystem>
#include <fstream>

#include "core/user_text.h"
#include "train_choices.h"
#include "train_folders.h"

namespace push::cli {
namespace {

using json = nlohmann::ordered_json;

/// The config.json of the checkpoint at `dir`, checked.
json read_checkpoint_json(const std::string& dir) {
  const std::string text = read_checkpoint_config(dir);
  try {
    return json::parse(text);
  } catch (const json::exception&) {
    throw Error(c10::str("[push train] '", dir, "/config.json' is not valid JSON"));
  }
}

}  // namespace

void match_checkpoint(TrainConfig& c) {
  const json saved = c.resume.empty() ? json() : read_checkpoint_json(c.resume);
  if (c.pretrain_epochs < 0) {
    const bool kept = saved.contains("pretrain_epochs") && saved["pretrain_epochs"].is_number_integer();
    c.pretrain_epochs = kept ? saved["pretrain_epochs"].get<int64_t>() : c.epochs / 2;
  }
  if (c.burn_in < 0) {
    const bool kept = saved.contains("burn_in") && saved["burn_in"].is_number_integer();
    c.burn_in = kept ? saved["burn_in"].get<int64_t>() : c.cycles > 0 ? 0 : c.epochs / 2;
  }
  if (!c.lr_schedule) {
    const bool kept = saved.contains("lr_schedule") && saved["lr_schedule"].is_string();
    const std::vector<LrSchedule> schedules{LrSchedule::cosine, LrSchedule::constant};
    if (kept) {
      const auto text = saved["lr_schedule"].get<std::string>();
      c.lr_schedule = parse_named(text, schedules);
      PUSH_CHECK(c.lr_schedule.has_value(), "push train", "cannot resume from '", c.resume,
                 "': its config.json has lr_schedule=\"", push::detail::printable(text), "\" (",
                 names_of(schedules, /*with_or=*/true), ")");
    } else {
      c.lr_schedule = c.algo == Algo::mswag || is_sgmcmc(c.algo) ? LrSchedule::constant : LrSchedule::cosine;
    }
  }
  if (!c.preconditioned) {
    // A checkpoint older than the default (or than the option) trained plain SGLD.
    const bool kept = saved.contains("preconditioned") && saved["preconditioned"].is_boolean();
    c.preconditioned = c.algo == Algo::sgld && (kept ? saved["preconditioned"].get<bool>() : c.resume.empty());
  }
  // SGHMC's steps add up in its momentum (about 1 / --friction of them), pSGLD's are
  // scaled up by its preconditioner: both diverged at Adam's 0.01 on sine-gap.
  if (!c.given.count("--lr") && (c.algo == Algo::sghmc || (c.algo == Algo::sgld && *c.preconditioned))) c.lr = 1e-3;
  if (c.resume.empty()) return;
  const int64_t done = saved.value("epochs", int64_t{0});
  PUSH_CHECK(c.epochs >= done, "push train", "--epochs ", c.epochs, " is fewer than the ", done,
             " epochs the checkpoint '", c.resume, "' has trained (--epochs counts them all, resumed ones included)");
  const auto want = c.identity();  // items() refers to it: it must outlive the loop
  // The data are known by their fingerprint, not by the text of their path: ./x.csv and
  // its absolute path are the same data, and --allow-data-change lets a file of another
  // name go on.
  const bool same_data = saved.contains("data_fingerprint") && saved["data_fingerprint"] == c.data_fingerprint;
  for (const auto& [key, value] : want.items()) {
    const bool same = saved.contains(key) && saved[key] == value;
    if (key == "data" && (same_data || c.allow_data_change)) continue;
    if (key == "data_fingerprint") {
      PUSH_CHECK(same || c.allow_data_change, "push train", "cannot resume from '", c.resume,
                 "': the data differ from those it was trained on (fingerprint ", saved.value(key, "(none)"), ", now ",
                 c.data_fingerprint, "); add --allow-data-change to train it on these");
      continue;
    }
    // A setting newer than the checkpoint matches when this run leaves it off (0, false,
    // ""): the run trains as the version that wrote it did.
    const bool neutral = value == 0 || value == false || value == "";
    PUSH_CHECK(same || (!saved.contains(key) && neutral), "push train", "cannot resume from '", c.resume,
               "': it was trained with ", key, "=", saved.contains(key) ? saved[key].dump() : "(unset)",
               ", this run has ", key, "=", value.dump());
  }
}

}  // namespace push::cli
