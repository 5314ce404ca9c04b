// `push train` end to end: the default run, every algorithm on a tiny configuration,
// save/resume, and bad input (one-line error, non-zero exit, nothing in --out).
#include "cli_test_util.h"

#include "test_util.h"

namespace {
using namespace push::testing;

TEST_F(Cli, DefaultRunFitsTheBuiltinData) {
  auto r = run("");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("rmse"), std::string::npos) << r.out;
  EXPECT_NE(r.err.find("ETA"), std::string::npos) << "no progress bar: " << r.err;
  auto m = metrics("push-out");
  EXPECT_EQ(m["algorithm"], "ensemble");
  EXPECT_EQ(m["data"]["name"], "sine-gap");
  // y = sin x + 0.1 ε: a trained ensemble gets close to the noise level.
  EXPECT_LT(m["metrics"]["rmse"].get<double>(), 0.25);
  EXPECT_LT(m["metrics"]["nll"].get<double>(), 0.5);
  const int64_t test_size = m["data"]["test_size"];
  auto csv = slurp(dir_ / "push-out" / "predictions.csv");
  EXPECT_EQ(std::count(csv.begin(), csv.end(), '\n'), test_size + 1);
  EXPECT_EQ(m["loss_curve"].size(), m["run"]["epochs"].get<size_t>());
  // What README says the picture shows: the members disagree in the gap (no data in
  // -1.5 < x < 1.5) far more than on the data (docs/bayes.md, "Where the members disagree";
  // five seeds in Cli.TheMembersDisagreeInTheGapOverFiveSeeds, a long test).
  EXPECT_GE(gap_ratio(dir_ / "push-out" / "band.csv"), 3.0);
  const auto band = slurp(dir_ / "push-out" / "band.csv");
  EXPECT_EQ(std::count(band.begin(), band.end(), '\n'), 301);  // a header and the picture's 300 grid points
  // The main job's budget; a sanitizer build runs it several times slower.
  EXPECT_LT(m["timings"]["total_s"].get<double>(), push::testing::sanitized() ? 600.0 : 60.0);
  if (has_gnuplot()) {
    EXPECT_TRUE(fs::exists(dir_ / "push-out" / "predictive.png"));
    EXPECT_TRUE(fs::exists(dir_ / "push-out" / "loss.png"));
  }
  // Only the outputs are left behind, no staging folders or gnuplot scratch files.
  EXPECT_EQ(entries(), std::vector<std::string>{"push-out"});
  EXPECT_FALSE(fs::exists(dir_ / "push-out" / "band.dat"));
}

TEST_F(Cli, EveryAlgorithmOnATinyConfig) {
  for (std::string algo : {"ensemble", "mswag", "svgd", "mcdropout", "sgld", "sghmc", "laplace"}) {
    auto r =
        run("--algo " + algo + " --particles 3 --devices 2 --epochs 4" + samples(algo, 3) + " --quiet --out " + algo);
    ASSERT_EQ(r.code, 0) << algo << ": " << r.err;
    auto m = metrics(algo);
    EXPECT_EQ(m["algorithm"], algo);
    EXPECT_EQ(m["run"]["epochs"], 4);
    EXPECT_GT(m["metrics"]["mean_predictive_sd"].get<double>(), 0.0);
    EXPECT_TRUE(std::isfinite(m["metrics"]["nll"].get<double>()));
  }
}

TEST_F(Cli, FusesMlpsByDefaultWithTheUnfusedNumbers) {
  for (std::string algo : {"ensemble", "mswag", "svgd", "mcdropout", "sgld", "sghmc"}) {
    const std::string common = "--algo " + algo + " --particles 3 --epochs 3" + samples(algo, 3) + " --quiet ";
    auto fused = run(common + "--out f"), plain = run(common + "--no-fuse --out u");
    ASSERT_EQ(fused.code, 0) << algo << ": " << fused.err;
    ASSERT_EQ(plain.code, 0) << algo << ": " << plain.err;
    auto f = metrics("f"), u = metrics("u");
    EXPECT_EQ(f["run"]["fused"], true) << algo;
    EXPECT_EQ(u["run"]["fused"], false) << algo;
    for (const auto& [key, value] : u["metrics"].items()) {
      const double a = f["metrics"][key].get<double>(), b = value.get<double>();
      EXPECT_NEAR(a, b, 1e-5 * std::abs(b)) << algo << " " << key;
    }
    fs::remove_all(dir_ / "f");
    fs::remove_all(dir_ / "u");
  }
}

