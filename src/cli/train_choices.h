#pragma once
// An option that takes one of a few words (--algo, --likelihood, --lr-schedule,
// --data-parallel, --laplace-structure, --laplace-predictive) holds an enum, parsed once by
// its name: the name each value's to_string gives, the same one config.json and
// metrics.json record.
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace push::cli {

/// The value among `values` whose to_string is `text`; nullopt for none.
template <class E>
std::optional<E> parse_named(std::string_view text, const std::vector<E>& values) {
  for (E v : values) {
    if (text == to_string(v)) return v;
  }
  return std::nullopt;
}

/// "a, b, c", or with `with_or` "a, b or c".
template <class E>
std::string names_of(const std::vector<E>& values, bool with_or = false) {
  std::string text;
  for (size_t i = 0; i < values.size(); ++i) {
    if (i > 0) text += with_or && i + 1 == values.size() ? " or " : ", ";
    text += to_string(values[i]);
  }
  return text;
}

}  // namespace push::cli
