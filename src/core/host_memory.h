#pragma once
// The host memory a process may still use: the kernel's MemAvailable, or less where its
// cgroups cap it (a container, a Slurm job, a systemd slice). Both cgroup versions count:
// v2's memory.max against memory.current, v1's memory.limit_in_bytes against
// memory.usage_in_bytes, for the process's own cgroup and every one above it (a Slurm
// job's step sits inside the job's cgroup, which may hold the tighter limit).
#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>

namespace push::detail {

/// The bytes left under the tightest memory limit of the cgroups named in `self_cgroup`
/// (the text of /proc/self/cgroup), whose hierarchies are mounted under `root`
/// (/sys/fs/cgroup): v2 at `root` itself or at `root`/unified, v1's memory controller at
/// `root`/memory. Nothing when no cgroup limits memory (or none can be read).
std::optional<uint64_t> cgroup_memory_left(const std::filesystem::path& root, const std::string& self_cgroup);

/// MemAvailable of /proc/meminfo, capped by cgroup_memory_left for this process.
uint64_t available_memory_bytes();

}  // namespace push::detail