TEST_F(Cli, AlgorithmOptionsReachTheRun) {
  const std::pair<std::string, json> cases[] = {
      {"--algo ensemble --bootstrap", json{{"bootstrap", true}}},
      {"--algo svgd --bandwidth 0.5", json{{"bandwidth", 0.5}}},
      {"--algo mswag --pretrain-epochs 2 --rank 3 --collect-every 2 --swag-lr 0.005 --samples 2",
       json{{"pretrain_epochs", 2}, {"rank", 3}, {"collect_every", 2}, {"swag_lr", 0.005}}},
      {"--algo mcdropout --dropout 0.3 --samples 2", json{{"dropout", 0.3}}},
      {"--algo sghmc --friction 0.2 --cycles 2 --burn-in 1 --thin 3 --samples 2",
       json{{"friction", 0.2}, {"cycles", 2}, {"burn_in", 1}, {"lr", 0.001}}},
      {"--algo sgld --preconditioned --lr 0.002", json{{"preconditioned", true}, {"lr", 0.002}, {"burn_in", 2}}},
      // pSGLD by default, at its own step size; plain SGLD at Adam's.
      {"--algo sgld", json{{"preconditioned", true}, {"lr", 0.001}}},
      {"--algo sgld --no-preconditioned", json{{"preconditioned", false}, {"lr", 0.01}}},
      {"--algo mcdropout --prior-scale 2 --samples 2", json{{"prior_scale", 2.0}}},
  };
  for (const auto& [args, expected] : cases) {
    auto r = run(args + " --particles 2 --epochs 4 --quiet --out o");
    ASSERT_EQ(r.code, 0) << args << ": " << r.err;
    auto config = metrics("o")["config"];
    for (const auto& [key, value] : expected.items()) EXPECT_EQ(config[key], value) << args << " " << key;
  }
}

TEST_F(Cli, ClassificationCsvWritesCalibration) {
  write_classes("two.csv");
  auto r = run("--data two.csv --task classification --particles 2 --epochs 20 --quiet --out cls");
  ASSERT_EQ(r.code, 0) << r.err;
  auto m = metrics("cls");
  EXPECT_GT(m["metrics"]["accuracy"].get<double>(), 0.7);
  EXPECT_EQ(m["metrics"]["reliability_bins"].size(), 15u);
  int64_t count = 0;
  for (const auto& b : m["metrics"]["reliability_bins"]) count += b["count"].get<int64_t>();
  EXPECT_EQ(count, m["data"]["test_size"].get<int64_t>());
  if (has_gnuplot()) EXPECT_TRUE(fs::exists(dir_ / "cls" / "reliability.png"));
  EXPECT_FALSE(fs::exists(dir_ / "cls" / "band.csv"));  // 1-D regression only
}

TEST_F(Cli, SaveThenResumeContinuesTheSameRun) {
  // At a constant rate, the same as five epochs in one go.
  const std::string constant = "--particles 2 --quiet --lr-schedule constant";
  ASSERT_NO_FATAL_FAILURE(save_then_resume(constant, 3, 5));
  EXPECT_EQ(metrics("b")["loss_curve"].size(), 5u);
  auto c = run(constant + " --epochs 5 --out c");
  ASSERT_EQ(c.code, 0) << c.err;
  EXPECT_EQ(metrics("b")["metrics"]["rmse"], metrics("c")["metrics"]["rmse"]);

  auto bad = run("--particles 2 --epochs 5 --algo svgd --quiet --resume ck --out d");
  EXPECT_NE(bad.code, 0);
  EXPECT_NE(bad.err.find("algo=\"ensemble\""), std::string::npos) << bad.err;
  auto other = run("--particles 2 --epochs 5 --lr-schedule cosine --quiet --resume ck --out d");
  EXPECT_NE(other.code, 0);
  EXPECT_NE(other.err.find("lr_schedule=\"constant\", this run has lr_schedule=\"cosine\""), std::string::npos)
      << other.err;
  EXPECT_FALSE(fs::exists(dir_ / "d"));
  // The default cosine resumes too: its last epochs follow the cosine of the new --epochs
  // (not the numbers of one run of 5, whose first 3 epochs ran on another cosine).
  ASSERT_NO_FATAL_FAILURE(save_then_resume("--particles 2 --quiet", 3, 5));
  EXPECT_EQ(metrics("b")["config"]["lr_schedule"], "cosine");
  EXPECT_LT(metrics("b")["metrics"]["rmse"].get<double>(), 1.0);
  // An edited config.json (here: its schedule) fails its checksum: it is named, not
  // taken for another run's settings.
  auto config = json::parse(slurp(dir_ / "ck" / "config.json"));
  config["lr_schedule"] = "sometimes";
  write("ck/config.json", config.dump(2) + "\n");
  auto edited = run("--particles 2 --epochs 6 --quiet --resume ck --out h");
  EXPECT_NE(edited.code, 0);
  EXPECT_NE(edited.err.find("its config.json fails its checksum"), std::string::npos) << edited.err;
  EXPECT_FALSE(fs::exists(dir_ / "h"));
}

