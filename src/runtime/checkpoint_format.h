// Save and load of a whole distribution.
//
// Layout of a checkpoint directory:
//   push.manifest        "push-checkpoint 2", "particles <n>", one line per particle
//                        "<pid> <lane> <scheduler steps> <bytes> <crc32c>", then
//                        "end <crc32c of every byte before 'end'>"
//   particle-<pid>.pt    a LibTorch archive: "module", "optimizer" (nested archives),
//                        "push.pid", "push.state"
// save() writes everything into a staging folder beside the target (core/staged_folder.h),
// syncs it, then swaps it into place with renameat2(RENAME_EXCHANGE) (or a rename when
// there is nothing to replace): a crash at any point leaves the old checkpoint or the new one.
// LibTorch's archives carry no checksum of their tensor bytes, so the manifest records
// each file's size and CRC-32C: a file changed after save (a flipped bit, a truncation)
// is refused by load, naming the file, before anything is read from it.
//
// load() is all or nothing: every file is read and checked, then every particle is
// loaded into a scratch copy (a fresh module from the same factory, an optimizer and
// scheduler from the particle's own factories) and only when all of them load is any
// live particle touched or any missing one added.
#pragma once
#include <torch/serialize/input-archive.h>
#include <torch/serialize/output-archive.h>

#include <filesystem>
#include <string>
#include <vector>

#include "runtime/particle_record.h"

namespace push::detail::checkpoint {

inline constexpr const char* kManifest = "push.manifest";

/// One particle's line in a checkpoint's manifest.
struct ManifestEntry {
  Pid pid = -1;
  int lane = 0;  // in the numbering of every rank's lanes
  int64_t scheduler_steps = 0;
  uint64_t bytes = 0;  // of the particle file
  uint32_t crc = 0;    // CRC-32C of the particle file
};

/// Whether `dir` may be replaced by a checkpoint: "" when it is empty, or a checkpoint
/// holding only its manifest and the particle files it lists, each as saved; else why not,
/// naming the first file that is not (e.g. "is a push checkpoint that also holds 'x'").
std::string replaceable(const std::filesystem::path& dir);
/// The bytes of the particle file of `e` in `dir`, checked against the size and CRC-32C
/// its manifest records; push::Error naming the file ("particle-3.pt fails its checksum").
std::string particle_bytes(const std::filesystem::path& dir, const ManifestEntry& e);
std::filesystem::path particle_file(const std::filesystem::path& dir, Pid pid);
/// The manifest's text: everything up to "end" is covered by the checksum after it.
std::string manifest_text(const std::vector<ManifestEntry>& entries);
/// The manifest of `dir`, checked (format, checksum, one line per particle).
std::vector<ManifestEntry> read_manifest(const std::filesystem::path& dir);
/// Writes `archive` to `path` through checked writes, fsyncs it, and records its size and
/// CRC-32C in `entry`.
void write_particle(torch::serialize::OutputArchive& archive, const std::filesystem::path& path, ManifestEntry& entry);
/// A particle file, checked against its manifest entry before LibTorch parses a byte of it.
torch::serialize::InputArchive open_particle(const std::filesystem::path& dir, const ManifestEntry& e,
                                             const torch::Device& device);
/// Loads one saved particle into `r` (a scratch copy, or the live particle, pinned on its
/// lane), checking the shape and type of every parameter and buffer.
void load_into(ParticleRecord& r, torch::serialize::InputArchive& archive, const ManifestEntry& e);

}  // namespace push::detail::checkpoint
