#pragma once
// Small text files whose every byte is checked: a body, then the line
// "end <CRC-32C of the body, 8 hex digits>". The checkpoint manifest, a Bayesian
// checkpoint's infer.meta and the markers push train leaves in the folders it owns are
// sealed this way, so an edited, truncated or appended-to file is refused by name.
//
//   write_file(dir / "infer.meta", seal("epochs 3\n"), origin);
//   const std::string body = unseal(read_file(dir / "infer.meta", origin), "infer.meta");
#include <cstdint>
#include <string>
#include <string_view>

namespace push::detail {

/// CRC-32C of `bytes` as 8 lower-case hex digits.
std::string crc_hex(std::string_view bytes);
/// `body` (which must end with a newline) followed by "end <crc_hex(body)>\n".
std::string seal(std::string_view body);
/// The body of sealed `text`. push::Error "<name> is truncated" / "<name> fails its
/// checksum: it changed after it was saved" (no origin: callers add their own) otherwise;
/// nothing may follow the end line.
std::string unseal(std::string_view text, const std::string& name);

}  // namespace push::detail
