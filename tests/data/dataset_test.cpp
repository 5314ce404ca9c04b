// CSV loading, bad input, splits and standardisation.
#include <push/data/dataset.h>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <unistd.h>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <optional>

#include <sys/stat.h>

#include "test_util.h"

namespace push::data {
namespace {
namespace fs = std::filesystem;

class Csv : public ::testing::Test {
 protected:
  fs::path dir_ = fs::temp_directory_path() / ("push_data_test_" + std::to_string(::getpid()));
  void SetUp() override { fs::create_directories(dir_); }
  void TearDown() override { fs::remove_all(dir_); }
  fs::path write(const std::string& name, const std::string& text) {
    auto p = dir_ / name;
    std::ofstream(p) << text;
    return p;
  }
};

TEST_F(Csv, ReadsHeaderAndNumbers) {
  auto p = write("a.csv", "a,b,\"target\"\n1,2,3\n4,5.5,-6e-1\n\n");
  auto d = load_csv(p);
  EXPECT_EQ(d.feature_names, (std::vector<std::string>{"a", "b"}));
  EXPECT_EQ(d.target_name, "target");
  // The cells as parsed, in double (the Standardizer gives the networks float32).
  EXPECT_TRUE(torch::equal(d.x, torch::tensor({1., 2., 4., 5.5}, torch::kFloat64).view({2, 2})));
  EXPECT_TRUE(torch::allclose(d.y, torch::tensor({3., -0.6}, torch::kFloat64).view({2, 1}), 1e-15, 1e-15));
  auto by_name = load_csv(p, CsvOptions{"a", Task::regression});
  EXPECT_EQ(by_name.feature_names, (std::vector<std::string>{"b", "target"}));
  EXPECT_TRUE(torch::equal(by_name.y, torch::tensor({1., 4.}, torch::kFloat64).view({2, 1})));
}

TEST_F(Csv, AByteOrderMarkAndCarriageReturnsAreNotPartOfTheCells) {
  // Spreadsheets write a UTF-8 BOM before the header; old Mac files end lines with CR alone.
  const std::string texts[] = {"\xEF\xBB\xBFx,y\n1,2\n3,4\n", "x,y\r1,2\r3,4\r", "x,y\r\n1,2\r\n3,4"};
  for (size_t i = 0; i < std::size(texts); ++i) {
    const auto d = load_csv(write("bom.csv", texts[i]), CsvOptions{"y", std::nullopt});
    EXPECT_EQ(d.feature_names, std::vector<std::string>{"x"}) << "case " << i;
    EXPECT_TRUE(torch::equal(d.x, torch::tensor({1., 3.}, torch::kFloat64).view({2, 1}))) << "case " << i;
  }
}

TEST_F(Csv, AFifoOrADeviceIsRefusedWithoutReadingIt) {
  // A FIFO would be read once by the checks and then hang the run that reads it again.
  ASSERT_EQ(::mkfifo((dir_ / "pipe.csv").c_str(), 0600), 0);
  EXPECT_PUSH_ERROR(load_csv(dir_ / "pipe.csv"), "is not a regular file (a FIFO");
  EXPECT_PUSH_ERROR(load_csv("/dev/null"), "is not a regular file");
}

TEST_F(Csv, ClassificationLabelsAreCodedInOrder) {
  auto d = load_csv(write("c.csv", "x,k\n0.5,7\n1.5,3\n2.5,7\n"), CsvOptions{"", Task::classification});
  EXPECT_EQ(d.num_classes, 2);
  EXPECT_TRUE(torch::equal(d.y, torch::tensor({1, 0, 1}, torch::kLong)));
  EXPECT_PUSH_ERROR(load_csv(write("d.csv", "x,k\n0.5,1.5\n1,2\n"), CsvOptions{"", Task::classification}),
                    "non-integer value 1.5");
}

TEST_F(Csv, BadInputNamesTheProblem) {
  EXPECT_PUSH_ERROR(load_csv(dir_ / "missing.csv"), "no such file");
  EXPECT_PUSH_ERROR(load_csv(write("n.csv", "a,b\n1,2\n3,x\n")), "line 3, column 'b': 'x' is not a number");
  EXPECT_PUSH_ERROR(load_csv(write("nan.csv", "a,b\n1,nan\n")), "(NaN or Inf) is not allowed");
  EXPECT_PUSH_ERROR(load_csv(write("inf.csv", "a,b\n1,2\n-inf,3\n")), "column 'a'");
  EXPECT_PUSH_ERROR(load_csv(write("t.csv", "a,b\n1,2\n"), CsvOptions{"zz", std::nullopt}),
                    "unknown target column 'zz'");
  EXPECT_PUSH_ERROR(load_csv(write("r.csv", "a,b\n1,2\n3\n")), "line 3 has 1 cells, the header has 2");
  EXPECT_PUSH_ERROR(load_csv(write("e.csv", "")), "is empty");
  EXPECT_PUSH_ERROR(load("no-such-set"), "no data set or file named 'no-such-set'");
}

TEST_F(Csv, OnlyPlainDecimalsAndNamedColumns) {
  // strtod would read 0x10 as 16 and 1e5junk partly: only plain decimals are numbers.
  for (const std::string cell : {"0x10", "1e5x", "1.2.3", "e5", "+", "1e", "--1", "0b1", "Infantry", "nano"}) {
    EXPECT_PUSH_ERROR(load_csv(write("h.csv", "a,b\n1," + cell + "\n")), "'" + cell + "' is not a number");
  }
  auto d = load_csv(write("ok.csv", "a,b\n+1.5,-2e-3\n.5,7.\n"));
  EXPECT_TRUE(torch::allclose(d.x, torch::tensor({{1.5}, {0.5}}, torch::kFloat64)));
  EXPECT_TRUE(torch::allclose(d.y, torch::tensor({{-2e-3}, {7.0}}, torch::kFloat64)));
  // Two columns of one name: --target would pick one silently.
  EXPECT_PUSH_ERROR(load_csv(write("dup.csv", "a,a,y\n1,2,3\n"), CsvOptions{"a", std::nullopt}),
                    "two columns named 'a'");
}

TEST_F(Csv, GarbageIsQuotedPrintablyAndLinesAreBounded) {
  // Control bytes from the file never reach the terminal raw.
  try {
    load_csv(write("esc.csv", "a,b\n1,\x1b[31mred\n"));
    ADD_FAILURE() << "loaded";
  } catch (const Error& e) {
    const std::string message = e.what();
    EXPECT_EQ(message.find('\x1b'), std::string::npos) << message;
    EXPECT_NE(message.find("'\\x1b[31mred' is not a number"), std::string::npos) << message;
  }
  // A file without newlines (a binary, /dev/zero) stops at the line bound, not at memory's end.
  EXPECT_PUSH_ERROR(load_csv(write("long.csv", "a,b\n" + std::string((1 << 20) + 10, '1') + "\n")),
                    "long.csv line 2 is longer than 1048576 bytes");
  EXPECT_PUSH_ERROR(load_csv("/dev/zero"), "'/dev/zero' is not a regular file");
  // A program given as data (an ELF header: \x7fELF, then NUL bytes) is named for what it
  // is, not taken for a header with two columns of one name.
  EXPECT_PUSH_ERROR(load_csv(write("prog.csv", std::string("\x7f"
                                                           "ELF\x02\x01\x01\0\0\0,\0\0\n1,2\n",
                                                           18))),
                    "prog.csv line 1 holds a NUL byte: it is a binary file, not a CSV text file");
}

TEST_F(Csv, ValuesBeyondFloat32AreRejectedWithTheirPlace) {
  // 1e39 is a finite double but Inf as the float32 the networks train on.
  EXPECT_PUSH_ERROR(load_csv(write("big.csv", "a,b,y\n1,2,3\n\n4,1e39,6\n")), "big.csv line 4, column 'b': 1e+39");
  EXPECT_PUSH_ERROR(load_csv(write("big.csv", "a,b,y\n1,2,3\n4,5,-1e39\n")), "line 3, column 'y'");
  EXPECT_PUSH_ERROR(load_csv(write("big.csv", "a,b,y\n1,2,3\n4,5,-1e39\n")), "float32");
  // The largest float32 is still fine.
  auto d = load_csv(write("max.csv", "a,y\n3.4e38,1\n1,2\n"));
  EXPECT_TRUE(torch::isfinite(d.x).all().item<bool>());
}

TEST_F(Csv, ClassificationKeepsTheOriginalLabels) {
  auto d = load_csv(write("c.csv", "x,k\n0.5,7\n1.5,0\n2.5,7\n3.5,-2\n"), CsvOptions{"", Task::classification});
  EXPECT_EQ(d.num_classes, 3);
  EXPECT_EQ(d.class_labels, (std::vector<double>{-2, 0, 7}));
  EXPECT_TRUE(torch::equal(d.y, torch::tensor({2, 1, 2, 0}, torch::kLong)));
  // Subsets and splits keep them.
  EXPECT_EQ(d.subset(torch::tensor({0}, torch::kLong)).class_labels, d.class_labels);
}

TEST(Data, SplitIsSeededAndDisjoint) {
  auto d = synthetic_gap(100, 1);
  auto [train, test] = split(d, 0.2, 5);
  EXPECT_EQ(train.size(), 80);
  EXPECT_EQ(test.size(), 20);
  auto [train2, test2] = split(d, 0.2, 5);
  EXPECT_TRUE(torch::equal(test.x, test2.x));
  auto [train3, test3] = split(d, 0.2, 6);
  EXPECT_FALSE(torch::equal(test.x, test3.x));
  // Together the two parts are the whole set.
  auto all = std::get<0>(torch::cat({train.x, test.x}).view(-1).sort());
  EXPECT_TRUE(torch::equal(all, std::get<0>(d.x.view(-1).sort())));
  EXPECT_PUSH_ERROR(split(d, 1.0, 0), "test fraction");
}

TEST(Data, SyntheticSetHasAGap) {
  auto d = synthetic_gap(200, 3);
  EXPECT_EQ(d.size(), 200);
  EXPECT_EQ((d.x.abs() < 1.5).sum().item<int64_t>(), 0);
  EXPECT_TRUE(torch::equal(d.x, synthetic_gap(200, 3).x));
  // The formula in dataset.h: the first half in [-4, -1.5), the second in [1.5, 4),
  // y = sin(x) + noise · ε.
  auto first = d.x.narrow(0, 0, 100), second = d.x.narrow(0, 100, 100);
  EXPECT_TRUE(((first >= -4) & (first < -1.5)).all().item<bool>());
  EXPECT_TRUE(((second >= 1.5) & (second < 4)).all().item<bool>());
  auto exact = synthetic_gap(200, 3, 0.0);
  EXPECT_TRUE(torch::allclose(exact.y, torch::sin(exact.x)));
  EXPECT_NEAR((d.y - torch::sin(d.x)).std().item<double>(), 0.1, 0.02);
}

TEST(Data, StandardizerUsesTrainingStatistics) {
  auto d = synthetic_gap(100, 2);
  auto [train, test] = split(d, 0.3, 0);
  auto s = Standardizer::fit(train);
  auto tr = s.apply(train), te = s.apply(test);
  EXPECT_NEAR(tr.x.mean().item<double>(), 0.0, 1e-5);
  EXPECT_NEAR(tr.x.std().item<double>(), 1.0, 1e-5);
  EXPECT_TRUE(torch::allclose(te.x, (test.x - train.x.mean(0)) / train.x.std(0), 1e-5, 1e-5));
  EXPECT_TRUE(torch::allclose(s.unscale_mean(te.y), test.y.to(torch::kFloat64), 1e-5, 1e-5));
  EXPECT_TRUE(torch::allclose(s.unscale_variance(torch::ones({1, 1})), train.y.var(0).view({1, 1}).to(torch::kFloat64),
                              1e-5, 1e-5));
}

TEST_F(Csv, StandardisingInDoubleKeepsOffsetsAndTinyScales) {
  // A feature 1.7e9 + k loses k as float32 (its step there is 128), and one of k·1e-13 was
  // taken for a constant (its sd is below 1e-12): both reach the networks as k does.
  std::string csv = "offset,tiny,y\n";
  for (int k = 0; k < 10; ++k) {
    csv += std::to_string(1700000000 + k) + "," + std::to_string(k) + "e-13," + std::to_string(k) + "e-13\n";
  }
  const auto d = load_csv(write("scales.csv", csv));
  const auto s = Standardizer::fit(d);
  const auto scaled = s.apply(d);
  ASSERT_EQ(scaled.x.scalar_type(), torch::kFloat32);
  const auto k = torch::arange(10, torch::kFloat32);
  const auto expected = (k - k.mean()) / k.std();
  EXPECT_TRUE(torch::allclose(scaled.x.select(1, 0), expected, 1e-5, 1e-5)) << scaled.x;
  EXPECT_TRUE(torch::allclose(scaled.x.select(1, 1), expected, 1e-5, 1e-5)) << scaled.x;
  EXPECT_TRUE(torch::allclose(scaled.y.squeeze(1), expected, 1e-5, 1e-5)) << scaled.y;
  // Predictions map back in double: 4.5e-13 at the mean, not 1e-13 off.
  EXPECT_NEAR(s.unscale_mean(torch::zeros({1, 1})).item<double>(), 4.5e-13, 1e-20);
  // A constant column becomes zeros; one whose spread rounding would swamp is named.
  const auto constant = Standardizer::fit(load_csv(write("c.csv", "c,y\n5,1\n5,2\n5,3\n")));
  EXPECT_EQ(constant.x_std.item<double>(), 1.0);
  EXPECT_PUSH_ERROR(Standardizer::fit(load_csv(write("r.csv", "r,y\n1000000,1\n1000000.0000001,2\n"))),
                    "column 'r' varies by only");
}

TEST(Data, BuiltinSetsLoadWhenInstalled) {
  if (!fs::exists(data_dir() / "sklearn" / "iris.csv")) GTEST_SKIP() << "run scripts/fetch-data";
  auto iris = load("iris");
  EXPECT_EQ(iris.size(), 150);
  EXPECT_EQ(iris.num_classes, 3);
  EXPECT_EQ(iris.x.size(1), 4);
  auto boston = load("boston_house_prices");
  EXPECT_EQ(boston.size(), 506);
  EXPECT_EQ(boston.target_name, "MEDV");
  auto diabetes = load("diabetes");
  EXPECT_EQ(diabetes.size(), 442);
  EXPECT_EQ(diabetes.x.size(1), 10);
  auto digits = load("digits");
  EXPECT_EQ(digits.input_shape(), (std::vector<int64_t>{1, 8, 8}));
  EXPECT_EQ(digits.num_classes, 10);
}

}  // namespace
}  // namespace push::data

