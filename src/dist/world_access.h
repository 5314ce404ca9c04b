#pragma once
// How push::dist's own code reaches what the public handles keep private: the state behind
// a World (c10d.h), and the c10d store behind a Store. Nothing outside src/dist includes it.
#include "dist/c10d.h"

#include <push/dist/store.h>
#include <push/dist/world.h>

namespace push::dist::detail {

/// What a Store handle holds.
struct StoreState {
  c10::intrusive_ptr<c10d::Store> store;
};

class WorldAccess {
 public:
  static WorldState& state(const World& world) { return *world.state_; }
  /// A Store handle on `store`.
  static Store make_store(c10::intrusive_ptr<c10d::Store> store) {
    auto state = std::make_shared<StoreState>();
    state->store = std::move(store);
    return Store(std::move(state));
  }
};

}  // namespace push::dist::detail
