// push train's marker: which folders are its own, and what it wrote in them.
#include "train_marker.h"

#include <push/core/errors.h>

#include <sstream>

#include "core/files.h"
#include "core/sealed_text.h"

namespace push::cli {
namespace fs = std::filesystem;

std::string marker_text(const std::string& kind, const fs::path& dir, const std::vector<std::string>& files) {
  std::string body = kind + "\n";
  for (const auto& name : files) {
    body += name + " " + push::detail::crc_hex(push::detail::read_file(dir / name, "push train")) + "\n";
  }
  return push::detail::seal(body);
}

std::optional<Marker> read_marker(const fs::path& dir) {
  std::error_code ec;
  if (fs::symlink_status(dir / kMarkerName, ec).type() != fs::file_type::regular) return std::nullopt;
  std::string body;
  try {
    body = push::detail::unseal(push::detail::read_file(dir / kMarkerName, nullptr), kMarkerName);
  } catch (const Error&) {
    return std::nullopt;
  }
  std::istringstream in(body);
  Marker m;
  std::getline(in, m.kind);
  for (std::string line; std::getline(in, line);) {
    const auto space = line.rfind(' ');
    if (space == std::string::npos || space == 0) return std::nullopt;
    m.files[line.substr(0, space)] = line.substr(space + 1);
  }
  return m;
}

std::string changed_file(const Marker& marker, const fs::path& dir) {
  for (const auto& [name, crc] : marker.files) {
    std::error_code ec;
    if (fs::symlink_status(dir / name, ec).type() != fs::file_type::regular) return name;
    try {
      if (push::detail::crc_hex(push::detail::read_file(dir / name, nullptr)) != crc) return name;
    } catch (const Error&) {
      return name;
    }
  }
  return "";
}

}  // namespace push::cli
