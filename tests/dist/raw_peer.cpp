#include "raw_peer.h"

#include <push/core/errors.h>

#include <ATen/ATen.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>

namespace push::testing {

namespace wire = dist::detail::wire;

RawPeer::RawPeer(int port) {
  fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_port = htons(static_cast<uint16_t>(port));
  ::inet_pton(AF_INET, "127.0.0.1", &sa.sin_addr);
  const int error = ::connect(fd_, reinterpret_cast<sockaddr*>(&sa), sizeof(sa)) == 0 ? 0 : errno;
  if (error != 0) ::close(fd_);
  PUSH_CHECK(error == 0, "RawPeer", "cannot connect to port ", port, ": ", std::strerror(error));
}

RawPeer::RawPeer(int port, const dist::detail::handshake::Bytes& key, int rank, int listener) : RawPeer(port) {
  try {
    const auto keys = dist::detail::handshake::dial(fd_, key, rank, listener, "127.0.0.1:" + std::to_string(port),
                                                    std::chrono::steady_clock::now() + std::chrono::seconds(10),
                                                    "the member at port " + std::to_string(port));
    seal_with(keys);
  } catch (...) {
    ::close(fd_);
    throw;
  }
}

void RawPeer::seal_with(const dist::detail::handshake::SessionKeys& keys) {
  // The member listens on 127.0.0.1: nothing is encrypted, everything authenticated.
  send_ = std::make_unique<dist::detail::FrameSeal>(keys.dialer_to_listener, /*sending=*/true, /*encrypt=*/false);
  recv_ = std::make_unique<dist::detail::FrameSeal>(keys.listener_to_dialer, /*sending=*/false, /*encrypt=*/false);
}

std::optional<std::vector<char>> RawPeer::read_bytes(std::size_t n, std::chrono::milliseconds timeout) {
  std::vector<char> out(n);
  if (!read_exact(out.data(), n, std::chrono::steady_clock::now() + timeout)) return std::nullopt;
  return out;
}

RawPeer::~RawPeer() {
  if (fd_ >= 0) ::close(fd_);
}

bool RawPeer::write(const std::vector<char>& bytes) { return write_unsealed(send_ ? seal(bytes) : bytes); }

void RawPeer::close_head(std::vector<char>& out) {
  const auto tag = send_->seal();
  out.insert(out.end(), tag.begin(), tag.end());
  stage_ = Stage::kHeader;
  if (data_left_ > 0) {
    send_->begin();
    stage_ = Stage::kData;
  }
}

std::vector<char> RawPeer::seal(const std::vector<char>& bytes) {
  // The member's reader (frame_reader.cpp) run forwards: a head segment per frame, a data
  // segment when it announces data bytes (through a ring: notes that add up to them).
  std::vector<char> out;
  for (std::size_t i = 0; i < bytes.size();) {
    const char* in = bytes.data() + i;
    const std::size_t left = bytes.size() - i;
    if (stage_ == Stage::kHeader) {
      const std::size_t take = std::min(left, sizeof(header_) - header_got_);
      std::memcpy(header_ + header_got_, in, take);
      out.insert(out.end(), in, in + take);
      header_got_ += take;
      i += take;
      if (header_got_ < sizeof(header_)) continue;
      header_got_ = 0;
      uint16_t flags = 0;
      uint32_t meta = 0;
      std::memcpy(&flags, header_ + 6, sizeof(flags));
      std::memcpy(&meta, header_ + 16, sizeof(meta));
      std::memcpy(&data_left_, header_ + 24, sizeof(data_left_));
      meta_left_ = meta;
      ring_data_ = (flags & wire::kRingData) != 0;
      send_->begin();
      send_->authenticate(header_, sizeof(header_));
      stage_ = Stage::kMeta;
      if (meta_left_ == 0) close_head(out);
    } else if (stage_ == Stage::kMeta) {
      const std::size_t take = std::min<uint64_t>(left, meta_left_);
      const std::size_t at = out.size();
      out.resize(at + take);
      send_->crypt(in, out.data() + at, take);
      meta_left_ -= take;
      i += take;
      if (meta_left_ == 0) close_head(out);
    } else {
      std::size_t take = std::min<uint64_t>(left, data_left_);
      if (ring_data_) take = std::min(left, sizeof(note_) - note_got_);
      const std::size_t at = out.size();
      out.resize(at + take);
      send_->crypt(in, out.data() + at, take);
      i += take;
      if (ring_data_) {
        std::memcpy(note_ + note_got_, in, take);
        note_got_ += take;
        if (note_got_ < sizeof(note_)) continue;
        note_got_ = 0;
        uint64_t note = 0;
        std::memcpy(&note, note_, sizeof(note));
        data_left_ -= std::min(note, data_left_);
      } else {
        data_left_ -= take;
      }
      if (data_left_ > 0) continue;
      const auto tag = send_->seal();
      out.insert(out.end(), tag.begin(), tag.end());
      stage_ = Stage::kHeader;
    }
  }
  return out;
}

bool RawPeer::write_unsealed(const std::vector<char>& bytes) {
  std::size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t n = ::send(fd_, bytes.data() + done, bytes.size() - done, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    done += static_cast<std::size_t>(n);
  }
  return true;
}

std::vector<char> RawPeer::frame(uint16_t type, uint64_t id, const std::vector<char>& meta, uint32_t tensors,
                                 const std::vector<char>& data) {
  wire::Header h;
  h.type = type;
  h.id = id;
  h.meta_bytes = static_cast<uint32_t>(meta.size());
  h.tensor_count = tensors;
  h.data_bytes = data.size();
  std::vector<char> out(wire::kHeaderBytes);
  wire::write_header(h, out.data());
  out.insert(out.end(), meta.begin(), meta.end());
  out.insert(out.end(), data.begin(), data.end());
  return out;
}

std::vector<char> RawPeer::call_frame(uint64_t id, const std::string& function, std::vector<c10::IValue> args,
                                      uint16_t type) {
  auto e =
      wire::encode(c10::ivalue::Tuple::create({c10::IValue(function), c10::ivalue::Tuple::create(std::move(args))}));
  std::vector<char> data;
  for (const auto& t : e.tensors) {
    const char* p = static_cast<const char*>(t.data_ptr());
    data.insert(data.end(), p, p + t.nbytes());
  }
  return frame(type, id, e.meta, static_cast<uint32_t>(e.tensors.size()), data);
}

bool RawPeer::read_exact(char* out, std::size_t n, std::chrono::steady_clock::time_point deadline) {
  std::size_t got = 0;
  while (got < n) {
    const auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) return false;
    pollfd p{fd_, POLLIN, 0};
    if (::poll(&p, 1, static_cast<int>(left.count())) <= 0) continue;
    const ssize_t r = ::recv(fd_, out + got, n - got, 0);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return false;
    got += static_cast<std::size_t>(r);
  }
  return true;
}

