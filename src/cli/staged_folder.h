#pragma once
// Output folders that are published whole or not at all.
//
//   StagedFolder out("runs/iris", "--out", push_train_outputs);  // checks, before any work
//   out.write("metrics.json", text);          // into .iris.partial-<pid>, beside runs/iris
//   out.publish();                            // one rename: the old runs/iris, or the new one
//
// A folder is written in full in a staging folder beside its target, then swapped into
// place with renameat2(RENAME_EXCHANGE) (the target's previous contents are deleted only
// after the swap), so a crash at any moment leaves the old folder or the new one, never a
// mix. Every write is checked and synced; a failure is a push::Error naming the file and
// the reason (e.g. "No space left on device"). Staging folders left by killed runs (their
// process is gone and nobody holds their lock) are removed by the next run.
#include <filesystem>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

namespace push::cli {

/// `path` absolute and normalised, with the symbolic links of its existing part resolved.
std::filesystem::path resolve_path(const std::filesystem::path& path);
/// Whether the resolved path `inner` is `outer` or lies inside it.
bool path_contains(const std::filesystem::path& outer, const std::filesystem::path& inner);
/// Whether two resolved paths are the same folder or one lies inside the other.
bool paths_overlap(const std::filesystem::path& a, const std::filesystem::path& b);

/// Writes `bytes` to `path` and syncs it; errors name `shown` (default: path).
void write_file(const std::filesystem::path& path, std::string_view bytes, const std::string& shown = "");

class StagedFolder {
 public:
  /// What an existing target may hold: returns "" when `dir` may be replaced, else why
  /// not (e.g. "it holds 'notes.txt', which push train did not write").
  using Replaceable = std::function<std::string(const std::filesystem::path& dir)>;

  /// Checks `target` (an option's value; `option` names it in errors, e.g. "--out") and
  /// makes its staging folder, creating missing parents: an unwritable or full place
  /// fails here, before any work is done.
  StagedFolder(const std::filesystem::path& target, std::string option, const Replaceable& replaceable);
  /// Removes the staging folder (and the parents it created) unless published.
  ~StagedFolder();
  StagedFolder(const StagedFolder&) = delete;
  StagedFolder& operator=(const StagedFolder&) = delete;

  const std::filesystem::path& target() const { return target_; }
  /// Where to write (the staging folder).
  const std::filesystem::path& path() const { return staging_; }
  /// Writes `bytes` to the file `name` of the folder.
  void write(const std::string& name, std::string_view bytes) const;
  /// Syncs everything in the staging folder and swaps it into place in one step.
  void publish();

  /// Removes every staging folder not yet published; for a last-resort exit.
  static void abandon_all() noexcept;

 private:
  void discard() noexcept;

  std::filesystem::path target_, staging_;
  std::string option_;
  Replaceable replaceable_;
  std::vector<std::filesystem::path> created_;  // parents made for the target, outermost first
  int lock_ = -1;                               // flock on the staging folder: "in use"
  bool published_ = false;
};

}  // namespace push::cli
