#pragma once
// The purposes of push's seeds: a purpose is a tag (an ASCII constant such as kShuffle
// below) mixed in with push::mix_seed (push/core/seed.h), so that two uses of the same
// numbers never share a stream.
#include <push/core/seed.h>

#include <cstdint>

namespace push::detail {

using push::mix_seed;

/// Purposes, each its own stream of one seed's random numbers.
namespace seed_purpose {
inline constexpr uint64_t kParticle = 0x5041525449434c45ULL;  // "PARTICLE": a particle's initialisation
inline constexpr uint64_t kShuffle = 0x5348554646ULL;         // "SHUFF": an epoch's minibatch order
inline constexpr uint64_t kBootstrap = 0x424f4f54ULL;         // "BOOT": a bootstrap resample
inline constexpr uint64_t kShard = 0x5348415244ULL;           // "SHARD": an epoch's rows per rank
inline constexpr uint64_t kSplit = 0x53504c4954ULL;           // "SPLIT": train / test split
inline constexpr uint64_t kSubsample = 0x53554253ULL;         // "SUBS": --limit's rows
inline constexpr uint64_t kDropout = 0x44524f50ULL;           // "DROP": MC dropout's training masks
inline constexpr uint64_t kPredict = 0x50524544ULL;           // "PRED": MC dropout's prediction masks
inline constexpr uint64_t kRank = 0x52414e4bULL;              // "RANK": a data-parallel rank's own masks
inline constexpr uint64_t kSample = 0x53574147ULL;            // "SWAG": SWAG's posterior samples
inline constexpr uint64_t kLeader = 0x4c454144ULL;            // "LEAD": SVGD leader's minibatch order
inline constexpr uint64_t kServer = 0x53525652ULL;            // "SRVR": a gradient server client's choices
inline constexpr uint64_t kLangevin = 0x4c414e47ULL;          // "LANG": SG-MCMC's injected noise
inline constexpr uint64_t kLaplace = 0x4c41504cULL;           // "LAPL": a Laplace posterior's samples
}  // namespace seed_purpose

}  // namespace push::detail
