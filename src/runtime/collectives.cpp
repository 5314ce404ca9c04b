#include "runtime/collectives.h"

#include <push/core/errors.h>

#include "runtime/peers.h"
#include "runtime/registry.h"

namespace push::detail {

std::vector<c10::IValue> Collectives::gather(c10::IValue value, const std::string& step, const char* origin) {
  if (!peers_) return {std::move(value)};
  return peers_->all_gather(std::move(value), c10::str(step, " with ", registry_.size(), " particles"), origin);
}

void Collectives::barrier(const char* origin) {
  if (peers_) gather(c10::IValue(), "barrier", origin);
}

std::vector<c10::IValue> Collectives::agree(c10::IValue value, const std::exception_ptr& failure,
                                            const std::string& step, const char* origin) {
  if (!peers_) {
    if (failure) std::rethrow_exception(failure);
    return {std::move(value)};
  }
  // (true, value) or (false, why): a value that is itself a string is not taken for a failure.
  auto mine = failure ? c10::ivalue::Tuple::create({c10::IValue(false), c10::IValue(describe(failure))})
                      : c10::ivalue::Tuple::create({c10::IValue(true), std::move(value)});
  auto all = gather(std::move(mine), step, origin);
  if (failure) std::rethrow_exception(failure);
  std::vector<c10::IValue> values;
  values.reserve(all.size());
  for (size_t r = 0; r < all.size(); ++r) {
    const auto& items = all[r].toTupleRef().elements();
    if (!items.at(0).toBool()) {
      throw Error(c10::str("[", origin, "] failed on ", peers_->describe(static_cast<int>(r)), ": ",
                           items.at(1).toStringRef()));
    }
    values.push_back(items.at(1));
  }
  return values;
}

}  // namespace push::detail
