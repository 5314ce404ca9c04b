// Reading numbers from users' text, and quoting their text back safely.
#include "core/user_text.h"

#include <charconv>
#include <cstdio>
#include <cstdlib>

namespace push::detail {
namespace {

bool digit(char c) { return c >= '0' && c <= '9'; }

/// Skips digits from `i`; how many there were.
size_t digits(std::string_view t, size_t& i) {
  const size_t start = i;
  while (i < t.size() && digit(t[i])) ++i;
  return i - start;
}

}  // namespace

std::optional<double> parse_decimal(std::string_view text) {
  size_t i = 0;
  if (i < text.size() && (text[i] == '+' || text[i] == '-')) ++i;
  size_t mantissa = digits(text, i);
  if (i < text.size() && text[i] == '.') {
    ++i;
    mantissa += digits(text, i);
  }
  if (mantissa == 0) return std::nullopt;
  if (i < text.size() && (text[i] == 'e' || text[i] == 'E')) {
    ++i;
    if (i < text.size() && (text[i] == '+' || text[i] == '-')) ++i;
    if (digits(text, i) == 0) return std::nullopt;
  }
  if (i != text.size()) return std::nullopt;
  const std::string copy(text);  // strtod needs a terminated string
  return std::strtod(copy.c_str(), nullptr);
}

std::optional<int64_t> parse_whole(std::string_view text, int64_t lo, int64_t hi) {
  const char* first = text.data();
  const char* last = text.data() + text.size();
  if (first != last && *first == '+') ++first;  // from_chars takes '-' only
  if (first == last || !(digit(*first) || (*first == '-' && first + 1 != last))) return std::nullopt;
  int64_t value = 0;
  const auto [end, error] = std::from_chars(first, last, value);
  if (error != std::errc() || end != last || value < lo || value > hi) return std::nullopt;
  return value;
}

std::string printable(std::string_view text, size_t max) {
  std::string out;
  for (size_t i = 0; i < text.size() && i < max; ++i) {
    const auto c = static_cast<unsigned char>(text[i]);
    if (c >= 0x20 && c != 0x7f) {  // UTF-8 names pass; control bytes (ESC, CR) do not
      out.push_back(static_cast<char>(c));
    } else {
      char hex[5];
      std::snprintf(hex, sizeof(hex), "\\x%02x", c);
      out += hex;
    }
  }
  if (text.size() > max) out += "...";
  return out;
}

}  // namespace push::detail