std::optional<RawPeer::Reply> RawPeer::read_reply(std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  char head[wire::kHeaderBytes];
  if (!read_exact(head, sizeof(head), deadline)) return std::nullopt;
  Reply r;
  PUSH_CHECK(recv_, "RawPeer", "a reply on a connection without session keys");
  r.header = wire::read_header(head, uint64_t{1} << 32);
  std::vector<char> meta(r.header.meta_bytes);
  if (!read_exact(meta.data(), meta.size(), deadline)) return std::nullopt;
  recv_->begin();
  recv_->authenticate(head, sizeof(head));
  recv_->crypt(meta.data(), meta.data(), meta.size());
  if (!read_tag(deadline)) return std::nullopt;
  auto tensors = wire::read_tensor_table(meta, r.header);
  if (r.header.data_bytes > 0) {
    recv_->begin();
    for (auto& t : tensors) {
      if (!read_exact(static_cast<char*>(t.data_ptr()), t.nbytes(), deadline)) return std::nullopt;
      recv_->crypt(t.data_ptr(), t.data_ptr(), t.nbytes());
    }
    if (!read_tag(deadline)) return std::nullopt;
  }
  r.value = wire::decode(meta, tensors);
  return r;
}

bool RawPeer::read_tag(std::chrono::steady_clock::time_point deadline) {
  dist::detail::Tag tag;
  if (!read_exact(reinterpret_cast<char*>(tag.data()), tag.size(), deadline)) return false;
  PUSH_CHECK(recv_->open(tag.data()), "RawPeer", "a reply failed authentication");
  return true;
}

bool RawPeer::closed_within(std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  char sink[4096];
  for (;;) {
    const auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) return false;
    pollfd p{fd_, POLLIN, 0};
    if (::poll(&p, 1, static_cast<int>(left.count())) <= 0) continue;
    const ssize_t r = ::recv(fd_, sink, sizeof(sink), 0);
    if (r == 0 || (r < 0 && errno != EINTR && errno != EAGAIN)) return true;
  }
}

}  // namespace push::testing
