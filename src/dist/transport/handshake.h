#pragma once
// How a connection proves it belongs to the job (docs/distributed.md, "Who gets in").
//
// Every member of an RPC group holds the group's key: HMAC-SHA256 of the job's secret
// (World: from PUSH_JOB_SECRET, else drawn by rank 0 and handed on in a private file,
// secret_file.h) and the
// group's store prefix. Neither the secret nor the key ever travels on an RPC connection.
// A connection opens with a challenge–response that both sides check:
//
//   dialer   -> listener  kHello     id = dialer's group rank, meta = dialer's nonce (32 B)
//   listener -> dialer    kChallenge id = listener's group rank,
//                                    meta = listener's nonce (32 B) | listener's proof (32 B)
//   dialer   -> listener  kProof     meta = dialer's proof (32 B)
//
// A proof is HMAC(key, role | both nonces | both ranks | the listener's address): it cannot
// be replayed on another connection (fresh nonces), reflected (the role differs), moved to
// another rank (the ranks are in it) or relayed: a member dialing an address someone put in
// the store in place of the listener's real one (a relay that forwards the handshake to the
// real listener) gets a proof for the real address and hangs up, and the listener refuses
// the dialer's proof for the other one. Every handshake frame has a fixed size, so a listener reads at most
// kChallengeBytes from a peer that has not proved itself, and allocates nothing for it.
//
// The handshake also gives the connection its two session keys (one per direction) under
// which every later frame is sealed (frame_seal.h): fresh with the nonces, bound to the
// ranks and the listener's address like the proofs.
#include <array>
#include <chrono>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "dist/transport/wire.h"

namespace push::dist::detail::handshake {

constexpr std::size_t kBytes = 32;  // a key, a nonce, a proof
using Bytes = std::array<uint8_t, kBytes>;

constexpr std::size_t kHelloBytes = wire::kHeaderBytes + kBytes;
constexpr std::size_t kChallengeBytes = wire::kHeaderBytes + 2 * kBytes;
constexpr std::size_t kProofBytes = wire::kHeaderBytes + kBytes;

/// Bytes from the kernel's random source (getrandom). Throws push::Error when it fails.
Bytes random_bytes();
/// HMAC-SHA256 of `message` under `key`.
Bytes hmac(const Bytes& key, std::string_view message);
/// A fingerprint of the job secret `secret` (64 hex digits) that says nothing about it:
/// ranks compare theirs to find a rank given another secret.
std::string fingerprint(const Bytes& secret);
/// The key of the group with store prefix `prefix` in the job with secret `secret`.
Bytes group_key(const Bytes& secret, const std::string& prefix);
/// A proof for the connection from group rank `dialer` to group rank `listener`, by the
/// side `role` ("dialer" or "listener"), to the listener at `listener_address` ("a.b.c.d:port").
Bytes proof(const Bytes& key, std::string_view role, const Bytes& dialer_nonce, const Bytes& listener_nonce, int dialer,
            int listener, std::string_view listener_address);
/// The session keys of one connection: what the dialer sends is sealed under the first.
struct SessionKeys {
  Bytes dialer_to_listener{};
  Bytes listener_to_dialer{};
};
SessionKeys session_keys(const Bytes& key, const Bytes& dialer_nonce, const Bytes& listener_nonce, int dialer,
                         int listener, std::string_view listener_address);
/// Whether the frames of a connection to `listener_address` are encrypted: they are unless the
/// listener is on 127.x, where the link cannot leave the host. Both sides know the address (the
/// proofs bind it), so both choose alike.
bool encrypts(std::string_view listener_address);
/// Compares in time independent of where the two differ.
bool same(const Bytes& a, const Bytes& b);

/// 64 hexadecimal digits <-> 32 bytes; from_hex throws push::Error naming `what`.
std::string to_hex(const Bytes& bytes);
Bytes from_hex(const std::string& text, const char* what);

/// The listener's check of a handshake frame's header (its first 32 bytes), before reading
/// on: a hello (`hello`; its rank below `group_size`) or a proof, each with 32 bytes of meta
/// and nothing else. Throws push::Error naming what is wrong.
wire::Header check_header(const char* in, bool hello, int group_size);

/// The three frames, ready to write.
std::vector<char> hello_frame(int dialer, const Bytes& dialer_nonce);
std::vector<char> challenge_frame(int listener, const Bytes& listener_nonce, const Bytes& listener_proof);
std::vector<char> proof_frame(const Bytes& dialer_proof);

/// The dialer's side on a connected blocking socket `fd`: sends the hello, reads and checks
/// the listener's challenge (its rank must be `listener`, its address `listener_address`),
/// sends the proof. Waits at most
/// until `deadline` (steady clock). Returns the connection's session keys. Throws
/// push::Error saying what failed (`who` names the listener).
SessionKeys dial(int fd, const Bytes& key, int dialer, int listener, std::string_view listener_address,
                 std::chrono::steady_clock::time_point deadline, const std::string& who);

}  // namespace push::dist::detail::handshake
