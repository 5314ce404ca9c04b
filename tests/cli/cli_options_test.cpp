// Every option of push train is checked, and refused with one line that names it: NaN and
// infinity, numbers out of range, options that would be ignored, a run that cannot fit in
// memory, data that is no table at all; with --nproc, still one line.
#include "cli_test_util.h"

#include <push/core/cores.h>

#include <thread>

namespace {
using namespace push::testing;

/// Runs `args` and expects a refusal: a non-zero exit, one line on stderr holding `needle`,
/// no control byte in it, and nothing written.
#define EXPECT_REFUSED(args, needle)                                                \
  do {                                                                              \
    const std::string a = (args);                                                   \
    auto r = run(a + " --quiet --out should-not-exist");                            \
    EXPECT_NE(r.code, 0) << a;                                                      \
    EXPECT_NE(r.err.find(needle), std::string::npos) << a << " -> " << r.err;       \
    EXPECT_EQ(lines_of(r.err), 1) << a << " -> " << r.err;                          \
    EXPECT_EQ(r.err.find('\x1b'), std::string::npos) << a << ": a raw escape byte"; \
    EXPECT_EQ(r.err.find("ETA"), std::string::npos) << a << ": trained first";      \
    EXPECT_FALSE(fs::exists(dir_ / "should-not-exist")) << a;                       \
  } while (false)

TEST_F(Cli, NonFiniteAndOutOfRangeNumbersAreRefusedByName) {
  for (const std::string option :
       {"--lr", "--noise-std", "--prior-std", "--swag-lr", "--bandwidth", "--dropout", "--test-fraction"}) {
    for (const std::string value : {"nan", "inf", "-inf", "0x1p-3"}) {
      EXPECT_REFUSED(option + " " + value, option + ": '" + value + "' is not a finite decimal number");
    }
  }
  EXPECT_REFUSED("--lr 0", "--lr: '0' must be greater than 0");
  EXPECT_REFUSED("--dropout 0.99", "--dropout: '0.99' must be from 0 to 0.95");
  EXPECT_REFUSED("--test-fraction 1", "--test-fraction: '1' must be greater than 0 and less than 1");
  EXPECT_REFUSED("--seed -1", "--seed: '-1' must be a whole number from 0 to 18446744073709551615");
  EXPECT_REFUSED("--seed 18446744073709551616", "--seed: '18446744073709551616' must be a whole number");
  EXPECT_REFUSED("--limit -1", "--limit: '-1' must be a whole number from 0 to 1099511627776");
  EXPECT_REFUSED("--epochs 1.5", "--epochs: '1.5' must be a whole number");
  EXPECT_REFUSED("--particles 100001", "--particles: '100001' must be a whole number from 1 to 100000");
  EXPECT_REFUSED("--model mlp:99999999",
                 "bad width '99999999' in model 'mlp:99999999' (expected whole numbers "
                 "from 1 to 1048576)");
  // The largest seed is a seed.
  auto big = run("--seed 18446744073709551615 --epochs 1 --particles 2 --quiet --out o");
  ASSERT_EQ(big.code, 0) << big.err;
  EXPECT_EQ(metrics("o")["config"]["seed"], 18446744073709551615ull);
}

TEST_F(Cli, OptionsThatWouldBeIgnoredAreRefused) {
  EXPECT_REFUSED("--algo svgd --bootstrap", "--bootstrap is for --algo ensemble or laplace, not svgd");
  EXPECT_REFUSED("--samples 5", "--samples is for --algo mswag, mcdropout, sgld, sghmc or laplace, not ensemble");
  EXPECT_REFUSED("--algo sghmc --preconditioned", "--preconditioned is for --algo sgld, not sghmc");
  EXPECT_REFUSED("--algo ensemble --no-preconditioned", "--no-preconditioned is for --algo sgld, not ensemble");
  EXPECT_REFUSED("--algo sgld --preconditioned --no-preconditioned", "--preconditioned excludes --no-preconditioned");
  EXPECT_REFUSED("--friction 0.5", "--friction is for --algo sghmc, not ensemble");
  EXPECT_REFUSED("--algo svgd --thin 2", "--thin is for --algo sgld or sghmc, not svgd");
  EXPECT_REFUSED("--algo sgld --lr-schedule cosine",
                 "--lr-schedule is for --algo ensemble, mswag, svgd, mcdropout or laplace, not sgld");
  EXPECT_REFUSED("--algo ensemble --rank 3", "--rank is for --algo mswag, not ensemble");
  EXPECT_REFUSED("--algo mswag --dropout 0.2", "--dropout is for --algo mcdropout, not mswag");
  EXPECT_REFUSED("--algo mcdropout --bandwidth 1", "--bandwidth is for --algo svgd, not mcdropout");
  EXPECT_REFUSED("--noise-std 0.5", "--noise-std is for --likelihood gaussian");
  EXPECT_REFUSED("--allow-data-change", "--allow-data-change is for --resume");
  EXPECT_REFUSED("--algo mswag --epochs 2 --pretrain-epochs 2", "--pretrain-epochs 2 leaves none of the 2 epochs");
  // MultiSWAG collecting less often than its collecting epochs have steps: nothing collected.
  EXPECT_REFUSED("--algo mswag --epochs 4 --pretrain-epochs 2 --batch-size 1000 --collect-every 3",
                 "--collect-every 3 is more than the 2 steps of the collecting epochs (2 epochs x 1 steps)");
  // SG-MCMC: options that would keep no sample, before any training.
  EXPECT_REFUSED("--algo sgld --epochs 4 --burn-in 4",
                 "--burn-in 4 leaves none of the 4 epochs (--epochs) for sampling");
  EXPECT_REFUSED("--algo sghmc --epochs 4 --cycles 5", "--cycles 5 is more than the 4 epochs");
  EXPECT_REFUSED("--algo sgld --epochs 4 --burn-in 2 --batch-size 1000 --thin 3",
                 "--thin 3 is more than the 2 steps that keep samples (2 sampling epochs x 1 steps)");
  EXPECT_REFUSED("--algo sgld --epochs 5 --cycles 2 --burn-in 3",
                 "no epoch of the 5 (--epochs) keeps samples: --cycles 2 leaves each cycle's first half to exploring, "
                 "and --burn-in 3 the first epochs");
  auto evaluate_only = run("--algo sgld --epochs 0 --particles 2 --quiet --out none");  // nothing to sample
  EXPECT_EQ(evaluate_only.code, 0) << evaluate_only.err;
  EXPECT_REFUSED("--algo sghmc --friction 0", "--friction");
  EXPECT_REFUSED("--algo sghmc --friction 1.5", "--friction");
  EXPECT_REFUSED("--algo sgld --lr -1", "--lr");
  EXPECT_REFUSED("--prior-scale -0.5", "--prior-scale: '-0.5' must be");
  EXPECT_REFUSED("--laplace-structure diagonal", "--laplace-structure is for --algo laplace, not ensemble");
  EXPECT_REFUSED("--algo laplace --samples 3", "--samples is for --laplace-predictive sampling");
  EXPECT_REFUSED("--algo laplace --laplace-prior-precision 0", "--laplace-prior-precision");
  EXPECT_REFUSED("--algo svgd --laplace", "--laplace is for --algo ensemble or laplace, not svgd");
  // Refused before training, not after it (the last layer would be a sum with the prior's).
  EXPECT_REFUSED("--algo laplace --prior-scale 1", "--algo laplace does not take --prior-scale");
  EXPECT_REFUSED("--laplace --model mlp:64,9000",
                 "--model mlp:64,9000 has 18002 parameters in its last layer, too many for a full covariance (at most "
                 "8192): use --laplace-structure diagonal");
  EXPECT_REFUSED("--algo sgld --data-parallel blocking --nproc 2", "--data-parallel does not train --algo sgld");
  EXPECT_REFUSED("--prior-scale inf", "--prior-scale: 'inf' is not a finite decimal number");
  // IDX data has its own test set: a directory with IDX files is recognised before loading.
  fs::create_directories(dir_ / "idx");
  EXPECT_REFUSED("--data idx --test-fraction 0.3", "--test-fraction is not for IDX data");
}

TEST_F(Cli, MessagesNameTheRealProblem) {
  EXPECT_REFUSED("--epochs 1 --save ''", "--save is empty");
  for (const auto& [out, needle] : {std::pair<std::string, std::string>{"''", "--out is empty"},
                                    {std::string(240, 'x'), "its name has 240 characters; at most 223"}}) {
    auto r = run("--epochs 1 --particles 2 --quiet --out " + out);
    EXPECT_NE(r.code, 0) << out;
    EXPECT_NE(r.err.find(needle), std::string::npos) << r.err;
    EXPECT_EQ(lines_of(r.err), 1) << r.err;
    EXPECT_EQ(entries(), std::vector<std::string>{}) << out;
  }
  // Garbage in a data file is quoted with its control bytes escaped.
  write("esc.csv", "a,b\n1,\x1b[31mred\r\n");
  EXPECT_REFUSED("--data esc.csv", "'\\x1b[31mred' is not a number");
  write("hex.csv", "a,b\n0x10,1\n2,3\n");
  EXPECT_REFUSED("--data hex.csv", "'0x10' is not a number");
  // A device or a FIFO is not read at all (it could be endless, or readable only once).
  EXPECT_REFUSED("--data /dev/zero", "'/dev/zero' is not a regular file");
  // A file without lines stops at the bound, at once, not when memory runs out.
  write("line.csv", std::string((1 << 20) + 10, '1'));
  EXPECT_REFUSED("--data line.csv", "line.csv line 1 is longer than 1048576 bytes");
  // No epoch trained: no loss curve to draw, and nothing said about gnuplot.
  auto none = run("--epochs 0 --particles 2 --quiet --out o");
  ASSERT_EQ(none.code, 0) << none.err;
  EXPECT_EQ(lines_of(none.err), 0) << none.err;
  EXPECT_FALSE(fs::exists(dir_ / "o" / "loss.png"));
}

TEST_F(Cli, ARunThatCannotFitInMemoryIsRefusedBeforeAnyParticle) {
  // 100,000 networks of a million parameters: terabytes. Refused with the estimate.
  EXPECT_REFUSED("--particles 100000 --model mlp:1024,1024", "--particles 100000 of 1053698 parameters need about");
  EXPECT_REFUSED("--particles 100000 --model mlp:1024,1024", "GiB available");
  // Estimated before any network is built: one network of 10^12 parameters is refused
  // by the estimate, not by the allocator.
  EXPECT_REFUSED("--particles 1 --model mlp:1048576,1048576", "--particles 1 of 1099516870658 parameters need about");
  // The last-layer Laplace's covariances count: 1,000 of 8,192 x 8,192 float64 are 537 GB,
  // where the networks alone (274,495 parameters each, with Adam) need 4.4 GB.
  EXPECT_REFUSED("--algo laplace --particles 1000 --model mlp:64,4095",
                 "--particles 1000 of 274495 parameters need about 50");
  EXPECT_REFUSED("--algo laplace --particles 1000 --model mlp:64,4095", "(or --laplace-structure diagonal)");
  // The advice names what takes most of the memory: SG-MCMC's kept samples (a copy of every
  // particle's parameters each), or the ranks themselves (about 160 MiB each).
  EXPECT_REFUSED("--algo sgld --particles 64 --samples 100000", "use fewer --samples");
  EXPECT_REFUSED("--nproc 1024 --particles 1024", "1024 ranks with --particles 1024");
  EXPECT_REFUSED("--nproc 1024 --particles 1024", "start fewer ranks on this host (--nproc 1024");
}

TEST_F(Cli, AnOmpNumThreadsThatIsNotACountIsOneLineBeforeAnyLibraryReadsIt) {
  // libgomp and LibTorch read OMP_NUM_THREADS before main: "abc" gave three lines of their
  // warnings and a run, 100000 a hang while they started threads.
  for (const std::string value : {"abc", "", "100000", "0", "2,x", "-1"}) {
    auto r = run("--epochs 1 --particles 2 --quiet --out none", -1, "", {"OMP_NUM_THREADS=" + value});
    EXPECT_EQ(r.code, 2) << "'" << value << "': " << r.err;
    EXPECT_EQ(lines_of(r.err), 1) << "'" << value << "': " << r.err;
    EXPECT_NE(r.err.find("push: OMP_NUM_THREADS='" + value + "' must be a whole number of threads from 1 to"),
              std::string::npos)
        << r.err;
  }
  for (const std::string value : {"1", "2,1"}) {
    auto r = run("--epochs 1 --particles 2 --quiet --out none", -1, "", {"OMP_NUM_THREADS=" + value});
    EXPECT_EQ(r.code, 0) << "'" << value << "': " << r.err;
    // Neither push nor the libraries say a word about it.
    EXPECT_EQ(r.err.find("OMP_NUM_THREADS"), std::string::npos) << "'" << value << "': " << r.err;
  }
}

TEST_F(Cli, AStackLimitTooSmallIsOneLineNotASegfault) {
  // Under ulimit -s 64 (and up to 128) a thread of training overflowed its stack: exit 139,
  // no word. 256 KiB is refused too: it is near that edge (and starts under a sanitizer).
  stack_ = rlim_t{256} << 10;
  EXPECT_REFUSED("--epochs 1 --particles 2",
                 "push train: the stack size limit (ulimit -s 256) is below the 512 KiB training's threads need");
  stack_ = rlim_t{8} << 20;
  auto usual = run("--epochs 1 --particles 2 --quiet --out none");
  EXPECT_EQ(usual.code, 0) << usual.err;
}

TEST_F(Cli, AnAddressSpaceLimitTooSmallIsOneLineNotAHang) {
  // Under ulimit -v 1000000 OpenBLAS retried its buffer's allocation forever: the run hung
  // without a word. Now it is refused at once; a limit that leaves room trains.
  // What the binary needs to load at all depends on the build (LibTorch 1.13: 0.7 GB;
  // the CUDA wheel's libraries: 2.6 GB): found first, as the least limit under which
  // --help runs (below it the loader or LibTorch's static initialisers fail, before push).
  if (push::testing::sanitized()) GTEST_SKIP() << "a sanitizer's shadow memory needs terabytes of address space";
  rlim_t lo = rlim_t{64} << 20, hi = rlim_t{32} << 30;
  while (hi - lo > (rlim_t{16} << 20)) {
    address_space_ = lo + (hi - lo) / 2;
    (run("--help").code == 0 ? hi : lo) = address_space_;
  }
  // Below it, what fails is the loader (its own one line) or LibTorch's static initialisers
  // (std::bad_alloc before main, which aborted with a backtrace): one line either way.
  for (rlim_t below = lo > (rlim_t{256} << 20) ? lo - (rlim_t{256} << 20) : lo; below <= lo;
       below += rlim_t{64} << 20) {
    address_space_ = below;
    const auto r = run("--epochs 1 --quiet --out below");
    EXPECT_TRUE(r.code == 1 || r.code == 127) << below / 1024 << " KiB -> " << r.code << ": " << r.err;
    EXPECT_EQ(lines_of(r.err), 1) << below / 1024 << " KiB -> " << r.err;
    if (r.code == 1)
      EXPECT_NE(r.err.find("(ulimit -v " + std::to_string(below / 1024) + ")"), std::string::npos) << r.err;
  }
  // 96 MiB above it the binary starts, but training (BLAS buffers, particles) cannot fit.
  address_space_ = hi + (rlim_t{96} << 20);
  EXPECT_REFUSED("--epochs 2 --particles 2", "push train: the address-space limit (ulimit -v " +
                                                 std::to_string(address_space_ / 1024) + ") is below the about");
  address_space_ = hi + (rlim_t{3} << 30);
  auto roomy = run("--epochs 2 --particles 2 --quiet --out roomy");
  EXPECT_EQ(roomy.code, 0) << roomy.err;
}

TEST_F(Cli, TooFewOpenFilesForTheRanksIsOneLine) {
  // Under ulimit -n 20 a rank failed inside Gloo and the store, with their internal logging
  // and a line from each rank; one process alone needs far fewer and trains.
  open_files_ = 20;
  EXPECT_REFUSED("--nproc 2 --particles 2",
                 "the open-files limit (ulimit -n 20) is below the about 56 a job of 2 ranks needs in each");
  auto one = run("--epochs 1 --particles 2 --quiet --out one");
  EXPECT_EQ(one.code, 0) << one.err;
}

TEST_F(Cli, AnEmptyTargetOrOneThatNeverChangesIsRefused) {
  std::string rows = "a,y\n";
  for (int i = 0; i < 30; ++i) rows += std::to_string(i) + ",3\n";
  write("flat.csv", rows);
  EXPECT_REFUSED("--data flat.csv",
                 "the target column 'y' of flat.csv has the same value (3) in every training row: there is nothing "
                 "to learn");
  write("two.csv", "a,b,y\n1,2,3\n2,1,4\n3,3,5\n4,0,6\n");
  EXPECT_REFUSED("--data two.csv --target ''", "--target is empty: name the target column");
}

TEST_F(Cli, AMalformedJobSecretIsRefusedBeforeAnyRankStarts) {
  // Found in the parent, in one line, not inside each rank; a run of one process, which
  // needs no secret, is not refused for it.
  ::setenv("PUSH_JOB_SECRET", "0123", 1);
  EXPECT_REFUSED("--nproc 2 --particles 2",
                 "PUSH_JOB_SECRET must be 64 hexadecimal digits (32 random bytes), got 4 characters");
  auto one = run("--epochs 1 --particles 2 --quiet --out one");
  ::unsetenv("PUSH_JOB_SECRET");
  EXPECT_EQ(one.code, 0) << one.err;
}

TEST_F(Cli, ThreadsBeyondTheCoresAreWarnedAbout) {
  const int cores = push::usable_cores();
  // No epoch: the warning is the point, and intra-op threads are OpenMP's, which
  // ThreadSanitizer cannot see synchronise (tools/sanitizers/tsan.supp).
  auto r = run("--devices cpu:1 --threads " + std::to_string(cores + 1) + " --epochs 0 --particles 2 --quiet --out o");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.err.find("push train: warning: --threads " + std::to_string(cores + 1)), std::string::npos) << r.err;
  EXPECT_EQ(lines_of(r.err), 1) << r.err;
}

