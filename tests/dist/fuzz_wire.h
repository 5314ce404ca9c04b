#pragma once
// One input of the wire fuzzer (tests/dist/fuzz/): what a member does with bytes from a
// peer, without the sockets. The first byte picks the decoder:
//   0: a frame: header, then the tensor table and the value over tensors filled from the
//      bytes that follow (as frame_reader.cpp does);
//   1: the listener's side of a handshake: the hello's and the proof's headers, and the
//      proof checked against a fixed key (handshake.h);
//   2: the dialer's side: a challenge frame checked as handshake::dial checks it;
//   3: a member's address from the store: its seal checked (and a sealed copy round-tripped);
//   4: frames after the handshake (frame_seal.h): the bytes read as a sealed stream, and the
//      same bytes sealed as frames and read back (every tag must open);
//   5: messages to push's store (rendezvous/store_wire.h): the bytes read as sealed messages,
//      and the same bytes sealed as messages and read back (every tag must open, every
//      request that decodes must encode to the same bytes).
// Every input must end in a value or a push::Error (or c10::Error), never a crash, a hang or
// a read out of bounds. The regression corpus (tests/dist/fuzz_corpus/) runs in the default
// suite through the same function.
#include <cstddef>
#include <cstdint>

namespace push::testing {

/// Runs one input; returns 0 (libFuzzer's convention).
int fuzz_wire(const uint8_t* data, std::size_t size);

}  // namespace push::testing