// --algo sgld is pSGLD unless --no-preconditioned; a resumed run without either takes the
// checkpoint's, with its step size.
TEST_F(Cli, ResumedChainsKeepTheCheckpointsPreconditioning) {
  ASSERT_NO_FATAL_FAILURE(save_then_resume("--algo sgld --no-preconditioned --particles 2 --quiet", 2, 4));
  EXPECT_EQ(metrics("b")["config"]["preconditioned"], false);
  EXPECT_EQ(metrics("b")["config"]["lr"], 0.01);
  auto flipped = run("--algo sgld --preconditioned --lr 0.01 --particles 2 --epochs 5 --quiet --resume ck --out c");
  EXPECT_NE(flipped.code, 0);
  EXPECT_NE(flipped.err.find("it was trained with preconditioned=false, this run has preconditioned=true"),
            std::string::npos)
      << flipped.err;
  fs::remove_all(dir_ / "ck");
  ASSERT_NO_FATAL_FAILURE(save_then_resume("--algo sgld --particles 2 --quiet", 2, 4));
  EXPECT_EQ(metrics("b")["config"]["preconditioned"], true);
  EXPECT_EQ(metrics("b")["config"]["lr"], 0.001);
}

TEST_F(Cli, BadInputFailsWithOneLineAndWritesNothing) {
  write("letters.csv", "a,b\n1,2\n3,oops\n");
  write("nan.csv", "a,b\n1,2\nnan,3\n");
  write("ok.csv", "a,b\n1,2\n3,4\n5,6\n7,8\n9,10\n");
  const std::pair<std::string, std::string> cases[] = {
      {"--data missing.csv", "no data set or file named 'missing.csv'"},
      {"--data letters.csv", "'oops' is not a number"},
      {"--data nan.csv", "NaN or Inf"},
      {"--data ok.csv --target nope", "unknown target column 'nope'"},
      {"--algo bogus", "--algo"},
      {"--model transformer", "unknown model 'transformer'"},
      {"--model mlp:64,abc", "bad width 'abc'"},
      {"--epochs -3", "--epochs"},
      {"--lr-schedule linear", "--lr-schedule"},
      {"--resume no-such-dir", "no checkpoint to resume"},
      {"--data sine-gap --task classification", "not classification"},
      {"--devices gpu", "'gpu' is not N, cpu, cpu:N, cuda or cuda:N"},
      {"--devices cpu:0", "the lane count must be a whole number from 1 to 256"},
      // Values are quoted with their control bytes escaped: one line, no escape sequence.
      {"--algo 'x\ny'", "--algo: 'x\\x0ay' is not ensemble"},
      {"--data 'no\x1b[31mfile'", "no data set or file named 'no\\x1b[31mfile'"},
      {"--devices cuda:9", "--devices cuda"},
  };
  for (const auto& [args, needle] : cases) {
    auto r = run(args + " --quiet --out should-not-exist");
    EXPECT_NE(r.code, 0) << args;
    EXPECT_EQ(r.err.find('\x1b'), std::string::npos) << args << ": a raw escape byte";
    EXPECT_NE(r.err.find(needle), std::string::npos) << args << " -> " << r.err;
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << args << " -> " << r.err;
    EXPECT_FALSE(fs::exists(dir_ / "should-not-exist")) << args;
  }
}

