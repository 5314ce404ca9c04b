#pragma once
// Files written the one way push writes them: every write checked, short writes and EINTR
// retried, data synced before anyone is told it is there, a replacement published in one
// rename. A whole folder published at once is core/staged_folder.h.
#include <sys/types.h>

#include <cstddef>
#include <filesystem>
#include <string>
#include <string_view>

// Errors are push::Error "[origin] what: why"; an origin of nullptr leaves out the
// "[origin] " for a caller that wraps the message in its own.
namespace push::detail {

/// write(2) until all `size` bytes are written, retrying EINTR and short writes: 0, or the
/// errno that stopped it (ENOSPC when the device takes nothing).
int write_full(int fd, const void* data, std::size_t size);
/// read(2) until `size` bytes or end of file, retrying EINTR: how many were read, or -1
/// with errno set.
ssize_t read_full(int fd, void* data, std::size_t size);

/// fsync(2) of a file or folder; push::Error "[origin] cannot sync 'path': why".
void fsync_path(const std::filesystem::path& path, bool directory, const char* origin);
/// Writes `bytes` to `path` (created or truncated) and syncs it; push::Error
/// "[origin] cannot write 'shown': why" (`shown` defaults to the path).
void write_file(const std::filesystem::path& path, std::string_view bytes, const char* origin,
                const std::string& shown = "");
/// Replaces `path` with `bytes` atomically (folly's writeFileAtomic): a temporary beside
/// it, written and synced, renamed over it, then the folder synced. A crash leaves the old
/// file or the new one; a failure leaves the old one and no temporary.
void write_file_atomic(const std::filesystem::path& path, std::string_view bytes, const char* origin);
/// The whole file; push::Error "[origin] cannot read 'name': why".
std::string read_file(const std::filesystem::path& path, const char* origin);

/// `path` absolute and normalised, with the symbolic links of its existing part resolved.
std::filesystem::path resolve_path(const std::filesystem::path& path);
/// Whether the resolved path `inner` is `outer` or lies inside it.
bool path_contains(const std::filesystem::path& outer, const std::filesystem::path& inner);
/// Whether two resolved paths are the same folder or one lies inside the other.
bool paths_overlap(const std::filesystem::path& a, const std::filesystem::path& b);

}  // namespace push::detail
