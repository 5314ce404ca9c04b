// `push train` on data that used to slip through: values beyond float32, features with an
// offset or a tiny scale, truncated IDX
// files, class labels that are not 0..K-1; and the MultiSWAG save-then-resume flow.
#include "cli_test_util.h"

namespace {
using namespace push::testing;

std::string be32(uint32_t v) {
  return {static_cast<char>(v >> 24), static_cast<char>(v >> 16), static_cast<char>(v >> 8), static_cast<char>(v)};
}

TEST_F(Cli, ValuesBeyondFloat32StopTheRun) {
  std::string csv = "a,b,y\n";
  for (int i = 0; i < 40; ++i) csv += std::to_string(i) + "," + (i == 17 ? "1e39" : std::to_string(i % 7)) + ",1\n";
  write("big.csv", csv);
  auto r = run("--data big.csv --epochs 2 --particles 2 --quiet --out o");
  EXPECT_NE(r.code, 0);
  EXPECT_EQ(lines_of(r.err), 1) << r.err;
  EXPECT_NE(r.err.find("big.csv line 19, column 'b'"), std::string::npos) << r.err;
  EXPECT_FALSE(fs::exists(dir_ / "o"));
}

TEST_F(Cli, FeaturesWithAnOffsetOrATinyScaleAreLearned) {
  // y = k from a feature 1.7e9 + k (float32 steps by 128 there), or from k·1e-13 (an sd
  // below 1e-12 was taken for a constant): standardised in double, both are learned, and
  // the rmse is a small part of y's sd (about 17.3), not about all of it.
  for (const std::string& form : {std::string("170000%04d"), std::string("%de-13")}) {
    std::string csv = "x,y\n";
    char cell[32];
    for (int k = 0; k < 60; ++k) {
      std::snprintf(cell, sizeof(cell), form.c_str(), form[0] == '1' ? 1000 + k : k);
      csv += std::string(cell) + "," + std::to_string(k) + "\n";
    }
    write("scaled.csv", csv);
    auto r = run("--data scaled.csv --epochs 60 --particles 2 --quiet --out o");
    ASSERT_EQ(r.code, 0) << form << ": " << r.err;
    EXPECT_LT(metrics("o")["metrics"]["rmse"].get<double>(), 3.0) << form << ": " << slurp(dir_ / "o/metrics.json");
    fs::remove_all(dir_ / "o");
  }
}

TEST_F(Cli, TruncatedIdxFilesStopTheRun) {
  // Headers announce 100 images of 28x28; the files hold one, or a 10-byte header.
  const std::string one_image = be32(0x803) + be32(100) + be32(28) + be32(28) + std::string(28 * 28, '\x40');
  const std::string labels = be32(0x801) + be32(100) + std::string(100, '\x01');
  for (const auto& [images, needle] :
       {std::pair<std::string, std::string>{one_image, "truncated"}, {one_image.substr(0, 10), "header"}}) {
    write("idx/train-images-idx3-ubyte", images);
    write("idx/t10k-images-idx3-ubyte", images);
    write("idx/train-labels-idx1-ubyte", labels);
    write("idx/t10k-labels-idx1-ubyte", labels);
    auto r = run("--data idx --model cnn:2,2 --epochs 1 --particles 2 --quiet --out o");
    EXPECT_NE(r.code, 0);
    EXPECT_EQ(lines_of(r.err), 1) << r.err;
    EXPECT_NE(r.err.find(needle), std::string::npos) << r.err;
    EXPECT_NE(r.err.find("train-images-idx3-ubyte"), std::string::npos) << r.err;
    EXPECT_EQ(r.err.find("INTERNAL ASSERT"), std::string::npos) << r.err;
    EXPECT_FALSE(fs::exists(dir_ / "o"));
  }
}

TEST_F(Cli, PredictionsReportTheOriginalLabels) {
  write_classes("c.csv", 0, 7);
  auto r = run("--data c.csv --task classification --particles 2 --epochs 10 --quiet --out o");
  ASSERT_EQ(r.code, 0) << r.err;
  std::istringstream csv(slurp(dir_ / "o" / "predictions.csv"));
  std::string line;
  std::getline(csv, line);
  EXPECT_EQ(line, "index,label,predicted,confidence,p0,p7");
  int rows = 0, sevens = 0;
  while (std::getline(csv, line)) {
    std::istringstream cells(line);
    std::string index, label, predicted;
    std::getline(cells, index, ',');
    std::getline(cells, label, ',');
    std::getline(cells, predicted, ',');
    EXPECT_TRUE(label == "0" || label == "7") << line;
    EXPECT_TRUE(predicted == "0" || predicted == "7") << line;
    sevens += label == "7";
    ++rows;
  }
  EXPECT_EQ(rows, metrics("o")["data"]["test_size"].get<int>());
  EXPECT_GT(sevens, 0);
  EXPECT_EQ(metrics("o")["data"]["class_labels"], json({0, 7}));
}

TEST_F(Cli, MultiSwagWithDefaultPretrainingResumes) {
  // The documented flow: save after some epochs, resume to more, with the defaults.
  ASSERT_NO_FATAL_FAILURE(save_then_resume("--algo mswag --particles 2 --samples 2 --quiet", 4, 6));
  // Pre-training stays what the checkpoint's run chose (half of its 4 epochs).
  EXPECT_EQ(metrics("b")["config"]["pretrain_epochs"], 2);
  // An explicit value that disagrees with the checkpoint is still refused.
  auto c = run("--algo mswag --epochs 6 --pretrain-epochs 3 --particles 2 --samples 2 --quiet --resume ck --out c");
  EXPECT_NE(c.code, 0);
  EXPECT_NE(c.err.find("pretrain_epochs=2"), std::string::npos) << c.err;
}

}  // namespace
