// Saving push train's checkpoint across ranks.
#include "train_checkpoint.h"

#include <filesystem>
#include <string>

#include "last_resort.h"
#include "train_folders.h"

namespace push::cli {

std::optional<int> save_checkpoint(const TrainConfig& c, bayes::Infer& infer, const TrainRanks& ranks,
                                   const std::optional<push::detail::StagedFolder>& save,
                                   std::exception_ptr report_failed) {
  const bool lead = ranks.lead(), data_parallel = c.data_parallel.has_value();
  std::string staged = save ? save->path().string() : std::string();
  if (data_parallel && !lead) return 0;
  if (ranks.world && !data_parallel) {
    const auto verdict = infer.distribution()
                             .all_gather(report_failed ? c10::IValue() : c10::IValue(staged), "push train: report")
                             .at(0);
    if (!lead && !verdict.isString()) return 1;  // rank 0 reports why
    if (!lead) staged = verdict.toStringRef();
  }
  if (report_failed) std::rethrow_exception(report_failed);
  if (!c.save.empty()) {
    Activity activity("cannot save the checkpoint to '" + c.save + "'");
    infer.save(std::filesystem::path(staged) / "checkpoint");
    if (save) {
      auto config = c.identity();
      config["epochs"] = infer.epochs_done();  // not identity: a resumed run trains on to a new total
      write_checkpoint_config(*save, config.dump(2) + "\n");
    }
  }
  if (!lead) return 0;
  return std::nullopt;
}

}  // namespace push::cli
