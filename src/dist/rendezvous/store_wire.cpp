#include "dist/rendezvous/store_wire.h"

#include <push/core/errors.h>

#include <netdb.h>
#include <sys/socket.h>

#include <cstring>

namespace push::dist::detail::store_wire {
namespace {

constexpr char kMagic[8] = {'P', 'U', 'S', 'H', 'S', 'T', 'R', '1'};

void put_u32(std::string& out, uint32_t v) { out.append(reinterpret_cast<const char*>(&v), sizeof(v)); }

}  // namespace

std::vector<char> banner(const std::string& job_id) {
  std::vector<char> out(kMagic, kMagic + sizeof(kMagic));
  const handshake::Bytes id = handshake::hmac(handshake::Bytes{}, "push job id\n" + job_id);
  out.insert(out.end(), id.begin(), id.end());
  return out;
}

handshake::Bytes store_key(const handshake::Bytes& secret, const std::string& job_id) {
  return handshake::group_key(secret, "push/store\n" + job_id);
}

std::string address_of(int fd, bool peer) {
  sockaddr_storage sa{};
  socklen_t len = sizeof(sa);
  auto* p = reinterpret_cast<sockaddr*>(&sa);
  if ((peer ? ::getpeername(fd, p, &len) : ::getsockname(fd, p, &len)) != 0) return "?";
  char host[NI_MAXHOST] = {}, port[NI_MAXSERV] = {};
  if (::getnameinfo(p, len, host, sizeof(host), port, sizeof(port), NI_NUMERICHOST | NI_NUMERICSERV) != 0) return "?";
  return sa.ss_family == AF_INET6 ? c10::str("[", host, "]:", port) : c10::str(host, ":", port);
}

Writer& Writer::u8(uint8_t v) {
  out_.push_back(static_cast<char>(v));
  return *this;
}

Writer& Writer::i64(int64_t v) {
  out_.append(reinterpret_cast<const char*>(&v), sizeof(v));
  return *this;
}

Writer& Writer::bytes(std::string_view v) {
  put_u32(out_, static_cast<uint32_t>(v.size()));
  out_.append(v);
  return *this;
}

Writer& Writer::strings(const std::vector<std::string>& v) {
  put_u32(out_, static_cast<uint32_t>(v.size()));
  for (const auto& s : v) bytes(s);
  return *this;
}

std::string_view Reader::take(std::size_t n) {
  PUSH_CHECK(n <= rest_.size(), "push::dist::Store", "a malformed message from ", who_, ": it ends early");
  const std::string_view out = rest_.substr(0, n);
  rest_.remove_prefix(n);
  return out;
}

uint8_t Reader::u8() { return static_cast<uint8_t>(take(1)[0]); }

int64_t Reader::i64() {
  int64_t v = 0;
  std::memcpy(&v, take(sizeof(v)).data(), sizeof(v));
  return v;
}

std::string Reader::bytes(std::size_t most) {
  uint32_t n = 0;
  std::memcpy(&n, take(sizeof(n)).data(), sizeof(n));
  PUSH_CHECK(n <= most, "push::dist::Store", "a malformed message from ", who_, ": a string of ", n, " bytes (at most ",
             most, ")");
  return std::string(take(n));
}

std::vector<std::string> Reader::strings() {
  uint32_t n = 0;
  std::memcpy(&n, take(sizeof(n)).data(), sizeof(n));
  PUSH_CHECK(n <= kMaxKeys, "push::dist::Store", "a malformed message from ", who_, ": ", n, " keys (at most ",
             kMaxKeys, ")");
  std::vector<std::string> out;
  out.reserve(n);
  for (uint32_t i = 0; i < n; ++i) out.push_back(bytes(kMaxKeyBytes));
  return out;
}

void Reader::done() const {
  PUSH_CHECK(rest_.empty(), "push::dist::Store", "a malformed message from ", who_, ": ", rest_.size(),
             " bytes left over");
}

Request decode_request(std::string_view body) {
  Reader in(body, "a client");
  Request r;
  r.op = static_cast<Op>(in.u8());
  switch (r.op) {
    case Op::kSet:
      r.keys = {in.bytes(kMaxKeyBytes)};
      r.value = in.bytes(kMaxBody);
      break;
    case Op::kGet:
      r.keys = {in.bytes(kMaxKeyBytes)};
      r.number = in.i64();
      break;
    case Op::kAdd:
      r.keys = {in.bytes(kMaxKeyBytes)};
      r.number = in.i64();
      break;
    case Op::kCompareSet:
      r.keys = {in.bytes(kMaxKeyBytes)};
      r.value = in.bytes(kMaxBody);
      r.desired = in.bytes(kMaxBody);
      break;
    case Op::kCheck:
      r.keys = in.strings();
      break;
    case Op::kDelete:
      r.keys = {in.bytes(kMaxKeyBytes)};
      break;
    case Op::kNumKeys:
      break;
    case Op::kWait:
      r.keys = in.strings();
      r.number = in.i64();
      break;
    default:
      throw Error(c10::str("[push::dist::Store] an unknown request (", static_cast<int>(r.op), ")"));
  }
  in.done();
  return r;
}

std::string encode_request(const Request& r) {
  Writer out(static_cast<uint8_t>(r.op));
  switch (r.op) {
    case Op::kSet:
      return out.bytes(r.keys.at(0)).bytes(r.value).take();
    case Op::kGet:
    case Op::kAdd:
      return out.bytes(r.keys.at(0)).i64(r.number).take();
    case Op::kCompareSet:
      return out.bytes(r.keys.at(0)).bytes(r.value).bytes(r.desired).take();
    case Op::kCheck:
      return out.strings(r.keys).take();
    case Op::kDelete:
      return out.bytes(r.keys.at(0)).take();
    case Op::kWait:
      return out.strings(r.keys).i64(r.number).take();
    default:
      return out.take();
  }
}

std::vector<char> seal_message(FrameSeal& seal, std::string_view body) {
  std::vector<char> out(kHeadBytes + body.size() + kTagBytes);
  const auto n = static_cast<uint32_t>(body.size());
  std::memcpy(out.data(), &n, sizeof(n));
  seal.begin();
  seal.authenticate(out.data(), sizeof(n));
  const Tag head = seal.seal();
  std::memcpy(out.data() + sizeof(n), head.data(), kTagBytes);
  char* data = out.data() + kHeadBytes;
  seal.begin();
  seal.crypt(body.data(), data, body.size());
  const Tag tail = seal.seal();
  std::memcpy(data + body.size(), tail.data(), kTagBytes);
  return out;
}

int64_t open_head(FrameSeal& seal, const char* head) {
  uint32_t n = 0;
  std::memcpy(&n, head, sizeof(n));
  seal.begin();
  seal.authenticate(head, sizeof(n));
  if (!seal.open(reinterpret_cast<const uint8_t*>(head + sizeof(n)))) return -1;
  return n > kMaxBody ? -1 : static_cast<int64_t>(n);
}

bool open_body(FrameSeal& seal, char* in, std::size_t bytes) {
  seal.begin();
  seal.crypt(in, in, bytes);
  return seal.open(reinterpret_cast<const uint8_t*>(in + bytes));
}

}  // namespace push::dist::detail::store_wire
