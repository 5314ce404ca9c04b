#include "dist_test_util.h"

#include "poll_real.h"

#include <dirent.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <climits>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <thread>

extern char** environ;

namespace push::testing {

std::map<std::string, WorkerBody>& worker_registry() {
  static std::map<std::string, WorkerBody> registry;
  return registry;
}

std::string self_path() {
  char buffer[PATH_MAX];
  const ssize_t n = readlink("/proc/self/exe", buffer, sizeof(buffer) - 1);
  return n > 0 ? std::string(buffer, static_cast<size_t>(n)) : std::string();
}

int free_port() { return push::dist::free_port(); }

namespace {

int status_code(int status) {
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
  return -1;
}

/// fork + execve with everything allocated before the fork (the parent has threads).
pid_t spawn(const std::vector<std::string>& argv, const std::vector<std::string>& env, int out_fd) {
  std::vector<char*> args;
  for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  std::vector<char*> envp;
  for (const auto& e : env) envp.push_back(const_cast<char*>(e.c_str()));
  envp.push_back(nullptr);
  const pid_t parent = getpid();
  const pid_t pid = fork();
  if (pid == 0) {
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent) _exit(127);
    if (out_fd >= 0) {
      dup2(out_fd, STDOUT_FILENO);
      dup2(out_fd, STDERR_FILENO);
    }
    execve(args[0], args.data(), envp.data());
    _exit(127);
  }
  return pid;
}

std::vector<std::string> environment_with(const std::vector<std::string>& extra) {
  std::vector<std::string> env;
  for (char** e = environ; *e; ++e) {
    std::string entry(*e);
    const auto key = entry.substr(0, entry.find('=') + 1);
    bool overridden = false;
    for (const auto& x : extra) overridden |= x.rfind(key, 0) == 0;
    if (!overridden) env.push_back(entry);
  }
  env.insert(env.end(), extra.begin(), extra.end());
  return env;
}

}  // namespace

std::vector<int> run_workers(int n, const std::string& worker, std::chrono::seconds deadline,
                             const std::vector<std::string>& extra_env, const Placement& placement) {
  const int port = push::dist::free_port();
  std::vector<pid_t> pids;
  const auto host = [&](int r) { return placement.host_of.empty() ? 0 : placement.host_of.at(static_cast<size_t>(r)); };
  for (int r = 0; r < n; ++r) {
    int local = 0, local_size = 0;
    for (int q = 0; q < n; ++q) {
      local += q < r && host(q) == host(r);
      local_size += host(q) == host(r);
    }
    std::vector<std::string> vars = {
        "PUSH_DIST_WORKER=" + worker,          "RANK=" + std::to_string(r),
        "LOCAL_RANK=" + std::to_string(local), "LOCAL_WORLD_SIZE=" + std::to_string(local_size),
        "WORLD_SIZE=" + std::to_string(n),     "MASTER_ADDR=" + placement.master_addr,
        "MASTER_PORT=" + std::to_string(port)};
    vars.insert(vars.end(), extra_env.begin(), extra_env.end());
    std::vector<std::string> argv =
        placement.prefix.empty() ? std::vector<std::string>{} : placement.prefix.at(static_cast<size_t>(host(r)));
    argv.insert(argv.end(),
                {placement.binary.empty() ? self_path() : placement.binary, "--gtest_filter=DistWorker.DISABLED_Run",
                 "--gtest_also_run_disabled_tests", "--gtest_brief=1"});
    pids.push_back(spawn(argv, environment_with(vars), -1));
  }
  std::vector<int> codes(n, -1);
  std::vector<bool> done(n, false);
  // Real time, not push's Clock: the children run on the wall clock whatever clock this
  // process has installed.
  const auto end = std::chrono::steady_clock::now() + deadline;
  int left = n;
  poll_real(
      [&] {
        for (int r = 0; r < n; ++r) {
          int status = 0;
          if (!done[r] && waitpid(pids[r], &status, WNOHANG) == pids[r]) {
            codes[r] = status_code(status);
            done[r] = true;
            --left;
          }
        }
        return left == 0;
      },
      end - std::chrono::steady_clock::now(), std::chrono::milliseconds(20));
  for (int r = 0; r < n; ++r) {
    if (done[r]) continue;
    ADD_FAILURE() << "rank " << r << " of worker '" << worker << "' still ran after " << deadline.count()
                  << " s: killed";
    kill(pids[r], SIGKILL);
    waitpid(pids[r], nullptr, 0);
  }
  return codes;
}

