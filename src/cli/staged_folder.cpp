// Staged output folders: checked writes, one-step publication, cleanup of dead runs' staging.
#include "staged_folder.h"

#include <push/core/errors.h>

#include <array>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fcntl.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

namespace push::cli {
namespace fs = std::filesystem;
namespace {

constexpr const char* kOrigin = "push train";

std::string quoted(const fs::path& p) { return c10::str("'", p.string(), "'"); }

/// `.NAME.partial-` : the prefix of NAME's staging folders; the writer's pid follows.
std::string staging_prefix(const fs::path& target) { return c10::str(".", target.filename().string(), ".partial-"); }

void sync(const fs::path& path, bool directory) {
  const int fd = ::open(path.c_str(), (directory ? O_RDONLY | O_DIRECTORY : O_RDONLY) | O_CLOEXEC);
  if (fd < 0) throw Error(c10::str("[", kOrigin, "] cannot open ", quoted(path), " to sync it: ", std::strerror(errno)));
  const int rc = ::fsync(fd);
  const int err = errno;
  ::close(fd);
  if (rc != 0) throw Error(c10::str("[", kOrigin, "] cannot sync ", quoted(path), ": ", std::strerror(err)));
}

/// Every file and folder below `dir`, then `dir` itself: whoever wrote them (LibTorch,
/// another library), their data is on disk before the folder is published.
void sync_tree(const fs::path& dir) {
  for (const auto& entry : fs::recursive_directory_iterator(dir)) {
    if (entry.is_regular_file() || entry.is_directory()) sync(entry.path(), entry.is_directory());
  }
  sync(dir, true);
}

bool process_alive(pid_t pid) { return ::kill(pid, 0) == 0 || errno == EPERM; }

/// Removes `.NAME.partial-PID` folders beside `target` whose process is gone and whose
/// lock nobody holds (the pid alone could be another namespace's, or reused).
void remove_stale_staging(const fs::path& target) {
  const std::string prefix = staging_prefix(target);
  std::error_code ec;
  for (fs::directory_iterator it(target.parent_path(), ec), end; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    if (name.rfind(prefix, 0) != 0) continue;
    const std::string digits = name.substr(prefix.size());
    if (digits.empty() || digits.find_first_not_of("0123456789") != std::string::npos || digits.size() > 9) continue;
    const pid_t pid = static_cast<pid_t>(std::stol(digits));
    if (pid == ::getpid() || process_alive(pid)) continue;
    const int fd = ::open(it->path().c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0) continue;
    if (::flock(fd, LOCK_EX | LOCK_NB) == 0) {
      std::error_code ignored;
      fs::remove_all(it->path(), ignored);
    }
    ::close(fd);
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

fs::path resolve_path(const fs::path& path) {
  fs::path p = fs::weakly_canonical(fs::absolute(path)).lexically_normal();
  // "runs/new/" names the folder runs/new: drop the empty last component it leaves.
  if (!p.has_filename() && p != p.root_path()) p = p.parent_path();
  return p;
}

bool path_contains(const fs::path& outer, const fs::path& inner) {
  auto o = outer.begin(), i = inner.begin();
  for (; o != outer.end() && i != inner.end(); ++o, ++i) {
    if (o->empty()) break;  // a trailing separator
    if (*o != *i) return false;
  }
  return o == outer.end() || o->empty();
}

bool paths_overlap(const fs::path& a, const fs::path& b) { return path_contains(a, b) || path_contains(b, a); }

void write_file(const fs::path& path, std::string_view bytes, const std::string& shown) {
  const std::string name = shown.empty() ? path.string() : shown;
  auto fail = [&](int err) {
    throw Error(c10::str("[", kOrigin, "] cannot write '", name, "': ", std::strerror(err)));
  };
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) fail(errno);
  for (size_t done = 0; done < bytes.size();) {
    const ssize_t n = ::write(fd, bytes.data() + done, bytes.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      const int err = n < 0 ? errno : ENOSPC;
      ::close(fd);
      fail(err);
    }
    done += static_cast<size_t>(n);
  }
  if (::fsync(fd) != 0) {
    const int err = errno;
    ::close(fd);
    fail(err);
  }
  if (::close(fd) != 0) fail(errno);
}

StagedFolder::StagedFolder(const fs::path& target, std::string option, const Replaceable& replaceable)
    : target_(resolve_path(target)), option_(std::move(option)), replaceable_(replaceable) {
  const std::string what = option_ + " " + quoted(target);
  PUSH_CHECK(!target.empty() && target_.has_filename() && target_ != target_.root_path(), kOrigin, what,
             " is not a folder one can write");
  // The folder is replaced as a whole: it cannot be (or contain) the folder we work in.
  PUSH_CHECK(!path_contains(target_, resolve_path(fs::current_path())), kOrigin, what,
             " is the current folder or contains it; name a folder inside it");
  std::error_code ec;
  if (fs::exists(target_, ec)) {
    PUSH_CHECK(fs::is_directory(target_), kOrigin, what, " exists and is not a folder");
    const std::string why = replaceable_(target_);
    PUSH_CHECK(why.empty(), kOrigin, what, " ", why, "; choose a new or empty folder");
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
      throw Error(c10::str("[", kOrigin, "] cannot write ", what, ": cannot create ", quoted(p), ": ", ec.message()));
    }
    created_.push_back(p);
  }
  remove_stale_staging(target_);
  staging_ = target_.parent_path() / (staging_prefix(target_) + std::to_string(::getpid()));
  fs::remove_all(staging_, ec);
  if (::mkdir(staging_.c_str(), 0755) != 0) {
    const int err = errno;
    staging_.clear();
    discard();
    throw Error(c10::str("[", kOrigin, "] cannot write ", what, ": cannot create a folder beside it: ",
                         std::strerror(err)));
  }
  track(&staging_);
  lock_ = ::open(staging_.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (lock_ >= 0) ::flock(lock_, LOCK_EX | LOCK_NB);
  // A place where a folder can be made but nothing written (a full disk, a file size
  // limit) is found now too, not after the run.
  try {
    write(".probe", "push train");
    fs::remove(staging_ / ".probe", ec);
  } catch (const Error& e) {
    discard();
    const std::string message = e.what();
    const size_t cut = message.find("] ");
    throw Error(c10::str("[", kOrigin, "] cannot write ", what, ": ",
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
  if (!staging_.empty()) fs::remove_all(staging_, ignored);
  staging_.clear();
  for (auto p = created_.rbegin(); p != created_.rend(); ++p) fs::remove(*p, ignored);  // only if empty
  created_.clear();
}

void StagedFolder::write(const std::string& name, std::string_view bytes) const {
  write_file(staging_ / name, bytes, (target_ / name).string());
}

void StagedFolder::publish() {
  PUSH_CHECK(!published_, kOrigin, option_, " ", quoted(target_), " was published already");
  sync_tree(staging_);
  // The target may have appeared (or changed) while we worked: check it again.
  std::error_code ec;
  const bool exists = fs::exists(target_, ec);
  if (exists) {
    PUSH_CHECK(fs::is_directory(target_), kOrigin, option_, " ", quoted(target_), " exists and is not a folder");
    const std::string why = replaceable_(target_);
    PUSH_CHECK(why.empty(), kOrigin, option_, " ", quoted(target_), " ", why, "; choose a new or empty folder");
  }
  const unsigned flags = exists ? RENAME_EXCHANGE : RENAME_NOREPLACE;
  if (::renameat2(AT_FDCWD, staging_.c_str(), AT_FDCWD, target_.c_str(), flags) != 0) {
    throw Error(c10::str("[", kOrigin, "] cannot publish ", option_, " ", quoted(target_), ": ", std::strerror(errno)));
  }
  published_ = true;
  untrack(&staging_);
  if (lock_ >= 0) ::close(lock_);
  lock_ = -1;
  // The staging name now holds the previous contents: delete them. A crash before this
  // leaves a staging folder of a dead process, which the next run removes.
  if (exists) fs::remove_all(staging_, ec);
  sync(target_.parent_path(), true);
}

void StagedFolder::abandon_all() noexcept {
  for (auto& slot : g_unpublished) {
    if (const fs::path* p = slot.exchange(nullptr)) {
      std::error_code ignored;
      fs::remove_all(*p, ignored);
    }
  }
}

}  // namespace push::cli
