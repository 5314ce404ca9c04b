#pragma once
// The socket calls the transport makes: addresses (parsed, spelled one way, advertised),
// the options of a member's connection, a non-blocking connect's wait, one read, and the
// timeout of a poll that waits for a deadline on push's Clock.
#include <sys/types.h>

#include <netinet/in.h>

#include <chrono>
#include <cstddef>
#include <string>

#include "core/clock.h"

namespace push::dist::detail {

/// "a.b.c.d:port" as a socket address. Throws push::Error naming the address.
sockaddr_in parse_address(const std::string& address);
/// "host:port" as "a.b.c.d:port" (one spelling per address, for the handshake's proofs).
/// Throws push::Error when it is not an IPv4 address and port.
std::string canonical_address(const std::string& address);
/// The address other members should dial this one at: 127.0.0.1 when the job's master is
/// local, the address of `interface` when given, else the address this host reaches the
/// master from.
std::string advertised_host(const std::string& master_addr, int master_port, const std::string& interface);

/// A member connection's options: no Nagle delay; a blocking send gives up after `timeout`.
void set_member_socket_options(int fd, std::chrono::milliseconds send_timeout);
/// Waits until `deadline` for the non-blocking connect of `fd` to finish: its error (0 when
/// connected, ETIMEDOUT when the deadline passed first).
int finish_connect(int fd, push::detail::Clock::time_point deadline);

enum class Received { kBytes, kNothingYet, kEnd };
/// One non-blocking read of at most `max` bytes into `into`: kBytes (`n` > 0), kNothingYet,
/// or kEnd when the connection ended or failed (`why` says how).
Received receive(int fd, char* into, std::size_t max, ssize_t& n, std::string& why);

/// The timeout of one poll()/epoll_wait() that waits for `deadline` (on push's Clock):
/// the milliseconds left, rounded up, at most `longest_ms`; at most Clock::kManualTick
/// while a ManualClock is installed, so that the waiter notices the test moving time.
int poll_timeout_ms(push::detail::Clock::time_point deadline, int longest_ms);

}  // namespace push::dist::detail
