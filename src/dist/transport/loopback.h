#pragma once
// Whether an address names this machine's loopback, where a link cannot leave the host: the
// launcher's check of MASTER_ADDR, the transport's choice of address to advertise, and the
// frames it encrypts (frame_seal.h) all ask this one question.
#include <string_view>

namespace push::dist::detail {

/// Whether `host` names this machine's loopback: localhost, 127.x.y.z or ::1.
inline bool is_loopback(std::string_view host) {
  return host == "localhost" || host.substr(0, 4) == "127." || host == "::1";
}

}  // namespace push::dist::detail