std::pair<int, std::string> run_program(const std::vector<std::string>& argv, const std::vector<std::string>& extra_env,
                                        std::chrono::seconds deadline) {
  int fds[2];
  if (pipe(fds) != 0) throw std::runtime_error("run_program: pipe failed");
  const pid_t pid = spawn(argv, environment_with(extra_env), fds[1]);
  close(fds[1]);
  std::string output;
  const auto end = std::chrono::steady_clock::now() + deadline;
  char buffer[4096];
  for (;;) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(end - std::chrono::steady_clock::now());
    if (left.count() <= 0) break;
    pollfd p{fds[0], POLLIN, 0};
    if (poll(&p, 1, static_cast<int>(std::min<int64_t>(left.count(), 200))) > 0) {
      const ssize_t got = read(fds[0], buffer, sizeof(buffer));
      if (got <= 0) break;
      output.append(buffer, static_cast<size_t>(got));
    }
  }
  close(fds[0]);
  int status = 0;
  if (waitpid(pid, &status, WNOHANG) == 0) {
    // Output closed (or deadline) but still running: give it the rest of the deadline.
    const bool exited = poll_real([&] { return waitpid(pid, &status, WNOHANG) != 0; },
                                  end - std::chrono::steady_clock::now(), std::chrono::milliseconds(20));
    if (!exited) {
      ADD_FAILURE() << argv[0] << " still ran after " << deadline.count() << " s: killed";
      kill(pid, SIGKILL);
      waitpid(pid, &status, 0);
      return {-1, output};
    }
  }
  return {status_code(status), output};
}

int rings_here() {
  int n = 0;
  DIR* d = ::opendir("/proc/self/fd");
  if (d == nullptr) return -1;
  while (dirent* e = ::readdir(d)) {
    char target[256] = {};
    const auto path = std::string("/proc/self/fd/") + e->d_name;
    if (::readlink(path.c_str(), target, sizeof(target) - 1) > 0 &&
        std::string(target).rfind("/memfd:push-rpc-ring", 0) == 0) {
      ++n;
    }
  }
  ::closedir(d);
  return n;
}

void expect_all_ok(const std::vector<int>& codes) {
  for (size_t r = 0; r < codes.size(); ++r) EXPECT_EQ(codes[r], 0) << "rank " << r;
}

std::vector<std::string> proc_stat(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const auto close = text.rfind(") ");  // the name may hold spaces and parentheses
  std::vector<std::string> fields;
  if (close == std::string::npos) return fields;
  std::istringstream rest(text.substr(close + 2));
  for (std::string field; rest >> field;) fields.push_back(field);
  return fields;
}

bool is_stopped(pid_t pid) {
  const auto fields = proc_stat(pid);
  return !fields.empty() && fields[0] == "T";
}

double cpu_seconds(pid_t pid) {
  const auto fields = proc_stat(pid);
  if (fields.size() < 13) return 0;
  return (std::stod(fields[11]) + std::stod(fields[12])) / static_cast<double>(::sysconf(_SC_CLK_TCK));
}

double process_cpu_seconds() {
  rusage u{};
  ::getrusage(RUSAGE_SELF, &u);
  return static_cast<double>(u.ru_utime.tv_sec + u.ru_stime.tv_sec) +
         static_cast<double>(u.ru_utime.tv_usec + u.ru_stime.tv_usec) * 1e-6;
}

void wait_until_quiet(std::chrono::seconds limit) {
  double last = -1;  // the first look only starts the count
  poll_real(
      [&] {
        const double now = process_cpu_seconds();
        const bool quiet = last >= 0 && now - last < 0.03;  // 30% of the 100 ms between looks
        last = now;
        return quiet;
      },
      limit, std::chrono::milliseconds(100));
}

double cpu_seconds_over_an_idle_second() {
  wait_until_quiet();
  const double before = process_cpu_seconds();
  std::this_thread::sleep_for(std::chrono::seconds(1));  // real time is the point: CPU used over it
  return process_cpu_seconds() - before;
}

void shutdown_quietly(push::dist::RpcGroup& rpc) {
  try {
    rpc.shutdown();
  } catch (const push::Error&) {
  }
}

push::dist::World test_world(std::chrono::milliseconds timeout) {
  return push::dist::World(push::dist::WorldOptions::from_env()
                               .timeout(timeout)
                               .rpc_timeout(timeout)
                               .init_timeout(std::chrono::seconds(30))
                               .shutdown_timeout(std::chrono::seconds(10)));
}

}  // namespace push::testing

// The entry point of every child process.
TEST(DistWorker, DISABLED_Run) {
  const char* name = std::getenv("PUSH_DIST_WORKER");
  ASSERT_NE(name, nullptr) << "PUSH_DIST_WORKER is not set";
  auto& registry = push::testing::worker_registry();
  auto it = registry.find(name);
  ASSERT_NE(it, registry.end()) << "no worker named " << name;
  it->second();
}
