#include "dist/transport/frame_reader.h"

#include <push/core/errors.h>

#include <climits>

#include "dist/transport/rpc_origin.h"
#include "dist/transport/sockets.h"

namespace push::dist::detail {

std::pair<char*, uint64_t> TensorFill::window() {
  while (index_ < tensors_.size() && got_ == tensors_[index_].nbytes()) {
    ++index_;
    got_ = 0;
  }
  if (index_ == tensors_.size()) return {nullptr, 0};
  auto& t = tensors_[index_];
  return {static_cast<char*>(t.data_ptr()) + got_, t.nbytes() - got_};
}

FrameReader::FrameReader(std::unique_ptr<FrameSeal> seal, ReceivePool* pool, uint64_t max_message_bytes)
    : seal_(std::move(seal)), pool_(pool), max_message_bytes_(max_message_bytes), staging_(kStagingBytes) {}

bool FrameReader::data_complete() {
  if (ring_data()) return ring_.done();
  if (skip_ > 0) return false;
  return tensors_.complete();
}

bool FrameReader::read(int fd, const Deliver& deliver, std::string& why) {
  for (int turn = 0; turn < 64; ++turn) {
    if (begin_ == end_) {
      // Large tensor bytes go straight into their tensor, past the staging buffer, and are
      // opened there.
      if (stage_ == Stage::kData && skip_ == 0 && !ring_data()) {
        auto [dst, need] = tensors_.window();
        if (dst != nullptr && need >= kStagingBytes) {
          ssize_t n = 0;
          const auto got = receive(fd, dst, need, n, why);
          if (got != Received::kBytes) return got == Received::kNothingYet;
          seal_->crypt(dst, dst, static_cast<std::size_t>(n));
          tensors_.filled(static_cast<uint64_t>(n));
          if (data_complete()) stage_ = Stage::kDataTag;
          continue;
        }
      }
      ssize_t n = 0;
      const auto got = receive(fd, staging_.data(), staging_.size(), n, why);
      if (got != Received::kBytes) return got == Received::kNothingYet;
      begin_ = 0;
      end_ = static_cast<std::size_t>(n);
    }
    while (begin_ < end_) {
      begin_ += consume(staging_.data() + begin_, end_ - begin_, deliver);
      if (stage_ == Stage::kMeta && meta_.size() == header_.meta_bytes) stage_ = Stage::kHeadTag;
      if (stage_ == Stage::kData && data_complete()) stage_ = Stage::kDataTag;
    }
  }
  return true;
}

std::size_t FrameReader::consume(char* src, std::size_t avail, const Deliver& deliver) {
  switch (stage_) {
    case Stage::kHeader: {
      const std::size_t took = header_bytes_.take(src, avail);
      if (header_bytes_.complete()) header_read();
      return took;
    }
    case Stage::kMeta: {
      const auto take = std::min<std::size_t>(avail, header_.meta_bytes - meta_.size());
      const std::size_t at = meta_.size();
      meta_.resize(at + take);
      seal_->crypt(src, meta_.data() + at, take);
      return take;
    }
    case Stage::kHeadTag:
    case Stage::kDataTag: {
      const std::size_t took = tag_.take(src, avail);
      if (!tag_.complete()) return took;
      PUSH_CHECK(seal_->open(reinterpret_cast<const uint8_t*>(tag_.bytes)), kRpcOrigin,
                 "a frame failed authentication (changed on the way, replayed, or not sent by the member that "
                 "proved itself)");
      if (stage_ == Stage::kHeadTag) {
        head_opened(deliver);
      } else {
        finish(deliver);
      }
      return took;
    }
    case Stage::kData:
      break;
  }
  if (ring_data()) return ring_.consume(src, avail, *seal_, tensors_, table_error_ != nullptr);
  if (skip_ > 0) {
    const auto take = static_cast<std::size_t>(std::min<uint64_t>(avail, skip_));
    seal_->crypt(src, src, take);  // opened only for the tag
    skip_ -= take;
    return take;
  }
  auto [dst, need] = tensors_.window();
  const auto take = static_cast<std::size_t>(std::min<uint64_t>(avail, need));
  seal_->crypt(src, dst, take);
  tensors_.filled(take);
  return take;
}

void FrameReader::header_read() {
  header_ = wire::read_header(header_bytes_.bytes, max_message_bytes_);
  PUSH_CHECK(!wire::is_handshake(header_.type), kRpcOrigin, "malformed frame: a handshake frame (type ", header_.type,
             ") after the handshake");
  PUSH_CHECK(!ring_data() || ring_.mapped(), kRpcOrigin,
             "malformed frame: data in a shared-memory ring that was never announced");
  PUSH_CHECK(header_.type != wire::kHeartbeat || (header_.meta_bytes == 0 && header_.data_bytes == 0), kRpcOrigin,
             "malformed frame: a heartbeat with a body");
  seal_->begin();
  seal_->authenticate(header_bytes_.bytes, wire::kHeaderBytes);
  // The meta grows as its bytes arrive: a header alone costs nothing.
  meta_.clear();
  meta_.reserve(std::min<std::size_t>(header_.meta_bytes, kStagingBytes));
  stage_ = Stage::kMeta;
}

void FrameReader::head_opened(const Deliver& deliver) {
  stage_ = Stage::kHeader;
  if (header_.type == wire::kHeartbeat) return;
  if (header_.type == wire::kRing) {
    ring_.map(header_, meta_);
    return;
  }
  table_error_ = nullptr;
  try {
    tensors_.reset(wire::read_tensor_table(meta_, header_, pool_));
  } catch (const std::exception&) {
    tensors_.reset({});
    table_error_ = std::current_exception();
    if (!ring_data()) skip_ = header_.data_bytes;
  }
  ring_.expect(ring_data() ? header_.data_bytes : 0);
  if (header_.data_bytes == 0) {
    finish(deliver);
    return;
  }
  seal_->begin();
  stage_ = Stage::kData;
}

void RingInbox::map(const wire::Header& header, const std::vector<char>& meta) {
  PUSH_CHECK(!ring_, kRpcOrigin, "malformed frame: a second shared-memory ring");
  PUSH_CHECK(header.meta_bytes == 32 && header.data_bytes == 0 && header.tensor_count == 0, kRpcOrigin,
             "malformed frame: a ring announcement of ", header.meta_bytes, " bytes");
  uint64_t v[4];
  std::memcpy(v, meta.data(), sizeof(v));
  const uint64_t slot_bytes = v[2], slots = v[3];
  PUSH_CHECK(slot_bytes >= 4096 && slot_bytes <= (uint64_t{1} << 30) && slots >= 1 && slots <= 4096, kRpcOrigin,
             "malformed frame: a ring of ", slots, " slots of ", slot_bytes, " bytes");
  ring_ = RecvRing::open(static_cast<int64_t>(std::min<uint64_t>(v[0], INT64_MAX)),
                         static_cast<int64_t>(std::min<uint64_t>(v[1], INT64_MAX)), slot_bytes,
                         static_cast<uint32_t>(slots));
}

std::size_t RingInbox::consume(const char* src, std::size_t avail, FrameSeal& seal, TensorFill& tensors, bool drop) {
  const std::size_t took = note_.take(src, avail);
  if (!note_.complete()) return took;
  seal.crypt(note_.bytes, note_.bytes, sizeof(note_.bytes));
  uint64_t bytes;
  std::memcpy(&bytes, note_.bytes, sizeof(bytes));
  const uint64_t due = std::min(left_, ring_->slot_bytes());
  PUSH_CHECK(bytes == due, kRpcOrigin, "malformed frame: a note of ", bytes, " bytes where ", due, " were due");
  const char* slot = ring_->front();
  if (!drop) {
    for (uint64_t done = 0; done < bytes;) {
      auto [dst, need] = tensors.window();
      PUSH_CHECK(dst != nullptr, kRpcOrigin, "malformed frame: more ring data than its tensors hold");
      const uint64_t take = std::min(need, bytes - done);
      std::memcpy(dst, slot + done, take);
      tensors.filled(take);
      done += take;
    }
  }
  ring_->pop();
  left_ -= bytes;
  return took;
}

void FrameReader::finish(const Deliver& deliver) {
  stage_ = Stage::kHeader;
  const wire::Header header = header_;
  c10::IValue value;
  std::exception_ptr error = table_error_;
  std::vector<at::Tensor> tensors = tensors_.take();
  tensors_.reset({});
  table_error_ = nullptr;
  if (!error) {
    try {
      value = wire::decode(meta_, tensors);
    } catch (const std::exception&) {
      error = std::current_exception();
    }
  }
  deliver(header, std::move(value), std::move(error));
}

}  // namespace push::dist::detail
