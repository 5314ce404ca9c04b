#pragma once
// Folders that are published whole or not at all: push train's --out and --save, and every
// checkpoint push::Push::save writes.
//
//   StagedFolder out("runs/iris", "push train", "--out", push_train_outputs);  // checked now
//   out.write("metrics.json", text);   // into .iris.partial-<pid>-<n>, beside runs/iris
//   out.publish();                     // one rename: the old runs/iris, or the new one
//
// A folder is written in full in a staging folder beside its target, then swapped into
// place with renameat2(RENAME_EXCHANGE) (the target's previous contents are deleted only
// after the swap), so a crash at any moment leaves the old folder or the new one, never a
// mix. Every write is checked and synced; a failure is a push::Error naming the file and
// the reason (e.g. "No space left on device"). Each staging folder has a claim beside it,
// `.NAME.partial-PID-N.claim`, made first and removed last, naming the folder and the
// process. Staging folders left by killed runs are removed by the next run only when push
// provably made them: folder and claim are this user's, the claim names the folder and
// its pid, that process is gone and nobody holds the folder's lock. A folder merely named
// like one (a user's `.results.partial-2024-01`) is never touched.
#include <filesystem>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

namespace push::detail {

class StagedFolder {
 public:
  /// What an existing target may hold: returns "" when `dir` may be replaced, else why
  /// not (e.g. "holds 'notes.txt', which push train did not write").
  using Replaceable = std::function<std::string(const std::filesystem::path& dir)>;

  /// Checks `target` and makes its staging folder, creating missing parents: an
  /// unwritable or full place fails here, before any work is done. Errors are
  /// "[origin] what 'target' ..." (`what` names the folder: "--out", "checkpoint").
  StagedFolder(const std::filesystem::path& target, std::string origin, std::string what,
               const Replaceable& replaceable);
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
  /// Publishes both or neither: both targets are checked before either is swapped, and
  /// when the second swap fails the first is swapped back (push train's --save and --out).
  static void publish_together(StagedFolder& first, StagedFolder& second);

  /// Removes every staging folder not yet published; for a last-resort exit.
  static void abandon_all() noexcept;

 private:
  void discard() noexcept;
  /// Whether publish can go ahead: not yet published, the target (if any) still
  /// replaceable and writable throughout, its folder writable.
  void check_publishable() const;
  /// Checks the target again and exchanges the (synced) staging folder with it; the
  /// previous contents (if any) are left under the staging name, for finish() or swap_back().
  void swap_in();
  /// Undoes swap_in, best effort (the caller is already failing).
  void swap_back() noexcept;
  /// Deletes the previous contents and syncs the target's folder.
  void finish();
  /// push::Error "[origin] <what> is read-only ..." when `dir` or a folder in it has no
  /// owner write permission (`what`: "--out 'runs/a'").
  static void check_writable_tree(const std::filesystem::path& dir, const char* origin, const std::string& what);

  std::filesystem::path target_, staging_;
  std::string origin_, what_;
  Replaceable replaceable_;
  std::vector<std::filesystem::path> created_;  // parents made for the target, outermost first
  int lock_ = -1;                               // flock on the staging folder: "in use"
  bool published_ = false;
  bool replaced_ = false;  // swap_in exchanged with an existing target
};

}  // namespace push::detail
