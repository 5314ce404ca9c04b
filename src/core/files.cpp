#include "core/files.h"

#include <push/core/errors.h>

#include <fcntl.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>

namespace push::detail {
namespace fs = std::filesystem;
namespace {
// "[origin] text", or the text alone for a caller that names the origin itself.
Error error_from(const char* origin, const std::string& text) {
  return Error(origin == nullptr ? text : c10::str("[", origin, "] ", text));
}
}  // namespace

int write_full(int fd, const void* data, std::size_t size) {
  const char* p = static_cast<const char*>(data);
  while (size > 0) {
    const ssize_t n = ::write(fd, p, size);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return errno;
    if (n == 0) return ENOSPC;
    p += n;
    size -= static_cast<std::size_t>(n);
  }
  return 0;
}

ssize_t read_full(int fd, void* data, std::size_t size) {
  char* p = static_cast<char*>(data);
  std::size_t done = 0;
  while (done < size) {
    const ssize_t n = ::read(fd, p + done, size - done);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return -1;
    if (n == 0) break;
    done += static_cast<std::size_t>(n);
  }
  return static_cast<ssize_t>(done);
}

void fsync_path(const fs::path& path, bool directory, const char* origin) {
  const int fd = ::open(path.c_str(), (directory ? O_RDONLY | O_DIRECTORY : O_RDONLY) | O_CLOEXEC);
  if (fd < 0) {
    throw error_from(origin, c10::str("cannot open '", path.string(), "' to sync it: ", std::strerror(errno)));
  }
  const int rc = ::fsync(fd);
  const int err = errno;
  ::close(fd);
  if (rc != 0) throw error_from(origin, c10::str("cannot sync '", path.string(), "': ", std::strerror(err)));
}

void write_file(const fs::path& path, std::string_view bytes, const char* origin, const std::string& shown) {
  const std::string name = shown.empty() ? path.string() : shown;
  auto fail = [&](int err) { throw error_from(origin, c10::str("cannot write '", name, "': ", std::strerror(err))); };
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) fail(errno);
  int err = write_full(fd, bytes.data(), bytes.size());
  if (err == 0 && ::fsync(fd) != 0) err = errno;
  if (::close(fd) != 0 && err == 0) err = errno;
  if (err != 0) fail(err);
}

void write_file_atomic(const fs::path& path, std::string_view bytes, const char* origin) {
  static std::atomic<uint64_t> counter{0};
  const fs::path tmp =
      path.parent_path() / c10::str(".", path.filename().string(), ".tmp-", ::getpid(), "-", counter.fetch_add(1));
  try {
    write_file(tmp, bytes, origin, path.string());
    if (::rename(tmp.c_str(), path.c_str()) != 0) {
      throw error_from(origin, c10::str("cannot write '", path.string(), "': ", std::strerror(errno)));
    }
  } catch (...) {
    std::error_code ignored;
    fs::remove(tmp, ignored);
    throw;
  }
  fsync_path(path.parent_path().empty() ? fs::path(".") : path.parent_path(), /*directory=*/true, origin);
}

std::string read_file(const fs::path& path, const char* origin) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  auto fail = [&](int err) {
    throw error_from(origin, c10::str("cannot read '", path.filename().string(), "': ", std::strerror(err)));
  };
  if (fd < 0) fail(errno);
  std::string bytes;
  char buffer[1 << 16];
  for (;;) {
    const ssize_t n = read_full(fd, buffer, sizeof(buffer));
    if (n < 0) {
      const int err = errno;
      ::close(fd);
      fail(err);
    }
    bytes.append(buffer, static_cast<std::size_t>(n));
    if (static_cast<std::size_t>(n) < sizeof(buffer)) break;
  }
  ::close(fd);
  return bytes;
}

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

}  // namespace push::detail
