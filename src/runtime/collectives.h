#pragma once
// What every rank of a distribution does together: meet, gather a value from each, and
// agree that a step succeeded everywhere or fail it everywhere. With a world it goes
// through Peers (rank 0 collects); without one each call is trivial. Every collective also
// checks that the ranks hold the same number of particles (ranks whose p_create calls
// diverged fail there, not later in a way nobody can explain).
#include <ATen/core/ivalue.h>

#include <exception>
#include <string>
#include <vector>

namespace push::detail {

class Peers;
class Registry;

class Collectives {
 public:
  /// `peers`: null without a world.
  Collectives(Peers* peers, const Registry& registry) : peers_(peers), registry_(registry) {}

  /// Every rank's `value`, by rank ({value} without a world). `step` names the call: ranks
  /// whose steps differ fail it. `origin` names the API in errors.
  std::vector<c10::IValue> gather(c10::IValue value, const std::string& step, const char* origin);
  void barrier(const char* origin);
  /// Every rank contributes `value`, or the error that stopped it (`failure`, non-null).
  /// When every rank has a value, each gets all of them, by rank; when any rank failed,
  /// every rank throws: its own error first, else push::Error "[origin] failed on rank r
  /// (name): why". Without a world: {value}, or `failure` rethrown.
  std::vector<c10::IValue> agree(c10::IValue value, const std::exception_ptr& failure, const std::string& step,
                                 const char* origin);
  /// The same with nothing to exchange: every rank returns, or every rank throws.
  void agree(const std::exception_ptr& failure, const std::string& step, const char* origin) {
    agree(c10::IValue(), failure, step, origin);
  }

 private:
  Peers* peers_;
  const Registry& registry_;
};

}  // namespace push::detail
