// `push train`'s outputs and checkpoints on a hostile file system: a full disk (every file
// the run writes capped by RLIMIT_FSIZE, SIGXFSZ ignored, so each write past the cap fails
// with EFBIG as on a full disk, LibTorch's archive writer and gnuplot included), an
// unwritable --out, --save over a folder that is not a checkpoint, and staging folders
// left by killed runs. In every case: one line on stderr, a non-zero exit, and nothing
// partial published.
#include "cli_test_util.h"

#include <chrono>
#include <regex>
#include <set>
#include <tuple>

#include "core/clock.h"

namespace {
using namespace push::testing;
using namespace std::chrono_literals;
using push::detail::Clock;

constexpr int64_t KiB = 1024;

TEST_F(Cli, FullDiskIsAOneLineErrorAndPublishesNothing) {
  // 4 KiB: not even the predictions fit. 24 KiB: the tables fit, the pictures do not.
  // 120 KiB, classification: the tables and pictures fit, the particle files (LibTorch
  // archives of a 128x128 network and its Adam state, ~200 KiB) do not.
  write_classes("two.csv");
  const std::tuple<int, std::string, std::string> cases[] = {
      {4, "--epochs 2", "predictions.csv"},
      {24, "--epochs 2", ".png"},
      {24, "--epochs 2 --save ck", ".png"},
      {120, "--epochs 2 --data two.csv --task classification --model mlp:128,128 --save ck", "checkpoint"},
  };
  for (const auto& [kib, args, culprit] : cases) {
    auto r = run(args + " --particles 2 --quiet --out out", kib * KiB);
    const std::string what = std::to_string(kib) + " KiB, " + args;
    EXPECT_EQ(r.code, 1) << what << ": " << r.err;
    EXPECT_EQ(lines_of(r.err), 1) << what << ": " << r.err;
    EXPECT_NE(r.err.find("File too large"), std::string::npos) << what << ": " << r.err;
    EXPECT_NE(r.err.find(culprit), std::string::npos) << what << ": " << r.err;
    EXPECT_EQ(entries(), std::vector<std::string>{"two.csv"}) << what << ": nothing may be published or left behind";
    fs::remove_all(dir_ / "out");
    fs::remove_all(dir_ / "ck");
  }
}

TEST_F(Cli, ResultsThatCannotReachStandardOutputAreAnErrorNotExitZero) {
  // The metrics table goes to stdout: behind a full device it is lost, and the run says so.
  auto r = run("--epochs 1 --particles 2 --quiet --out none > /dev/full");
  EXPECT_EQ(r.code, 1) << r.err;
  EXPECT_EQ(lines_of(r.err), 1) << r.err;
  EXPECT_NE(r.err.find("push train: cannot write to standard output"), std::string::npos) << r.err;
  // A run that printed nothing there has nothing to lose.
  r = run("--help > /dev/null");
  EXPECT_EQ(r.code, 0) << r.err;
}

TEST_F(Cli, FullDiskDuringSaveKeepsThePreviousCheckpoint) {
  auto first = run("--epochs 2 --particles 2 --model mlp:8 --quiet --save ck --out a");
  ASSERT_EQ(first.code, 0) << first.err;
  const std::string config = slurp(dir_ / "ck" / "config.json");
  // The same run to 4 epochs, but its particle files cannot be written.
  auto full = run("--epochs 4 --particles 2 --model mlp:8 --quiet --resume ck --save ck --out b", 6 * KiB);
  EXPECT_EQ(full.code, 1) << full.err;
  EXPECT_EQ(lines_of(full.err), 1) << full.err;
  EXPECT_FALSE(fs::exists(dir_ / "b"));
  EXPECT_EQ(slurp(dir_ / "ck" / "config.json"), config);
  EXPECT_EQ(staging_folders(entries()), std::vector<std::string>{});
  // The old checkpoint still resumes, and a save that fits replaces it.
  auto again = run("--epochs 4 --particles 2 --model mlp:8 --quiet --resume ck --save ck --out b");
  ASSERT_EQ(again.code, 0) << again.err;
  EXPECT_EQ(metrics("b")["run"]["epochs"], 4);
  auto resumed = run("--epochs 5 --particles 2 --model mlp:8 --quiet --resume ck --out c");
  ASSERT_EQ(resumed.code, 0) << resumed.err;
  EXPECT_EQ(metrics("c")["loss_curve"].size(), 5u);
  EXPECT_EQ(entries(), (std::vector<std::string>{"a", "b", "c", "ck"}));
}

TEST_F(Cli, SaveRefusesAFolderThatIsNotACheckpoint) {
  write("mine/notes.txt", "precious");
  auto r = run("--epochs 1 --particles 2 --quiet --save mine --out o");
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.err.find("not a push train checkpoint"), std::string::npos) << r.err;
  EXPECT_EQ(lines_of(r.err), 1) << r.err;
  EXPECT_EQ(slurp(dir_ / "mine" / "notes.txt"), "precious");
  EXPECT_FALSE(fs::exists(dir_ / "o"));
  // Refused before training: no progress bar... and no epoch was spent.
  EXPECT_EQ(r.err.find("epoch"), std::string::npos) << r.err;

