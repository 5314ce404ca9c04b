// The namespaces, links and signals of NetBed (netbed.h), through iproute2's `ip` and `tc`.
#include "netbed.h"

#include "poll_real.h"

#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <stdexcept>
#include <thread>

namespace push::testing {
namespace {

namespace fs = std::filesystem;
constexpr const char* kPrefix = "pushbed-";
constexpr const char* kNetnsDir = "/run/netns";

struct Ran {
  int code = -1;
  std::string output;  // stdout and stderr
};

/// Runs argv[0] (looked up on PATH) with `argv`, waits, returns its exit code and output.
Ran run(const std::vector<std::string>& argv) {
  int pipe_fds[2];
  if (::pipe2(pipe_fds, O_CLOEXEC) != 0) throw std::runtime_error("netbed: pipe failed");
  const pid_t pid = ::fork();
  if (pid < 0) throw std::runtime_error("netbed: fork failed");
  if (pid == 0) {
    ::dup2(pipe_fds[1], STDOUT_FILENO);
    ::dup2(pipe_fds[1], STDERR_FILENO);
    std::vector<char*> args;
    for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
    ::execvp(args[0], args.data());
    ::_exit(127);
  }
  ::close(pipe_fds[1]);
  Ran r;
  char buffer[1024];
  for (ssize_t got; (got = ::read(pipe_fds[0], buffer, sizeof(buffer))) != 0;) {
    if (got > 0) r.output.append(buffer, static_cast<size_t>(got));
    if (got < 0 && errno != EINTR) break;
  }
  ::close(pipe_fds[0]);
  while (!r.output.empty() && std::isspace(static_cast<unsigned char>(r.output.back()))) r.output.pop_back();
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  r.code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  return r;
}

/// Runs a command that must succeed: std::runtime_error naming it and its output otherwise.
void must(const std::vector<std::string>& argv) {
  const Ran r = run(argv);
  if (r.code == 0) return;
  std::string line;
  for (const auto& a : argv) line += (line.empty() ? "" : " ") + a;
  throw std::runtime_error("netbed: `" + line + "` failed (" + std::to_string(r.code) + "): " + r.output);
}

/// The namespace file's identity, to find the processes inside it.
bool same_namespace(const std::string& proc_ns, const struct stat& ns) {
  struct stat st {};
  return ::stat(proc_ns.c_str(), &st) == 0 && st.st_ino == ns.st_ino && st.st_dev == ns.st_dev;
}

std::vector<pid_t> processes_in(const std::string& name) {
  std::vector<pid_t> found;
  struct stat ns {};
  if (::stat((std::string(kNetnsDir) + "/" + name).c_str(), &ns) != 0) return found;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator("/proc", ec)) {
    const std::string pid = e.path().filename().string();
    if (pid.empty() || !std::all_of(pid.begin(), pid.end(), ::isdigit)) continue;
    if (same_namespace(e.path().string() + "/ns/net", ns)) found.push_back(static_cast<pid_t>(std::stol(pid)));
  }
  return found;
}

/// SIGKILLs everything in namespace `name` and removes it (no error when it is gone).
void remove_namespace(const std::string& name) {
  // At most 5 s: a process in D state may linger.
  push::testing::poll_real(
      [&] {
        const auto pids = processes_in(name);
        for (pid_t p : pids) ::kill(p, SIGKILL);
        return pids.empty();
      },
      std::chrono::seconds(5));
  run({"ip", "netns", "del", name});
}

/// Removes the namespaces of beds whose process is gone (a test killed before its
/// destructor ran).
void remove_stale_beds() {
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(kNetnsDir, ec)) {
    const std::string name = e.path().filename().string();
    if (name.rfind(kPrefix, 0) != 0) continue;
    const auto dash = name.find('-', std::string(kPrefix).size());
    const pid_t owner = static_cast<pid_t>(std::atol(name.substr(std::string(kPrefix).size(), dash).c_str()));
    if (owner > 0 && (::kill(owner, 0) == 0 || errno != ESRCH)) continue;
    remove_namespace(name);
  }
  // The user-space switch's settings files of dead beds.
  for (const auto& e : fs::directory_iterator(fs::temp_directory_path(), ec)) {
    const std::string name = e.path().filename().string();
    if (name.rfind(kPrefix, 0) != 0 || e.path().extension() != ".links") continue;
    const pid_t owner = static_cast<pid_t>(std::atol(name.substr(std::string(kPrefix).size()).c_str()));
    if (owner > 0 && ::kill(owner, 0) != 0 && errno == ESRCH) fs::remove(e.path(), ec);
  }
}

