#pragma once
// Save and load of a whole distribution (checkpoint_format.h has the layout). With a
// world, both are collective: every step that can fail on one rank ends with every rank
// learning whether all of them succeeded (Collectives::agree), so all return or all throw,
// and nothing is published or changed unless every rank got that far.
#include <push/runtime/options.h>

#include <filesystem>
#include <functional>
#include <optional>
#include <set>
#include <vector>

#include "runtime/checkpoint_format.h"
#include "runtime/collectives.h"
#include "runtime/lanes.h"
#include "runtime/particle_builder.h"
#include "runtime/registry.h"

namespace push::detail {

class Runtime;

class Checkpointer {
 public:
  /// `runtime` is what built particles are handled by (ParticleBuilder::build).
  Checkpointer(Lanes& lanes, Registry& registry, const ParticleBuilder& builder, Collectives& collectives,
               Runtime& runtime)
      : lanes_(lanes), registry_(registry), builder_(builder), collectives_(collectives), runtime_(runtime) {}

  /// Every rank writes its own particles (those in `only`, when given) into rank 0's
  /// staging folder; rank 0 writes the manifest last and swaps the folder into place.
  void save(const std::filesystem::path& dir, const std::optional<std::set<Pid>>& only, const char* origin);
  /// All or nothing: every particle is read, checked and loaded into a scratch copy (or
  /// into the new particle it becomes) on every rank before any live particle changes.
  /// `whole`: the checkpoint must hold every particle here (Push::load); otherwise the
  /// particles it does not hold stay as they are (Push::load_particles). Returns the ids
  /// the checkpoint held, ascending.
  std::vector<Pid> load(const std::filesystem::path& dir, const std::function<ParticleOptions(Pid)>& make_options,
                        bool whole, const char* origin);

 private:
  std::vector<checkpoint::ManifestEntry> write_particles(const std::filesystem::path& staged,
                                                         const std::optional<std::set<Pid>>& only);

  Lanes& lanes_;
  Registry& registry_;
  const ParticleBuilder& builder_;
  Collectives& collectives_;
  Runtime& runtime_;
};

}  // namespace push::detail