  write("afile", "x");
  auto file = run("--epochs 1 --particles 2 --quiet --save afile --out o");
  EXPECT_NE(file.code, 0);
  EXPECT_EQ(slurp(dir_ / "afile"), "x");

  // An empty folder is fine.
  fs::create_directories(dir_ / "empty");
  auto ok = run("--epochs 1 --particles 2 --quiet --save empty --out o");
  ASSERT_EQ(ok.code, 0) << ok.err;
  EXPECT_TRUE(fs::exists(dir_ / "empty" / "config.json"));
}

TEST_F(Cli, SaveAndOutMustNotOverlap) {
  write("same/metrics.json", "{}");
  for (const std::string args : {"--save same --out same", "--save same/ck --out same", "--save ck --out ck/out",
                                 "--save ./same/../same --out same"}) {
    auto r = run("--epochs 1 --particles 2 --quiet " + args);
    EXPECT_NE(r.code, 0) << args;
    EXPECT_NE(r.err.find("--save"), std::string::npos) << args << ": " << r.err;
    EXPECT_NE(r.err.find("--out"), std::string::npos) << args << ": " << r.err;
    EXPECT_EQ(lines_of(r.err), 1) << args << ": " << r.err;
    EXPECT_EQ(slurp(dir_ / "same" / "metrics.json"), "{}") << args;
    EXPECT_FALSE(fs::exists(dir_ / "ck")) << args;
  }
}

TEST_F(Cli, UnwritableOutFailsBeforeTraining) {
  write("afile", "x");
  for (const std::string out : {"afile/out", "/proc/push-cli-test-out", "afile"}) {
    auto r = run("--epochs 1000 --particles 2 --out " + out);
    EXPECT_NE(r.code, 0) << out;
    EXPECT_NE(r.err.find(out), std::string::npos) << out << ": " << r.err;
    EXPECT_EQ(lines_of(r.err), 1) << out << ": " << r.err;
    EXPECT_EQ(r.err.find("ETA"), std::string::npos) << out << ": trained before failing: " << r.err;
  }
  EXPECT_EQ(slurp(dir_ / "afile"), "x");
  // A full disk found before training, too.
  auto full = run("--epochs 1000 --particles 2 --out o", 0);
  EXPECT_NE(full.code, 0);
  EXPECT_EQ(full.err.find("ETA"), std::string::npos) << full.err;
  EXPECT_NE(full.err.find("File too large"), std::string::npos) << full.err;
}

