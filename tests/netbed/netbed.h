#pragma once
// A test bed of several "hosts" on one machine: each host a Linux network namespace with
// its own address, all joined by one switch (a bridge in a namespace of its own). Links can
// be capped in rate (tbf), cut (partition), and a host's processes frozen (SIGSTOP) or
// killed. Needs root and iproute2; unavailable() says why not, for a test to skip on.
//
// Addresses are link-local (169.254.10.0/24), inside namespaces that only this bed's links
// reach: nothing leaves the machine, and two beds (two tests at once) never meet. Every
// namespace is removed by the destructor; a bed left behind by a killed test is removed by
// the next bed made on the machine (its names carry the pid that made it).
//
//   push::testing::NetBed bed(2);
//   bed.exec_prefix(0)         // "ip netns exec pushbed-...-h0": put in front of a command
//   bed.address(0)             // "169.254.10.1", host 0's address (MASTER_ADDR)
//   bed.partition(1); bed.heal(1); bed.freeze(1); bed.thaw(1); bed.kill(1);
#include <sys/types.h>

#include <string>
#include <vector>

namespace push::testing {

/// What the user-space switch does to the frames of one host's link, each way.
struct LinkSpec {
  double delay_ms = 0;   // one way
  double jitter_ms = 0;  // up to this much more, uniform, frames kept in order
  double loss = 0;       // probability a frame is dropped
  bool stalled = false;  // every frame held until the stall ends (then all go at once)
};

class NetBed {
 public:
  /// Why a bed cannot be made on this machine ("needs root", "no ip"), or "" when it can.
  static std::string unavailable();

  /// `hosts` namespaces joined by a switch, each link up at full speed. Throws
  /// std::runtime_error naming the command that failed (everything made is removed).
  explicit NetBed(int hosts);
  ~NetBed();
  NetBed(const NetBed&) = delete;
  NetBed& operator=(const NetBed&) = delete;

  int hosts() const { return static_cast<int>(hosts_.size()); }
  /// Host `h`'s IPv4 address.
  std::string address(int h) const;
  /// Host `h`'s namespace name.
  const std::string& name(int h) const { return hosts_.at(static_cast<size_t>(h)); }
  /// A command prefix that runs what follows inside host `h` (`ip netns exec NAME`, which
  /// execs it: the process id is the command's own).
  std::string exec_prefix(int h) const;
  /// The same as words (`ip`, `netns`, `exec`, NAME), for an exec of one's own.
  std::vector<std::string> exec_argv(int h) const;

  /// Caps host `h`'s link at `mbit` megabits per second each way (tbf on both ends of its
  /// link); 0 removes the cap.
  void rate(int h, double mbit);
  /// Delay, jitter, loss or a stall on host `h`'s link (netem is not in these kernels). The
  /// first call moves every link from the kernel's bridge to the user-space switch
  /// (push_netbed_switch, link_switch.cpp), for the rest of the bed's life.
  void link(int h, const LinkSpec& spec);
  /// Cuts host `h` off the switch: packets to and from it are dropped, its processes see
  /// nothing (no reset, no error) until heal(h).
  void partition(int h);
  void heal(int h);
  /// SIGSTOP / SIGCONT every process in host `h`'s namespace.
  void freeze(int h);
  void thaw(int h);
  /// SIGKILL every process in host `h`'s namespace (the caller reaps its own children).
  void kill(int h);
  /// Sets a network sysctl ("net.ipv4.tcp_congestion_control=reno") in every host: each
  /// namespace has its own. Throws std::runtime_error where the kernel refuses it.
  void sysctl(const std::string& setting);
  /// The processes in host `h`'s namespace now.
  std::vector<pid_t> processes(int h) const;

 private:
  void signal_all(int h, int sig);
  /// Writes every link's settings for the user-space switch and tells it (SIGHUP).
  void write_links();
  std::string prefix_;
  std::string switch_;
  std::vector<std::string> hosts_;
  std::vector<LinkSpec> links_;
  std::vector<bool> down_;
  std::string links_file_;  // the switch's settings; empty until link() is first called
  pid_t switch_pid_ = -1;
};

}  // namespace push::testing
