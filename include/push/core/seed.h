#pragma once
// The one way push derives a seed from other seeds: a particle's from the distribution's
// seed and its id, an epoch's shuffle from (seed, particle, epoch, purpose), a data split
// from (seed, purpose); Python's PusH-style algorithms draw theirs from it too
// (push._push.mix_seed). Every input changes every output bit (splitmix64's finaliser after
// each value), so seeds that differ in one input give unrelated streams.
#include <cstdint>
#include <initializer_list>
#include <span>

namespace push {

/// A seed mixed from `values`, in order (the order matters).
constexpr uint64_t mix_seed(std::span<const uint64_t> values) {
  uint64_t h = 0x9e3779b97f4a7c15ULL;
  for (uint64_t v : values) {
    h ^= v + 0x9e3779b97f4a7c15ULL + (h << 6) + (h >> 2);
    h = (h ^ (h >> 30)) * 0xbf58476d1ce4e5b9ULL;
    h = (h ^ (h >> 27)) * 0x94d049bb133111ebULL;
    h ^= h >> 31;
  }
  return h;
}
constexpr uint64_t mix_seed(std::initializer_list<uint64_t> values) {
  return mix_seed(std::span<const uint64_t>(values.begin(), values.size()));
}
template <class... V>
constexpr uint64_t mix_seed(V... values) {
  return mix_seed({static_cast<uint64_t>(values)...});
}

}  // namespace push