TEST_F(Cli, OutIsReplacedInOneStepAndForeignFoldersAreRefused) {
  write_classes("two.csv");
  // A classification run writes reliability.png (with gnuplot) and no band.csv...
  auto a = run("--epochs 1 --particles 2 --quiet --data two.csv --task classification --out o");
  ASSERT_EQ(a.code, 0) << a.err;
  if (has_gnuplot()) EXPECT_TRUE(fs::exists(dir_ / "o" / "reliability.png"));
  // ... a regression run replacing it leaves none of the older run's files mixed in.
  auto b = run("--epochs 2 --particles 2 --quiet --out o");
  ASSERT_EQ(b.code, 0) << b.err;
  EXPECT_FALSE(fs::exists(dir_ / "o" / "reliability.png"));
  EXPECT_EQ(metrics("o")["run"]["epochs"], 2);
  EXPECT_EQ(entries(), (std::vector<std::string>{"o", "two.csv"}));
  // A folder holding something push train does not write is not replaced.
  write("mine/thesis.tex", "precious");
  auto c = run("--epochs 1 --particles 2 --quiet --out mine");
  EXPECT_NE(c.code, 0);
  EXPECT_NE(c.err.find("thesis.tex"), std::string::npos) << c.err;
  EXPECT_EQ(slurp(dir_ / "mine" / "thesis.tex"), "precious");
  EXPECT_EQ(entries("mine"), std::vector<std::string>{"thesis.tex"});
  // The folder it runs in (or one holding it) is never replaced, even when it is empty.
  fs::create_directories(dir_ / "empty");
  for (const std::string out : {".", "..", "''"}) {
    auto r = run("--epochs 1 --particles 2 --quiet --data ../two.csv --out " + out, -1, "empty");
    EXPECT_NE(r.code, 0) << out;
    EXPECT_EQ(lines_of(r.err), 1) << out << ": " << r.err;
  }
  EXPECT_TRUE(fs::is_directory(dir_ / "empty"));
}

TEST_F(Cli, FoldersThatOnlyLookLikeStagingFoldersAreKept) {
  // Staging folders are recognised by the claim push writes beside each one, never by name
  // alone: folders of the user's named like them, for a dead process, are left alone, and
  // so is one whose claim is a copy made for another folder or is another user's.
  const pid_t dead = [] {
    const pid_t p = fork();
    if (p == 0) _exit(0);
    int status = 0;
    waitpid(p, &status, 0);
    return p;
  }();
  const std::string tag = ".partial-" + std::to_string(dead) + "-0";
  write(".out.partial-2024-01/thesis.tex", "mine");
  write(".out" + tag + "/metrics.json", "{}");
  write(".ck" + tag + "/checkpoint/blob", std::string(1000, 'x'));
  // A claim as push writes it, but for the other folder's name.
  write(".ck" + tag + ".claim", "push staging folder '.out" + tag + "' of process " + std::to_string(dead) + "\n");
  // A true claim, but the folder and its claim belong to another user (root can make one).
  if (::geteuid() == 0) {
    const std::string other = ".out.partial-" + std::to_string(dead) + "-1";
    write(other + "/metrics.json", "{}");
    write(other + ".claim", "push staging folder '" + other + "' of process " + std::to_string(dead) + "\n");
    ASSERT_EQ(::chown((dir_ / other).c_str(), 65534, 65534), 0);
    ASSERT_EQ(::chown((dir_ / (other + ".claim")).c_str(), 65534, 65534), 0);
  }
  const auto before = entries();
  auto r = run("--epochs 1 --particles 2 --quiet --save ck --out out");
  ASSERT_EQ(r.code, 0) << r.err;
  auto expected = before;
  expected.push_back("ck");
  expected.push_back("out");
  std::sort(expected.begin(), expected.end());
  EXPECT_EQ(entries(), expected);
  EXPECT_EQ(slurp(dir_ / ".out.partial-2024-01/thesis.tex"), "mine");
}

TEST_F(Cli, KilledRunsLeaveNothingThatLingers) {
  // Kill runs at different moments: once --out is staged, once --save is too, and in the
  // middle of training; each leaves staging folders behind, and the next run cleans up.
  // The progress bar (on stderr, in a log beside the test's folder) shows training begun.
  const fs::path log = dir_.string() + ".log";
  for (const std::string moment : {"--out staged", "--save staged", "training"}) {
    const pid_t pid = start("--epochs 100000 --particles 2 --save ck --out out", log);
    const std::string out = ".out.partial-" + std::to_string(pid) + "-";
    const std::string ck = ".ck.partial-" + std::to_string(pid) + "-";
    const bool reached = Clock::poll_until(Clock::deadline_after(60s), 5ms, [&] {
      const auto names = entries();
      const bool out_staged = !staging_folders(names, out).empty(), ck_staged = !staging_folders(names, ck).empty();
      if (moment == "training") return ck_staged && slurp(log).find("] epoch ") != std::string::npos;
      return out_staged && (moment == "--out staged" || ck_staged);
    });
    ::kill(pid, SIGKILL);
    int status = 0;
    ::waitpid(pid, &status, 0);
    ASSERT_TRUE(reached) << moment << ": the run did not get there";
    EXPECT_FALSE(staging_folders(entries(), out).empty()) << moment;
  }
  fs::remove(log);
  auto r = run("--epochs 1 --particles 2 --quiet --save ck --out out");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(entries(), (std::vector<std::string>{"ck", "out"}));
}

