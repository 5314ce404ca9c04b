// Staged output folders: checked writes, one-step publication, cleanup of dead runs' staging.
#include "core/staged_folder.h"

#include <push/core/errors.h>

#include <fcntl.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>
#include <algorithm>
#include <array>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <exception>

#include "core/files.h"

namespace push::detail {
namespace fs = std::filesystem;
namespace {

std::string quoted(const fs::path& p) { return c10::str("'", p.string(), "'"); }

/// `.NAME.partial-` : the prefix of NAME's staging folders; "PID-N" follows (the writer's
/// pid, and a count of its staging folders: two saves at once in one process differ).
std::string staging_prefix(const fs::path& target) { return c10::str(".", target.filename().string(), ".partial-"); }

/// Every file and folder below `dir`, then `dir` itself: whoever wrote them (LibTorch,
/// another library, another rank), their data is on disk before the folder is published.
void sync_tree(const fs::path& dir, const char* origin) {
  for (const auto& entry : fs::recursive_directory_iterator(dir)) {
    if (entry.is_regular_file() || entry.is_directory()) fsync_path(entry.path(), entry.is_directory(), origin);
  }
  fsync_path(dir, true, origin);
}

/// Whether `dir` is the root of a mount (a bind mount of a container's volume, say), which
/// renameat2 cannot exchange or replace (EBUSY). statx says so directly since Linux 5.8;
/// before, another device than its parent's (which misses a bind mount within one file
/// system).
bool mount_root(const fs::path& dir) {
  struct statx sx {};
  if (::statx(AT_FDCWD, dir.c_str(), AT_SYMLINK_NOFOLLOW, STATX_BASIC_STATS, &sx) == 0 &&
      (sx.stx_attributes_mask & STATX_ATTR_MOUNT_ROOT) != 0) {
    return (sx.stx_attributes & STATX_ATTR_MOUNT_ROOT) != 0;
  }
  struct stat self {
  }, parent{};
  return ::stat(dir.c_str(), &self) == 0 && ::stat(dir.parent_path().c_str(), &parent) == 0 &&
         self.st_dev != parent.st_dev;
}

bool process_alive(pid_t pid) { return ::kill(pid, 0) == 0 || errno == EPERM; }

/// A staging folder's claim: the file `STAGING.claim` beside it, made before the folder
/// and removed after it. It names the folder and the process, so a folder that merely
/// looks like a staging folder (a user's `.results.partial-2024-01`), or a claim copied
/// under another name, is never taken for one.
constexpr const char* kClaimSuffix = ".claim";

fs::path claim_of(const fs::path& staging) { return staging.string() + kClaimSuffix; }

std::string claim_text(const fs::path& staging, pid_t pid) {
  return c10::str("push staging folder '", staging.filename().string(), "' of process ", pid, "\n");
}

/// Whether `p` itself (not what a link points to) is of `type` and owned by this user.
bool owned(const fs::path& p, mode_t type) {
  struct stat st {};
  return ::lstat(p.c_str(), &st) == 0 && (st.st_mode & S_IFMT) == type && st.st_uid == ::geteuid();
}

/// Whether the file `claim` names `staging` and process `pid`.
bool claim_says(const fs::path& claim, const fs::path& staging, pid_t pid) {
  const int fd = ::open(claim.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
  if (fd < 0) return false;
  const std::string want = claim_text(staging, pid);
  std::string got(want.size() + 1, '\0');
  const ssize_t n = read_full(fd, got.data(), got.size());
  ::close(fd);
  return n == static_cast<ssize_t>(want.size()) && got.compare(0, want.size(), want) == 0;
}

/// Whether push provably made `staging` for process `pid`: the folder and its claim are
/// this user's, and the claim names both.
bool claimed(const fs::path& staging, pid_t pid) {
  const fs::path claim = claim_of(staging);
  return owned(staging, S_IFDIR) && owned(claim, S_IFREG) && claim_says(claim, staging, pid);
}

/// Removes `.NAME.partial-PID-N` folders beside `target` that push made (claimed()) for a
/// process that is gone, and whose lock nobody holds (the pid alone could be another
/// namespace's, or reused); then their claims. Anything else is left alone.
void remove_stale_staging(const fs::path& target) {
  const std::string prefix = staging_prefix(target);
  std::error_code ec;
  for (fs::directory_iterator it(target.parent_path(), ec), end; !ec && it != end; it.increment(ec)) {
    std::string name = it->path().filename().string();
    if (name.rfind(prefix, 0) != 0) continue;
    // A claim whose folder is gone (a crash after the folder was published or removed).
    const size_t suffix = name.size() - std::min(name.size(), std::strlen(kClaimSuffix));
    const bool claim = name.compare(suffix, std::string::npos, kClaimSuffix) == 0;
    if (claim) name.resize(suffix);
    const std::string tail = name.substr(std::min(name.size(), prefix.size()));
    const size_t dash = tail.find('-');
    if (dash == std::string::npos) continue;
    const std::string digits = tail.substr(0, dash), count = tail.substr(dash + 1);
    auto whole = [](const std::string& t) {
      return !t.empty() && t.size() <= 9 && t.find_first_not_of("0123456789") == std::string::npos;
    };
    if (!whole(digits) || !whole(count)) continue;
    const pid_t pid = static_cast<pid_t>(std::stol(digits));
    if (pid == ::getpid() || process_alive(pid)) continue;
    const fs::path staging = it->path().parent_path() / name;
    if (claim) {
      struct stat st {};
      if (::lstat(staging.c_str(), &st) != 0 && errno == ENOENT && owned(it->path(), S_IFREG) &&
          claim_says(it->path(), staging, pid)) {
        fs::remove(it->path(), ec);
      }
      ec.clear();
      continue;
    }
    if (!claimed(staging, pid)) continue;
    const int fd = ::open(it->path().c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC | O_NOFOLLOW);
    if (fd < 0) continue;
    if (::flock(fd, LOCK_EX | LOCK_NB) == 0) {
      std::error_code failed;
      fs::remove_all(it->path(), failed);
      if (!failed) fs::remove(claim_of(it->path()), failed);
    }
    ::close(fd);
  }
}

/// Writes the claim `claim` whole or not at all: an anonymous file (O_TMPFILE) written, then
/// linked under its name, so a kill never leaves an empty claim that nobody could prove to
/// be push's. Where the file system has no O_TMPFILE, the file is written in place. 0, or
/// the errno (EEXIST: the name is taken).
int write_claim(const fs::path& claim, const std::string& text) {
  const int anonymous = ::open(claim.parent_path().c_str(), O_TMPFILE | O_WRONLY | O_CLOEXEC, 0600);
  if (anonymous >= 0) {
    int err = write_full(anonymous, text.data(), text.size());
    const std::string self = c10::str("/proc/self/fd/", anonymous);
    if (err == 0 && ::linkat(AT_FDCWD, self.c_str(), AT_FDCWD, claim.c_str(), AT_SYMLINK_FOLLOW) != 0) err = errno;
    ::close(anonymous);
    return err;
  }
  const int fd = ::open(claim.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0600);
  if (fd < 0) return errno;
  int err = write_full(fd, text.data(), text.size());
  if (::close(fd) != 0 && err == 0) err = errno;
  if (err != 0) ::unlink(claim.c_str());
  return err;
}

/// Makes the claim (first) and the staging folder `.NAME.partial-PID-N` beside `target`,
/// taking the next N while either name is taken; returns the folder. push::Error when
/// neither can be made.
fs::path make_staging(const fs::path& target, const char* origin, const std::string& what) {
  static std::atomic<uint64_t> count{0};
  auto fail = [&](int err) -> fs::path {
    throw Error(
        c10::str("[", origin, "] cannot write ", what, ": cannot create a folder beside it: ", std::strerror(err)));
  };
  for (int tries = 0;; ++tries) {
    const fs::path staging =
        target.parent_path() / c10::str(staging_prefix(target), ::getpid(), "-", count.fetch_add(1));
    const fs::path claim = claim_of(staging);
    int err = write_claim(claim, claim_text(staging, ::getpid()));
    if (err == EEXIST && tries < 100) continue;
    if (err != 0) return fail(err);
    if (::mkdir(staging.c_str(), 0755) == 0) return staging;
    err = errno;
    ::unlink(claim.c_str());
    if (err != EEXIST || tries >= 100) return fail(err);
  }
}

/// The staging folders not yet published, for abandon_all (a terminate handler cannot
/// reach the objects). Fixed slots: no allocation, no lock on that path.
std::array<std::atomic<const fs::path*>, 8> g_unpublished{};

void track(const fs::path* p) {
  for (auto& slot : g_unpublished) {
    const fs::path* empty = nullptr;
    if (slot.compare_exchange_strong(empty, p)) return;
  }
}

void untrack(const fs::path* p) {
  for (auto& slot : g_unpublished) {
    const fs::path* mine = p;
    slot.compare_exchange_strong(mine, nullptr);
  }
}

}  // namespace

void StagedFolder::check_writable_tree(const fs::path& dir, const char* origin, const std::string& what) {
  // A folder made read-only is protected by its owner; replacing it would also leave its
  // old contents undeletable beside it. Mode bits, not access(2): root passes access.
  auto read_only = [](const fs::path& p) {
    struct stat st {};
    return ::lstat(p.c_str(), &st) == 0 && S_ISDIR(st.st_mode) && (st.st_mode & S_IWUSR) == 0;
  };
  fs::path found;
  if (read_only(dir)) found = dir;
  std::error_code ec;
  for (fs::recursive_directory_iterator it(dir, ec), end; found.empty() && !ec && it != end; it.increment(ec)) {
    if (read_only(it->path())) found = it->path();
  }
  PUSH_CHECK(found.empty(), origin, what, " is read-only",
             found == dir ? std::string() : c10::str(" (", quoted(found), " is)"),
             ": it is replaced as a whole; make it writable or choose another folder");
}

StagedFolder::StagedFolder(const fs::path& target, std::string origin_name, std::string what_folder,
                           const Replaceable& replaceable)
    : target_(target.empty() ? fs::path() : resolve_path(target)),
      origin_(std::move(origin_name)),
      what_(std::move(what_folder)),
      replaceable_(replaceable) {
  const char* origin = origin_.c_str();
  const std::string what = what_ + " " + quoted(target);
  PUSH_CHECK(!target.empty() && target_.has_filename() && target_ != target_.root_path(), origin, what,
             " is not a folder one can write");
  // The staging folder beside it is named .NAME.partial-PID-N: NAME must leave room.
  constexpr size_t kNameMax = 255, kStagingExtra = 32;
  const size_t name_length = target_.filename().string().size();
  PUSH_CHECK(name_length + kStagingExtra <= kNameMax, origin, what, ": its name has ", name_length,
             " characters; at most ", kNameMax - kStagingExtra, " leave room for the staging folder written beside it");
  // The folder is replaced as a whole: it cannot be (or contain) the folder we work in.
  PUSH_CHECK(!path_contains(target_, resolve_path(fs::current_path())), origin, what,
             " is the current folder or contains it; name a folder inside it");
  std::error_code ec;
  // A link that leads nowhere: the rename at the end would find its name taken.
  PUSH_CHECK(!fs::is_symlink(fs::symlink_status(target_, ec)), origin, what, " is a symbolic link to ",
             quoted(fs::read_symlink(target_, ec)), ", which does not exist; create that folder or name another");
  if (fs::exists(target_, ec)) {
    PUSH_CHECK(fs::is_directory(target_), origin, what, " exists and is not a folder");
    PUSH_CHECK(!mount_root(target_), origin, what,
               " is a mount point (a container's volume?): it is replaced whole by a rename, which cannot move a "
               "mount point; name a folder inside it, e.g. ",
               quoted(target / "run"));
    const std::string why = replaceable_(target_);
    PUSH_CHECK(why.empty(), origin, what, " ", why, "; choose a new or empty folder");
    check_writable_tree(target_, origin, what);
  }
  // Parents: create the missing ones, remembering them so that a failed run removes them.
  std::vector<fs::path> missing;
  for (fs::path p = target_.parent_path(); !fs::exists(p, ec); p = p.parent_path()) {
    missing.insert(missing.begin(), p);
    if (p == p.parent_path()) break;
  }
  for (const auto& p : missing) {
    if (!fs::create_directory(p, ec) && ec) {
      discard();
      throw Error(c10::str("[", origin, "] cannot write ", what, ": cannot create ", quoted(p), ": ", ec.message()));
    }
    created_.push_back(p);
  }
  remove_stale_staging(target_);
  try {
    staging_ = make_staging(target_, origin, what);
  } catch (...) {
    discard();
    throw;
  }
  track(&staging_);
  lock_ = ::open(staging_.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (lock_ >= 0) ::flock(lock_, LOCK_EX | LOCK_NB);
  // A place where a folder can be made but nothing written (a full disk, a file size
  // limit) is found now too, not after the run.
  try {
    write(".probe", "push");
    fs::remove(staging_ / ".probe", ec);
  } catch (const Error& e) {
    discard();
    const std::string message = e.what();
    const size_t cut = message.find("] ");
    throw Error(c10::str("[", origin, "] cannot write ", what, ": ",
                         cut == std::string::npos ? message : message.substr(cut + 2)));
  }
}

StagedFolder::~StagedFolder() { discard(); }

void StagedFolder::discard() noexcept {
  if (!staging_.empty()) untrack(&staging_);
  if (lock_ >= 0) ::close(lock_);
  lock_ = -1;
  if (published_) return;
  std::error_code ignored;
  if (!staging_.empty() && fs::remove_all(staging_, ignored) != static_cast<std::uintmax_t>(-1)) {
    fs::remove(claim_of(staging_), ignored);
  }
  staging_.clear();
  for (auto p = created_.rbegin(); p != created_.rend(); ++p) fs::remove(*p, ignored);  // only if empty
  created_.clear();
}

void StagedFolder::write(const std::string& name, std::string_view bytes) const {
  write_file(staging_ / name, bytes, origin_.c_str(), (target_ / name).string());
}

void StagedFolder::check_publishable() const {
  const char* origin = origin_.c_str();
  PUSH_CHECK(!published_, origin, what_, " ", quoted(target_), " was published already");
  // The target may have appeared (or changed) while we worked: check it again.
  std::error_code ec;
  if (fs::exists(target_, ec)) {
    PUSH_CHECK(fs::is_directory(target_), origin, what_, " ", quoted(target_), " exists and is not a folder");
    const std::string why = replaceable_(target_);
    PUSH_CHECK(why.empty(), origin, what_, " ", quoted(target_), " ", why, "; choose a new or empty folder");
    check_writable_tree(target_, origin, c10::str(what_, " ", quoted(target_)));
  }
  // access(2) also sees a read-only file system, for every user.
  if (::access(target_.parent_path().c_str(), W_OK) != 0) {
    throw Error(c10::str("[", origin, "] cannot publish ", what_, " ", quoted(target_), ": its folder ",
                         quoted(target_.parent_path()), " is not writable: ", std::strerror(errno)));
  }
}

void StagedFolder::swap_in() {
  const char* origin = origin_.c_str();
  check_publishable();
  std::error_code ec;
  replaced_ = fs::exists(target_, ec);
  const unsigned flags = replaced_ ? RENAME_EXCHANGE : RENAME_NOREPLACE;
  int rc = ::renameat2(AT_FDCWD, staging_.c_str(), AT_FDCWD, target_.c_str(), flags);
  if (rc != 0 && errno == EINVAL && !replaced_ && !fs::exists(target_, ec)) {
    // A file system that takes no renameat2 flags (NFS): a plain rename onto the absent
    // target. Only replacing an existing folder needs RENAME_EXCHANGE.
    rc = ::rename(staging_.c_str(), target_.c_str());
  }
  if (rc != 0) {
    throw Error(c10::str("[", origin, "] cannot publish ", what_, " ", quoted(target_), ": ", std::strerror(errno)));
  }
  published_ = true;
}

void StagedFolder::swap_back() noexcept {
  if (!published_) return;
  // The staging name holds the previous contents (or nothing): put them back.
  const int rc = replaced_ ? ::renameat2(AT_FDCWD, staging_.c_str(), AT_FDCWD, target_.c_str(), RENAME_EXCHANGE)
                           : ::rename(target_.c_str(), staging_.c_str());
  if (rc == 0) published_ = false;  // the new contents are in staging again: discard() removes them
}

void StagedFolder::finish() {
  untrack(&staging_);
  if (lock_ >= 0) ::close(lock_);
  lock_ = -1;
  // The staging name now holds the previous contents: delete them. A crash before this
  // leaves a staging folder of a dead process, which the next run removes.
  std::error_code ec;
  if (!replaced_ || fs::remove_all(staging_, ec) != static_cast<std::uintmax_t>(-1)) fs::remove(claim_of(staging_), ec);
  fsync_path(target_.parent_path(), true, origin_.c_str());
}

void StagedFolder::publish() {
  sync_tree(staging_, origin_.c_str());
  swap_in();  // checks the target first
  finish();
}

void StagedFolder::publish_together(StagedFolder& first, StagedFolder& second) {
  // Both are checked and synced before either moves: what can be known in advance fails
  // with nothing published, and the two swaps follow each other at once (a kill between
  // them, two system calls apart, is the one moment that leaves one folder new and the
  // other old). A failure of the second swap itself puts the first folder back.
  first.check_publishable();
  second.check_publishable();
  sync_tree(first.staging_, first.origin_.c_str());
  sync_tree(second.staging_, second.origin_.c_str());
  first.swap_in();
  try {
    second.swap_in();
  } catch (...) {
    first.swap_back();
    throw;
  }
  // Both are published: each deletes its previous contents, whatever the other's fate.
  std::exception_ptr failed;
  for (StagedFolder* folder : {&first, &second}) {
    try {
      folder->finish();
    } catch (...) {
      if (!failed) failed = std::current_exception();
    }
  }
  if (failed) std::rethrow_exception(failed);
}

void StagedFolder::abandon_all() noexcept {
  for (auto& slot : g_unpublished) {
    if (const fs::path* p = slot.exchange(nullptr)) {
      std::error_code ignored;
      fs::remove_all(*p, ignored);
      fs::remove(claim_of(*p), ignored);
    }
  }
}

}  // namespace push::detail