namespace push::data {
namespace {

/// Sets (or, with nullptr, unsets) an environment variable for one scope.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = old;
    value ? ::setenv(name, value, 1) : ::unsetenv(name);
  }
  ~ScopedEnv() { old_ ? ::setenv(name_, old_->c_str(), 1) : ::unsetenv(name_); }

 private:
  const char* name_;
  std::optional<std::string> old_;
};

TEST(DataDir, WithoutHomeTheBuiltInSetsAreRefusedNotReadFromASharedFolder) {
  ScopedEnv named("PUSH_DATA_DIR", nullptr), cache("XDG_CACHE_HOME", nullptr), home("HOME", nullptr);
  for (const char* set : {"iris", "boston_house_prices", "fashion-mnist"}) {
    EXPECT_PUSH_ERROR(load(set),
                      "HOME is not set, so the built-in data sets have no folder of this user's: set "
                      "PUSH_DATA_DIR");
  }
  EXPECT_EQ(load("sine-gap").x.size(0), 512);  // made here: no folder needed
}

TEST(DataDir, ADefaultDataFolderOthersCanWriteOrThatIsNotThisUsersIsRefused) {
  const fs::path root = fs::temp_directory_path() / ("push-data-dir-" + std::to_string(::getpid()));
  fs::remove_all(root);
  const fs::path sklearn = root / "push" / "data" / "sklearn";
  fs::create_directories(sklearn);
  std::ofstream(sklearn / "iris.csv") << "planted\n";
  ScopedEnv named("PUSH_DATA_DIR", nullptr), cache("XDG_CACHE_HOME", root.c_str());
  ::chmod(sklearn.c_str(), 0777);
  EXPECT_PUSH_ERROR(load("iris"), "sklearn is writable by other users");
  ::chmod(sklearn.c_str(), 0755);
  if (::geteuid() == 0) {
    ASSERT_EQ(::chown(sklearn.c_str(), 65534, 65534), 0);
    EXPECT_PUSH_ERROR(load("iris"), "sklearn belongs to uid 65534, not this user");
  }
  {
    // A folder the user names is the user's choice: it is read as it is.
    ScopedEnv chosen("PUSH_DATA_DIR", (root / "push" / "data").c_str());
    EXPECT_PUSH_ERROR(load("iris"), "iris.csv");  // the planted file is read (and is no table)
  }
  fs::remove_all(root);
}

}  // namespace
}  // namespace push::data