TEST_F(Cli, NonFiniteMetricsAreAnErrorNotAResult) {
  auto r = run("--epochs 2 --particles 2 --lr 1e30 --quiet --out new/deep/o");
  EXPECT_NE(r.code, 0) << r.out;
  EXPECT_EQ(lines_of(r.err), 1) << r.err;
  EXPECT_NE(r.err.find("non-finite"), std::string::npos) << r.err;
  // Not even the parent folders made for --out are left.
  EXPECT_EQ(entries(), std::vector<std::string>{});
}

TEST_F(Cli, MembersThatDivergedAreWarnedAboutAndStrictMakesItAnError) {
  // Boston at three times the paper's rate 0.1, kept constant: members' losses rise again
  // and their test errors are many times the data's spread, yet every number is finite.
  // Which members diverge depends on the CPU's kernels (AVX2, AVX-512 and OpenBLAS's core
  // type each give another trajectory), so the test asserts that some member is named, not
  // which one. Over seeds 0-7 under ATEN_CPU_CAPABILITY default/avx2/avx512 and
  // OPENBLAS_CORETYPE Haswell/SkylakeX, at least 2 of the 8 members' losses rose and all 8
  // were worse than the mean; at --lr 0.1 with 4 members, some runs named no loss that rose.
  const std::string args =
      "--data boston_house_prices --lr 0.3 --lr-schedule constant --epochs 20 --particles 8 --quiet";
  auto r = run(args + " --out o");
  ASSERT_EQ(r.code, 0) << r.err;
  const std::regex rose("push train: warning: particle [0-7]: its training loss ended at [-0-9.e+]+ in epoch 20");
  EXPECT_TRUE(std::regex_search(r.err, rose)) << r.err;
  EXPECT_NE(r.err.find("the learning rate (--lr 0.3) is likely too high"), std::string::npos) << r.err;
  EXPECT_LE(lines_of(r.err), 6) << r.err;  // five lines at most, then how many more
  const auto m = metrics("o");
  ASSERT_GE(m["warnings"].size(), 2u) << m.dump(2);
  std::set<std::string> kinds;
  for (const auto& w : m["warnings"]) {
    kinds.insert(w["kind"].get<std::string>());
    if (w["kind"] == "miscalibrated") {
      EXPECT_TRUE(w["particle"].is_null()) << w.dump();  // the whole predictive
      continue;
    }
    EXPECT_LT(w["particle"].get<int>(), 8) << w.dump();
    if (w["kind"] == "worse_than_mean") {
      EXPECT_NE(w["message"].get<std::string>().find("test predictions are worse than predicting the training data's"),
                std::string::npos)
          << w.dump();
    }
  }
  EXPECT_TRUE(kinds.count("loss_rose") && kinds.count("worse_than_mean")) << m.dump(2);
  ASSERT_EQ(m["particle_losses"].size(), 8u);
  for (const auto& p : m["particle_losses"]) EXPECT_LE(p["best"].get<double>(), p["last"].get<double>());
  // --strict: one line naming a member, exit non-zero, nothing written.
  auto s = run(args + " --strict --out s");
  EXPECT_NE(s.code, 0);
  EXPECT_EQ(lines_of(s.err), 1) << s.err;
  EXPECT_TRUE(std::regex_search(s.err, std::regex("--strict: particle [0-7]: "))) << s.err;
  EXPECT_FALSE(fs::exists(dir_ / "s"));
  // A rate too small to move the members is not blamed as too high: their losses end near
  // their best, and the warnings say what would help.
  auto slow = run("--lr 1e-6 --epochs 20 --particles 8 --quiet --out slow");
  ASSERT_EQ(slow.code, 0) << slow.err;
  EXPECT_GE(lines_of(slow.err), 1) << "the members are no better than the mean";
  EXPECT_EQ(slow.err.find("too high"), std::string::npos) << slow.err;
  EXPECT_NE(slow.err.find("or a larger --lr than 1e-06"), std::string::npos) << slow.err;
  // A run that trains well says nothing, --strict or not, and records no warning.
  auto ok = run("--epochs 20 --particles 4 --quiet --strict --out ok");
  ASSERT_EQ(ok.code, 0) << ok.err;
  EXPECT_EQ(lines_of(ok.err), 0) << ok.err;
  EXPECT_TRUE(metrics("ok")["warnings"].empty());
}