TEST_F(Cli, LeadingZerosAndControlBytesInValuesAreReadAsEverywhere) {
  // --devices cpu:0001 is one lane, as --epochs 0001 is one epoch.
  auto zeros = run("--devices cpu:0001 --epochs 1 --particles 2 --quiet --out o");
  ASSERT_EQ(zeros.code, 0) << zeros.err;
  EXPECT_EQ(metrics("o")["run"]["devices"], 1) << metrics("o")["run"].dump();
  // A folder name with an escape sequence: the report quotes it escaped.
  auto odd = run("--epochs 1 --particles 2 --quiet --out 'odd\x1b[31m'");
  ASSERT_EQ(odd.code, 0) << odd.err;
  EXPECT_EQ(odd.out.find('\x1b'), std::string::npos) << odd.out;
  EXPECT_NE(odd.out.find("odd\\x1b[31m"), std::string::npos) << odd.out;
}

TEST_F(Cli, BuiltinIrisWhenInstalled) {
  auto r = run("--data iris --particles 2 --epochs 30 --quiet --out iris");
  if (r.code != 0 && r.err.find("fetch-data") != std::string::npos) GTEST_SKIP() << "run scripts/fetch-data";
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_GT(metrics("iris")["metrics"]["accuracy"].get<double>(), 0.8);
  auto d = run("--data diabetes --particles 2 --epochs 20 --quiet --out diabetes");
  ASSERT_EQ(d.code, 0) << d.err;
  auto m = metrics("diabetes");
  EXPECT_EQ(m["data"]["train_size"].get<int64_t>() + m["data"]["test_size"].get<int64_t>(), 442);
  // In the target's units (disease progression, sd ≈ 77): far better than predicting the mean.
  EXPECT_LT(m["metrics"]["rmse"].get<double>(), 70.0);
  EXPECT_GT(m["metrics"]["rmse"].get<double>(), 30.0);
}

TEST_F(Cli, FashionMnistCnnWhenInstalled) {
  auto r =
      run("--data fashion-mnist --model cnn:4,8 --limit 300 --epochs 1 --particles 2 --batch-size 50 --quiet "
          "--out fm");
  if (r.code != 0 && r.err.find("fetch-data") != std::string::npos) GTEST_SKIP() << "run scripts/fetch-data";
  ASSERT_EQ(r.code, 0) << r.err;
  auto m = metrics("fm");
  EXPECT_EQ(m["data"]["input_shape"], json({1, 28, 28}));
  EXPECT_EQ(m["data"]["classes"], 10);
  EXPECT_EQ(m["data"]["test_size"], 300);
  EXPECT_GT(m["metrics"]["accuracy"].get<double>(), 0.2);  // one short epoch, ten classes
}

TEST_F(Cli, CnnOnTabularDataIsABadModelSpec) {
  auto r = run("--model cnn --quiet --out nope");
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.err.find("cnn needs image inputs"), std::string::npos) << r.err;
  EXPECT_FALSE(fs::exists(dir_ / "nope"));
}

// --devices names what the lanes run on. cuda without a usable GPU (here, a CPU machine, or
// push built against a LibTorch without CUDA) is one line before anything is written; cpu:N
// is N CPU lanes even where there are GPUs.
TEST_F(Cli, DevicesNamesTheDeviceTypeAndCudaWithoutAGpuIsOneLine) {
  if (!torch::cuda::is_available()) {
    auto r = run("--devices cuda --epochs 1 --quiet --out should-not-exist");
    EXPECT_EQ(r.code, 1);
    EXPECT_NE(r.err.find("--devices cuda: "), std::string::npos) << r.err;
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
    EXPECT_FALSE(fs::exists(dir_ / "should-not-exist"));
  }
  auto r = run("--devices cpu:2 --particles 2 --epochs 2 --quiet --out cpu");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(metrics("cpu")["run"]["devices"], 2);
  EXPECT_EQ(metrics("cpu")["run"]["device_type"], "cpu");
}

}  // namespace
