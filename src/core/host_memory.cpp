// The host memory a process may still use (core/host_memory.h).
#include "core/host_memory.h"

#include <algorithm>
#include <fstream>
#include <limits>
#include <sstream>
#include <vector>

namespace push::detail {
namespace fs = std::filesystem;
namespace {

/// The first number in the file `path` ("max" and unreadable files are no number).
std::optional<uint64_t> number_in(const fs::path& path) {
  std::ifstream in(path);
  uint64_t v = 0;
  if (in >> v) return v;
  return std::nullopt;
}

/// The limit left in `dir` and each folder above it up to `mount`: limit - usage, least.
std::optional<uint64_t> left_along(const fs::path& mount, const fs::path& dir, const char* limit_file,
                                   const char* usage_file) {
  std::optional<uint64_t> least;
  for (fs::path d = dir;; d = d.parent_path()) {
    const auto limit = number_in(d / limit_file), usage = number_in(d / usage_file);
    if (limit && usage) {
      const uint64_t left = *limit > *usage ? *limit - *usage : 0;
      least = least ? std::min(*least, left) : left;
    }
    if (d == mount || !d.has_relative_path() || d.parent_path() == d) break;
  }
  return least;
}

/// `mount`/`path` when that folder exists, else `mount` (the path is another namespace's:
/// a container without its own cgroup namespace sees the host's path, but its mount's root).
fs::path cgroup_folder(const fs::path& mount, const std::string& path) {
  const fs::path dir = (mount / fs::path(path).relative_path()).lexically_normal();
  std::error_code ec;
  return fs::is_directory(dir, ec) ? dir : mount;
}

}  // namespace

std::optional<uint64_t> cgroup_memory_left(const fs::path& root, const std::string& self_cgroup) {
  std::optional<uint64_t> least;
  auto take = [&](std::optional<uint64_t> left) {
    if (left) least = least ? std::min(*least, *left) : *left;
  };
  std::istringstream lines(self_cgroup);
  for (std::string line; std::getline(lines, line);) {
    // "hierarchy-id:controllers:path"; the path may itself hold ':'.
    const size_t first = line.find(':'), second = first == std::string::npos ? first : line.find(':', first + 1);
    if (second == std::string::npos) continue;
    const std::string id = line.substr(0, first), controllers = line.substr(first + 1, second - first - 1);
    const std::string path = line.substr(second + 1);
    if (id == "0" && controllers.empty()) {
      for (const fs::path mount : {root, root / "unified"}) {
        std::error_code ec;
        if (!fs::exists(mount / "cgroup.controllers", ec)) continue;
        take(left_along(mount, cgroup_folder(mount, path), "memory.max", "memory.current"));
      }
      continue;
    }
    std::istringstream names(controllers);
    for (std::string name; std::getline(names, name, ',');) {
      if (name != "memory") continue;
      const fs::path mount = root / "memory";
      take(left_along(mount, cgroup_folder(mount, path), "memory.limit_in_bytes", "memory.usage_in_bytes"));
    }
  }
  return least;
}

uint64_t available_memory_bytes() {
  uint64_t available = std::numeric_limits<uint64_t>::max();
  std::ifstream meminfo("/proc/meminfo");
  for (std::string key; meminfo >> key;) {
    uint64_t kib = 0;
    if (key == "MemAvailable:" && meminfo >> kib) available = kib * 1024;
    meminfo.ignore(std::numeric_limits<std::streamsize>::max(), '\n');
  }
  std::ifstream self("/proc/self/cgroup");
  std::stringstream text;
  text << self.rdbuf();
  if (const auto left = cgroup_memory_left("/sys/fs/cgroup", text.str())) available = std::min(available, *left);
  return available;
}

}  // namespace push::detail