// Boston at the paper's rate, 0.1 with the cosine default: runs that trained badly without
// diverging, whose members predict a noise many times their errors (docs/bayes.md, *Runs
// that warn*). On splits 1 and 7 no member's loss rose and none predicts worse than the
// mean; the calibration check names the run. At the documented 0.01 the same splits are
// clean.
TEST_F(Cli, ARunWhoseIntervalsAreFarTooWideIsWarnedAbout) {
  for (std::string seed : {"1", "7"}) {
    const std::string args =
        "--data boston_house_prices --model mlp:50 --test-fraction 0.1 --epochs 40 --quiet --seed " + seed;
    auto bad = run(args + " --lr 0.1 --out bad");
    ASSERT_EQ(bad.code, 0) << bad.err;
    EXPECT_NE(bad.err.find("push train: warning: the predictive's intervals are too wide for its test errors: the "
                           "median |y - mean| / sd is "),
              std::string::npos)
        << bad.err;
    EXPECT_NE(bad.err.find("the learning rate (--lr 0.1) may be too high"), std::string::npos) << bad.err;
    bool named = false;
    const auto m = metrics("bad");
    for (const auto& w : m["warnings"]) {
      if (w["kind"] != "miscalibrated") continue;
      named = true;
      EXPECT_TRUE(w["particle"].is_null());
      EXPECT_LT(w["value"].get<double>(), w["reference"].get<double>() / 3) << w.dump();
    }
    EXPECT_TRUE(named) << seed;
    auto ok = run(args + " --out ok");
    ASSERT_EQ(ok.code, 0) << ok.err;
    EXPECT_EQ(lines_of(ok.err), 0) << seed << ": " << ok.err;
    fs::remove_all(dir_ / "bad");
    fs::remove_all(dir_ / "ok");
  }
}

// SG-MCMC runs report their chains' split-R-hat and drift (push/bayes/mixing.h) in
// metrics.json, and a hint when the chains were still moving: here, chains descending from
// their initialisation while they keep samples (no burn-in, 10 epochs); the defaults are
// stationary.
TEST_F(Cli, ChainsThatHaveNotMixedGetAHint) {
  auto early = run("--algo sgld --epochs 10 --burn-in 0 --quiet --out early");
  ASSERT_EQ(early.code, 0) << early.err;
  EXPECT_NE(early.err.find("push train: hint: the chains were still moving while they kept samples"), std::string::npos)
      << early.err;
  const auto m = metrics("early")["mixing"];
  EXPECT_GT(m["drift_median"].get<double>(), 1.1) << m.dump();
  EXPECT_EQ(m["stationary"], false);
  EXPECT_EQ(m["values"], metrics("early")["data"]["test_size"]);
  for (std::string algo : {"sgld", "sghmc"}) {
    auto r = run("--algo " + algo + " --quiet --out " + algo);
    ASSERT_EQ(r.code, 0) << r.err;
    EXPECT_EQ(r.err.find("hint"), std::string::npos) << algo << ": " << r.err;
    const auto mixing = metrics(algo)["mixing"];
    EXPECT_LE(mixing["drift_median"].get<double>(), 1.1) << algo << ": " << mixing.dump();
    EXPECT_EQ(mixing["stationary"], true) << algo;
  }
  ASSERT_EQ(run("--epochs 2 --quiet --out ens").code, 0);
  EXPECT_FALSE(metrics("ens").contains("mixing"));  // not chains
}

}  // namespace
