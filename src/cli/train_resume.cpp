// Checking a run against the checkpoint it resumes.
#include "train_resume.h"

#include <push/core/errors.h>

#include <filesystem>
#include <fstream>

namespace push::cli {
namespace {

using json = nlohmann::ordered_json;

/// The config.json of the checkpoint at `dir`.
json read_checkpoint_config(const std::string& dir) {
  std::ifstream in(std::filesystem::path(dir) / "config.json");
  PUSH_CHECK(in, "push train", "no checkpoint to resume at '", dir, "' (missing config.json)");
  try {
    return json::parse(in);
  } catch (const json::exception&) {
    throw Error(c10::str("[push train] '", dir, "/config.json' is not valid JSON"));
  }
}

}  // namespace

void match_checkpoint(TrainConfig& c) {
  const json saved = c.resume.empty() ? json() : read_checkpoint_config(c.resume);
  if (c.pretrain_epochs < 0) {
    const bool kept = saved.contains("pretrain_epochs") && saved["pretrain_epochs"].is_number_integer();
    c.pretrain_epochs = kept ? saved["pretrain_epochs"].get<int64_t>() : c.epochs / 2;
  }
  // Checkpoints written before --lr-schedule trained at a constant rate.
  json have = saved;
  if (!c.resume.empty() && !have.contains("lr_schedule")) have["lr_schedule"] = "constant";
  if (c.lr_schedule.empty()) {
    const bool kept = have.contains("lr_schedule") && have["lr_schedule"].is_string();
    c.lr_schedule = kept ? have["lr_schedule"].get<std::string>() : c.algo == "mswag" ? "constant" : "cosine";
    PUSH_CHECK(c.lr_schedule == "cosine" || c.lr_schedule == "constant", "push train", "cannot resume from '", c.resume,
               "': its config.json has lr_schedule=\"", c.lr_schedule, "\" (cosine or constant)");
  }
  if (c.resume.empty()) return;
  const auto want = c.identity();  // items() refers to it: it must outlive the loop
  for (const auto& [key, value] : want.items()) {
    PUSH_CHECK(have.contains(key) && have[key] == value, "push train", "cannot resume from '", c.resume,
               "': it was trained with ", key, "=", have.contains(key) ? have[key].dump() : "(unset)",
               ", this run has ", key, "=", value.dump());
  }
}

}  // namespace push::cli
