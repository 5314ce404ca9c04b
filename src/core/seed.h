#pragma once
// The one way push derives a seed from other seeds: a particle's from the distribution's
// seed and its id, an epoch's shuffle from (seed, particle, epoch, purpose), a data split
// from (seed, purpose). Every input changes every output bit (splitmix64's finaliser after
// each value), so seeds that differ in one input give unrelated streams; a purpose is a
// tag (an ASCII constant such as kShuffle below) so that two uses of the same numbers never
// share a stream.
#include <cstdint>
#include <initializer_list>

namespace push::detail {

/// A seed mixed from `values`, in order (the order matters).
constexpr uint64_t mix_seed(std::initializer_list<uint64_t> values) {
  uint64_t h = 0x9e3779b97f4a7c15ULL;
  for (uint64_t v : values) {
    h ^= v + 0x9e3779b97f4a7c15ULL + (h << 6) + (h >> 2);
    h = (h ^ (h >> 30)) * 0xbf58476d1ce4e5b9ULL;
    h = (h ^ (h >> 27)) * 0x94d049bb133111ebULL;
    h ^= h >> 31;
  }
  return h;
}
template <class... V>
constexpr uint64_t mix_seed(V... values) {
  return mix_seed({static_cast<uint64_t>(values)...});
}

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