TEST_F(Cli, AJobOverSeveralHostsNamesWhatItLacks) {
  EXPECT_REFUSED("--nnodes 2", "--nnodes 2 needs --master-addr: the address of node 0");
  // 192.0.2.1: a documentation address, never dialed (each is refused before).
  EXPECT_REFUSED("--nnodes 2 --master-addr 192.0.2.1", "--nnodes 2 needs a --master-port");
  EXPECT_REFUSED("--nnodes 2 --master-addr 192.0.2.1 --master-port 29999",
                 "--nnodes 2 needs PUSH_JOB_SECRET in the environment, the same on every host");
  EXPECT_REFUSED("--nnodes 2 --node-rank 2 --master-addr 192.0.2.1 --master-port 29999",
                 "--node-rank 2 is not in 0..1 (--nnodes 2)");
  EXPECT_REFUSED("--nnodes 2 --master-addr 127.0.0.1 --master-port 29999",
                 "--nnodes 2 needs a --master-addr the other hosts reach, not the loopback 127.0.0.1");
  EXPECT_REFUSED("--master-port 29999", "--master-port is for --nnodes M > 1");
  // A name that does not resolve is said once, here (a rank retried it, a line each time).
  // Run in a network namespace of its own (only a loopback that is down), so that no
  // query leaves the machine; .invalid never resolves anyway (RFC 6761).
  if (std::system("unshare -n true 2>/dev/null") == 0) {
    launcher_ = "unshare -n";
    EXPECT_REFUSED("--nnodes 2 --master-addr no-such-host.invalid --master-port 29999",
                   "--master-addr 'no-such-host.invalid' does not resolve (");
    launcher_.clear();
  }
  // Under a launcher its variables say where the ranks are.
  // A launcher's variables that cannot be (found by this stop's campaign: a bad_alloc, and
  // an open-files estimate of -28).
  for (const auto& [env, needle] : {std::pair<std::string, std::string>{"RANK=-1", "RANK -1 is set without WORLD_SIZE"},
                                    {"WORLD_SIZE=-5", "WORLD_SIZE -5 is not a number of ranks"}}) {
    auto bad = run("--epochs 1 --quiet --out o", -1, "", {env, "RANK=-1"});
    EXPECT_NE(bad.code, 0) << env;
    EXPECT_EQ(lines_of(bad.err), 1) << env << ": " << bad.err;
    EXPECT_NE(bad.err.find(env == "RANK=-1" ? needle : "WORLD_SIZE -5 is not a number of ranks"), std::string::npos)
        << bad.err;
  }
  auto launched = run("--nnodes 2 --quiet --out o", -1, "", {"WORLD_SIZE=1", "RANK=0"});
  EXPECT_NE(launched.code, 0);
  EXPECT_NE(launched.err.find("--nnodes is for a job push train starts itself"), std::string::npos) << launched.err;
}

TEST_F(Cli, WithSeveralRanksABadRunIsStillOneLine) {
  write("hex.csv", "a,b\n0x10,1\n2,3\n");
  EXPECT_REFUSED("--nproc 2 --data hex.csv", "'0x10' is not a number");
  EXPECT_REFUSED("--nproc 2 --data-parallel daso", "--data-parallel daso needs at least 2 nodes");
  EXPECT_REFUSED("--nproc 2 --algo svgd --data-parallel blocking", "--data-parallel does not train svgd");
  write("mine/notes.txt", "mine");
  EXPECT_REFUSED("--nproc 2 --save mine", "--save 'mine' is not a push train checkpoint");
}

}  // namespace
