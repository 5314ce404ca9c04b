// Sealed text files: a body and the CRC-32C of its bytes.
#include "core/sealed_text.h"

#include <push/core/errors.h>

#include "core/crc32c.h"

namespace push::detail {

std::string crc_hex(std::string_view bytes) { return crc32c_hex(crc32c(bytes.data(), bytes.size())); }

std::string seal(std::string_view body) {
  PUSH_CHECK(body.empty() || body.back() == '\n', "push::detail::seal", "a sealed body ends with a newline");
  return std::string(body) + "end " + crc_hex(body) + "\n";
}

std::string unseal(std::string_view text, const std::string& name) {
  // The end line is the last line: "end " and 8 hex digits, then the final newline.
  constexpr size_t kEnd = 4 + 8 + 1;
  const size_t start = text.size() >= kEnd ? text.size() - kEnd : std::string_view::npos;
  if (start == std::string_view::npos || (start > 0 && text[start - 1] != '\n') || text.substr(start, 4) != "end " ||
      text.back() != '\n') {
    throw Error(name + " is truncated or has something after its end line");
  }
  const std::string_view body = text.substr(0, start);
  if (text.substr(start + 4, 8) != crc_hex(body)) {
    throw Error(name + " fails its checksum: it changed after it was saved");
  }
  return std::string(body);
}

}  // namespace push::detail
