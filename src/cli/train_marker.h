#pragma once
// The marker push train leaves in every folder it publishes, `.push-train`: a sealed text
// file (core/sealed_text.h) whose first line names the kind of folder ("push train
// outputs", "push train checkpoint") and whose other lines list files of the folder with
// their CRC-32C. A folder is push train's only when it holds a valid marker of its kind:
// never by the names of the files in it. For --out the marker lists every file (a file the
// user changed or added is seen); for a checkpoint, config.json, infer.meta and the
// particles' manifest (which lists the particle files with theirs), so that every byte of
// a checkpoint is covered and files of two checkpoints cannot be mixed.
#include <filesystem>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace push::cli {

inline constexpr const char* kMarkerName = ".push-train";
inline constexpr const char* kOutputsKind = "push train outputs";
inline constexpr const char* kCheckpointKind = "push train checkpoint";

struct Marker {
  std::string kind;
  std::map<std::string, std::string> files;  // path relative to the folder -> CRC-32C (hex)
};

/// The marker text of kind `kind` listing `files` (relative paths) of `dir` with their
/// CRC-32C, read from `dir` now.
std::string marker_text(const std::string& kind, const std::filesystem::path& dir,
                        const std::vector<std::string>& files);
/// The marker of `dir`: nothing when it has none, or one that is not a plain file (a
/// symbolic link), fails its checksum or is malformed.
std::optional<Marker> read_marker(const std::filesystem::path& dir);
/// The listed files of `marker` in `dir` whose bytes differ from what it records (or that
/// are missing), first one only; "" when all match.
std::string changed_file(const Marker& marker, const std::filesystem::path& dir);

}  // namespace push::cli