/// Host `h`'s port on the switch. (Built by append: GCC 12 warns, wrongly, of an overflow
/// in "p" + std::to_string(h).)
std::string port_of(int h) {
  std::string port = "p";
  port += std::to_string(h);
  return port;
}

}  // namespace

std::string NetBed::unavailable() {
  if (::geteuid() != 0) return "network namespaces need root";
  if (run({"ip", "-V"}).code != 0) return "iproute2's `ip` is not installed (apt-get install iproute2)";
  if (run({"tc", "-V"}).code != 0) return "iproute2's `tc` is not installed (apt-get install iproute2)";
  // Root without the capabilities (a container without CAP_SYS_ADMIN / CAP_NET_ADMIN): try.
  static const std::string probed = [] {
    const std::string probe = std::string(kPrefix) + std::to_string(::getpid()) + "-probe";
    const Ran made = run({"ip", "netns", "add", probe});
    if (made.code != 0) return "cannot make a network namespace (" + made.output + ")";
    const Ran bridge = run({"ip", "-n", probe, "link", "add", "br0", "type", "bridge"});
    run({"ip", "netns", "del", probe});
    if (bridge.code != 0) return "cannot make a bridge in a network namespace (" + bridge.output + ")";
    return std::string();
  }();
  return probed;
}

NetBed::NetBed(int hosts) {
  if (hosts < 1 || hosts > 200) throw std::runtime_error("netbed: 1 to 200 hosts, not " + std::to_string(hosts));
  if (const auto why = unavailable(); !why.empty()) throw std::runtime_error("netbed: " + why);
  remove_stale_beds();
  static std::atomic<int> beds{0};
  prefix_ = kPrefix + std::to_string(::getpid()) + "-" + std::to_string(beds++);
  switch_ = prefix_ + "-sw";
  try {
    must({"ip", "netns", "add", switch_});
    must({"ip", "-n", switch_, "link", "set", "lo", "up"});
    must({"ip", "-n", switch_, "link", "add", "br0", "type", "bridge"});
    must({"ip", "-n", switch_, "link", "set", "br0", "up"});
    for (int h = 0; h < hosts; ++h) {
      const std::string host = prefix_ + "-h" + std::to_string(h), port = port_of(h);
      hosts_.push_back(host);
      links_.emplace_back();
      down_.push_back(false);
      must({"ip", "netns", "add", host});
      must({"ip", "-n", host, "link", "set", "lo", "up"});
      must({"ip", "-n", host, "link", "add", "eth0", "type", "veth", "peer", "name", port, "netns", switch_});
      must({"ip", "-n", switch_, "link", "set", port, "master", "br0", "up"});
      must({"ip", "-n", host, "addr", "add", address(h) + "/24", "dev", "eth0"});
      must({"ip", "-n", host, "link", "set", "eth0", "up"});
    }
  } catch (...) {
    for (const auto& host : hosts_) remove_namespace(host);
    remove_namespace(switch_);
    throw;
  }
}

NetBed::~NetBed() {
  for (const auto& host : hosts_) remove_namespace(host);
  remove_namespace(switch_);  // kills the user-space switch too
  if (switch_pid_ > 0) ::waitpid(switch_pid_, nullptr, 0);
  if (!links_file_.empty()) ::unlink(links_file_.c_str());
}

void NetBed::write_links() {
  {
    std::ofstream out(links_file_ + ".new");
    for (int h = 0; h < hosts(); ++h) {
      const auto& l = links_[static_cast<size_t>(h)];
      out << port_of(h) << ' ' << l.delay_ms << ' ' << l.jitter_ms << ' ' << l.loss << ' ' << l.stalled << ' '
          << (down_[static_cast<size_t>(h)] ? 1 : 0) << '\n';
    }
  }
  if (::rename((links_file_ + ".new").c_str(), links_file_.c_str()) != 0) {
    throw std::runtime_error("netbed: cannot write " + links_file_);
  }
  if (switch_pid_ > 0) ::kill(switch_pid_, SIGHUP);
}

