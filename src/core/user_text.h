#pragma once
// Text from users and their files, read and shown the one way push does: numbers are plain
// decimals (no hex, no "nan" or "inf", no trailing junk), and text quoted back in an error
// message is printable and short (a garbage file's control bytes never reach the terminal).
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace push::detail {

/// `text` as a plain decimal number ([+-]digits[.digits][e[+-]digits]), or nothing. It may
/// overflow to ±inf (1e999): callers check for a finite result.
std::optional<double> parse_decimal(std::string_view text);
/// `text` as a whole number ([+-]digits) within [lo, hi], or nothing.
std::optional<int64_t> parse_whole(std::string_view text, int64_t lo, int64_t hi);
/// `text` with its control bytes (ESC, CR, NUL, DEL) as \xNN, cut to `max` bytes with "..."
/// after.
std::string printable(std::string_view text, size_t max = 80);

}  // namespace push::detail
