#pragma once
// The fixture of the `push train` end-to-end tests: each test gets its own folder, runs
// the real binary there (to completion, or in the background to be killed) and reads
// what it wrote.
#include <gtest/gtest.h>

#include <poll.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

namespace push::testing {
namespace fs = std::filesystem;
using json = nlohmann::json;

struct Result {
  int code = -1;  // exit code, or 128 + signal
  std::string out, err;
};

inline std::string slurp(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

/// Lines of a program's stderr (a last line without '\n' counts), not counting the one
/// warning AddressSanitizer's runtime prints in every process that switches fibers (it
/// cannot be turned off).
inline int64_t lines_of(const std::string& text) {
  std::istringstream in(text);
  int64_t n = 0;
  for (std::string line; std::getline(in, line);) {
    const bool asan_fiber_warning =
        line.rfind("==", 0) == 0 &&
        line.find("WARNING: ASan doesn't fully support makecontext/swapcontext") != std::string::npos;
    n += !asan_fiber_warning;
  }
  return n;
}

/// The staging folders among `names` (core/staged_folder.h: `.NAME.partial-PID-N`, and
/// temporary files `.NAME.tmp-...`); with `prefix`, only those whose name starts with it
/// (".out.partial-": --out's; ".out.partial-1234-": --out's of process 1234).
inline std::vector<std::string> staging_folders(const std::vector<std::string>& names, const std::string& prefix = "") {
  std::vector<std::string> staged;
  for (const auto& n : names) {
    const bool any_staging = n.find(".partial-") != std::string::npos || n.find(".tmp-") != std::string::npos;
    if (prefix.empty() ? any_staging : n.rfind(prefix, 0) == 0) staged.push_back(n);
  }
  return staged;
}

/// " --samples N" for the algorithms that sample (mswag, mcdropout, sgld, sghmc); nothing
/// for the others, which refuse it.
inline std::string samples(const std::string& algo, int n) {
  // Not laplace: its default predictive (linearized) takes no samples.
  const bool samples = algo == "mswag" || algo == "mcdropout" || algo == "sgld" || algo == "sghmc";
  return samples ? " --samples " + std::to_string(n) : "";
}

/// What must not depend on how the particles are spread over lanes and ranks, or how the
/// ranks were started: a run's metrics.json without its timings and its layout.
inline json comparable(json m) {
  m.erase("timings");
  m["data"].erase("loaded_by");
  m["run"].erase("devices");
  m["run"].erase("ranks");
  return m;
}

/// sine-gap's measure of where the members disagree, from a run's band.csv (x, mean, sd,
/// epistemic_sd over a grid): the epistemic σ at the gap's centre (x = 0) over its mean at
/// the centres of the two data clusters (x = ±2.75), each read at the nearest grid point.
inline double gap_ratio(const fs::path& band_csv) {
  std::istringstream in(slurp(band_csv));
  std::string line;
  std::getline(in, line);
  if (line != "x,mean,sd,epistemic_sd") throw std::runtime_error("band.csv header: " + line);
  std::vector<std::pair<double, double>> rows;  // x, epistemic σ
  while (std::getline(in, line)) {
    double v[4];
    char comma;
    std::istringstream row(line);
    row >> v[0] >> comma >> v[1] >> comma >> v[2] >> comma >> v[3];
    if (!row) throw std::runtime_error("band.csv row: " + line);
    rows.emplace_back(v[0], v[3]);
  }
  if (rows.empty()) throw std::runtime_error("band.csv has no rows");
  auto at = [&](double x) {
    return std::min_element(rows.begin(), rows.end(),
                            [x](const auto& a, const auto& b) { return std::abs(a.first - x) < std::abs(b.first - x); })
        ->second;
  };
  return at(0.0) / ((at(-2.75) + at(2.75)) / 2);
}

class Cli : public ::testing::Test {
 protected:
  fs::path dir_ = fs::temp_directory_path() / ("push_cli_test_" + std::to_string(::getpid()) + "_" +
                                               ::testing::UnitTest::GetInstance()->current_test_info()->name());
  void SetUp() override {
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  /// Runs `push train ARGS` in the test's folder. With `max_file_bytes` >= 0, every file
  /// the run writes is capped at that size (RLIMIT_FSIZE, SIGXFSZ ignored): a write past
  /// the cap fails with EFBIG, as on a full disk, whoever writes it (LibTorch, gnuplot).
  /// `sub`: a folder of the test's folder to run in.
  /// `env`: extra VAR=value settings of the run.
  Result run(const std::string& args, int64_t max_file_bytes = -1, const std::string& sub = "",
             const std::vector<std::string>& env = {}) {
    // Output through pipes, not files: a file size cap must not silence the error itself.
    const std::string cmd = train_command(args, sub);
    int out[2], err[2];
    if (::pipe(out) != 0 || ::pipe(err) != 0) throw std::runtime_error("pipe");
    const pid_t pid = ::fork();
    if (pid == 0) {
      ::dup2(out[1], STDOUT_FILENO);
      ::dup2(err[1], STDERR_FILENO);
      for (int fd : {out[0], out[1], err[0], err[1]}) ::close(fd);
      if (max_file_bytes >= 0) {
        const rlimit cap{static_cast<rlim_t>(max_file_bytes), static_cast<rlim_t>(max_file_bytes)};
        ::signal(SIGXFSZ, SIG_IGN);  // kept across exec: writes fail with EFBIG instead
        ::setrlimit(RLIMIT_FSIZE, &cap);
      }
      if (address_space_ != RLIM_INFINITY) {
        const rlimit cap{address_space_, address_space_};
        ::setrlimit(RLIMIT_AS, &cap);
      }
      if (stack_ != RLIM_INFINITY) {
        const rlimit cap{stack_, stack_};
        ::setrlimit(RLIMIT_STACK, &cap);
      }
      if (open_files_ != RLIM_INFINITY) {
        const rlimit cap{open_files_, open_files_};
        ::setrlimit(RLIMIT_NOFILE, &cap);
      }
      exec_shell(cmd, env);
    }
    ::close(out[1]);
    ::close(err[1]);
    Result r;
    pollfd fds[2] = {{out[0], POLLIN, 0}, {err[0], POLLIN, 0}};
    std::string* texts[2] = {&r.out, &r.err};
    for (int open = 2; open > 0;) {
      if (::poll(fds, 2, -1) < 0) continue;
      for (int k = 0; k < 2; ++k) {
        if (fds[k].fd < 0 || !fds[k].revents) continue;
        char buffer[4096];
        const ssize_t got = ::read(fds[k].fd, buffer, sizeof(buffer));
        if (got > 0) {
          texts[k]->append(buffer, static_cast<size_t>(got));
        } else {
          ::close(fds[k].fd);
          fds[k].fd = -1;
          --open;
        }
      }
    }
    int status = 0;
    ::waitpid(pid, &status, 0);
    r.code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    return r;
  }
  /// Starts `push train ARGS` in the test's folder without waiting for it, its output to
  /// the file `log`, `env` added to its environment. Returns its process id: push train's
  /// own (the shell execs it), for the test to signal and reap.
  pid_t start(const std::string& args, const fs::path& log, const std::vector<std::string>& env = {}) {
    const std::string cmd = train_command(args) + " > '" + log.string() + "' 2>&1";
    const pid_t pid = ::fork();
    if (pid < 0) throw std::runtime_error("fork");
    if (pid == 0) exec_shell(cmd, env);
    return pid;
  }
  /// Trains `args` for `first` epochs with --save ck --out a, then resumes ck to `total`
  /// epochs with --out b: the shape of every save-then-resume test. A run that fails, or a
  /// resumed run that does not reach `total` epochs, is a fatal failure (call it in
  /// ASSERT_NO_FATAL_FAILURE); the resumed run's metrics.json is then metrics("b").
  void save_then_resume(const std::string& args, int64_t first, int64_t total) {
    const auto saved = run(args + " --epochs " + std::to_string(first) + " --save ck --out a");
    ASSERT_EQ(saved.code, 0) << saved.out << saved.err;
    const auto resumed = run(args + " --epochs " + std::to_string(total) + " --resume ck --out b");
    ASSERT_EQ(resumed.code, 0) << resumed.out << resumed.err;
    ASSERT_EQ(metrics("b")["run"]["epochs"], total);
  }
  json metrics(const std::string& out) { return json::parse(slurp(dir_ / out / "metrics.json")); }
  fs::path write(const std::string& name, const std::string& text) {
    fs::create_directories((dir_ / name).parent_path());
    std::ofstream(dir_ / name, std::ios::binary) << text;
    return dir_ / name;
  }
  /// A small two-class CSV: the class (`low`, `high`) is the sign of a + b.
  void write_classes(const std::string& name, int low = 0, int high = 1) {
    std::ostringstream s;
    s << "a,b,label\n";
    for (int i = 0; i < 80; ++i) {
      double a = std::sin(i * 1.3), b = std::cos(i * 0.7);
      s << a << ',' << b << ',' << (a + b > 0 ? high : low) << "\n";
    }
    write(name, s.str());
  }
  /// A launcher command line that run() and start() put in front of the tool (torchrun, mpirun).
  std::string launcher_;
  /// The address-space limit (RLIMIT_AS, `ulimit -v`) of the runs run() starts.
  rlim_t address_space_ = RLIM_INFINITY;
  /// The open-files limit (RLIMIT_NOFILE, `ulimit -n`) of the runs run() starts.
  rlim_t open_files_ = RLIM_INFINITY;
  /// The stack size limit (ulimit -s) of run()'s push train, in bytes.
  rlim_t stack_ = RLIM_INFINITY;
  bool has_gnuplot() { return std::system("command -v gnuplot >/dev/null 2>&1") == 0; }
  /// Every entry of the test's folder (names), hidden ones included.
  std::vector<std::string> entries(const fs::path& sub = {}) {
    std::vector<std::string> names;
    for (const auto& e : fs::directory_iterator(dir_ / sub)) names.push_back(e.path().filename().string());
    std::sort(names.begin(), names.end());
    return names;
  }

 private:
  /// The shell command that runs `push train ARGS` in the folder `sub` of the test's folder.
  std::string train_command(const std::string& args, const std::string& sub = "") const {
    return "cd '" + (dir_ / sub).string() + "' || exit 99; exec " + launcher_ + " '" PUSH_CLI_BINARY "' train " + args;
  }
  /// In a forked child: adds `env` to the environment and runs the shell `command`.
  [[noreturn]] static void exec_shell(const std::string& command, const std::vector<std::string>& env) {
    for (const auto& var : env) ::putenv(const_cast<char*>(var.c_str()));
    ::execl("/bin/sh", "sh", "-c", command.c_str(), static_cast<char*>(nullptr));
    ::_exit(127);
  }
};

}  // namespace push::testing
