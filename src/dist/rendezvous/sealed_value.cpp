#include "dist/rendezvous/sealed_value.h"

#include <push/core/errors.h>

#include "dist/transport/rpc_origin.h"

namespace push::dist::detail {
namespace {

handshake::Bytes mac(const handshake::Bytes& key, const std::string& store_key, const std::string& value) {
  std::string message("push store value\n");
  message.append(store_key).push_back('\n');
  message.append(value);
  return handshake::hmac(key, message);
}

}  // namespace

std::string seal(const handshake::Bytes& key, const std::string& store_key, const std::string& value) {
  return value + "\n" + handshake::to_hex(mac(key, store_key, value));
}

std::string unseal(const handshake::Bytes& key, const std::string& store_key, const std::string& sealed,
                   const std::string& what) {
  const auto line = sealed.rfind('\n');
  const std::string value = line == std::string::npos ? std::string() : sealed.substr(0, line);
  const std::string hex = line == std::string::npos ? std::string() : sealed.substr(line + 1);
  bool right = hex.size() == 2 * handshake::kBytes;
  if (right) {
    try {
      right = handshake::same(handshake::from_hex(hex, "a seal"), mac(key, store_key, value));
    } catch (const Error&) {
      right = false;
    }
  }
  PUSH_CHECK(right, kRpcOrigin, what, " in the store (", store_key,
             ") does not carry this job's seal: it was written by someone without the job's secret (another "
             "program or user rewriting the store), so it is not used");
  return value;
}

}  // namespace push::dist::detail