void NetBed::link(int h, const LinkSpec& spec) {
  links_.at(static_cast<size_t>(h)) = spec;
  if (!links_file_.empty()) return write_links();
  // First call: the user-space switch takes over from the bridge.
  links_file_ = (fs::temp_directory_path() / (prefix_ + ".links")).string();
  write_links();
  for (int p = 0; p < hosts(); ++p) must({"ip", "-n", switch_, "link", "set", port_of(p), "nomaster"});
  int ready[2];
  if (::pipe(ready) != 0) throw std::runtime_error("netbed: pipe failed");
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::dup2(ready[1], STDOUT_FILENO);
    ::close(ready[0]);
    const int ns = ::open((std::string(kNetnsDir) + "/" + switch_).c_str(), O_RDONLY | O_CLOEXEC);
    if (ns < 0 || ::setns(ns, CLONE_NEWNET) != 0) ::_exit(100);
    ::execl(PUSH_NETBED_SWITCH, PUSH_NETBED_SWITCH, links_file_.c_str(), static_cast<char*>(nullptr));
    ::_exit(127);
  }
  ::close(ready[1]);
  char word[6] = {};
  const ssize_t got = ::read(ready[0], word, 5);
  ::close(ready[0]);
  switch_pid_ = pid;
  if (got != 5 || std::string(word) != "ready") {
    throw std::runtime_error("netbed: the user-space switch (" PUSH_NETBED_SWITCH ") did not start");
  }
}

std::string NetBed::address(int h) const { return "169.254.10." + std::to_string(h + 1); }

std::vector<std::string> NetBed::exec_argv(int h) const { return {"ip", "netns", "exec", name(h)}; }

std::string NetBed::exec_prefix(int h) const {
  std::string prefix;
  for (const auto& word : exec_argv(h)) prefix += (prefix.empty() ? "" : " ") + word;
  return prefix;
}

void NetBed::rate(int h, double mbit) {
  const std::string port = port_of(h);
  for (const auto& [ns, dev] : {std::pair{name(h), std::string("eth0")}, std::pair{switch_, port}}) {
    run({"tc", "-n", ns, "qdisc", "del", "dev", dev, "root"});  // none yet: an error, ignored
    if (mbit <= 0) continue;
    // A bucket of 4 ms at the rate (at least 64 KiB): tbf needs one at least rate / HZ.
    const double burst = std::max(65536.0, mbit * 1e6 / 8 * 0.004);
    must({"tc", "-n", ns, "qdisc", "add", "dev", dev, "root", "tbf", "rate", std::to_string(mbit) + "mbit", "burst",
          std::to_string(static_cast<int64_t>(burst)), "latency", "100ms"});
  }
}

void NetBed::partition(int h) {
  down_.at(static_cast<size_t>(h)) = true;
  if (!links_file_.empty()) return write_links();
  must({"ip", "-n", switch_, "link", "set", port_of(h), "nomaster"});
}

void NetBed::heal(int h) {
  down_.at(static_cast<size_t>(h)) = false;
  if (!links_file_.empty()) return write_links();
  must({"ip", "-n", switch_, "link", "set", port_of(h), "master", "br0"});
}

void NetBed::sysctl(const std::string& setting) {
  for (int h = 0; h < hosts(); ++h) {
    auto argv = exec_argv(h);
    argv.insert(argv.end(), {"sysctl", "-q", "-w", setting});
    must(argv);
  }
}

std::vector<pid_t> NetBed::processes(int h) const { return processes_in(name(h)); }

void NetBed::signal_all(int h, int sig) {
  for (pid_t p : processes(h)) ::kill(p, sig);
}

void NetBed::freeze(int h) { signal_all(h, SIGSTOP); }
void NetBed::thaw(int h) { signal_all(h, SIGCONT); }
void NetBed::kill(int h) { signal_all(h, SIGKILL); }

}  // namespace push::testing
