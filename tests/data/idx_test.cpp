// IDX (MNIST-format) files: sizes are checked against the header, and the images and
// labels against each other, before any tensor is built.
#include <push/data/dataset.h>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <filesystem>
#include <fstream>

#include "test_util.h"

namespace push::data {
namespace {
namespace fs = std::filesystem;

std::string be32(uint32_t v) {
  return {static_cast<char>(v >> 24), static_cast<char>(v >> 16), static_cast<char>(v >> 8), static_cast<char>(v)};
}

class Idx : public ::testing::Test {
 protected:
  fs::path dir_ = fs::temp_directory_path() / ("push_idx_test_" + std::to_string(::getpid()));
  void SetUp() override {
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  void write(const std::string& name, const std::string& bytes) {
    std::ofstream(dir_ / name, std::ios::binary) << bytes;
  }
  /// `n` images of 3x2 pixels (pixel value = 10 * image + position) and their labels.
  static std::string images(uint32_t n, uint32_t header_n) {
    std::string s = be32(0x803) + be32(header_n) + be32(3) + be32(2);
    for (uint32_t i = 0; i < n; ++i) {
      for (int k = 0; k < 6; ++k) s += static_cast<char>(10 * i + k);
    }
    return s;
  }
  static std::string labels(uint32_t n, uint32_t header_n) {
    std::string s = be32(0x801) + be32(header_n);
    for (uint32_t i = 0; i < n; ++i) s += static_cast<char>(i % 3);
    return s;
  }
  void write_set(const std::string& part, uint32_t n) {
    write(part + "-images-idx3-ubyte", images(n, n));
    write(part + "-labels-idx1-ubyte", labels(n, n));
  }
};

TEST_F(Idx, ATrainingSetOfOneClassIsRefused) {
  // As a CSV with one class is: accuracy 1 and nll 0 on it would mean nothing.
  write("train-images-idx3-ubyte", images(3, 3));
  write("train-labels-idx1-ubyte", be32(0x801) + be32(3) + std::string(3, '\0'));
  write_set("t10k", 2);
  EXPECT_PUSH_ERROR(load_idx(dir_, true), "every label is 0; classification needs at least two classes");
}

TEST_F(Idx, ALinkToADeviceIsRefusedBeforeAnyByteIsRead) {
  // /dev/zero would be read whole (forever) before its header was checked.
  write_set("t10k", 2);
  write("train-labels-idx1-ubyte", labels(2, 2));
  fs::create_symlink("/dev/zero", dir_ / "train-images-idx3-ubyte");
  EXPECT_PUSH_ERROR(load_idx(dir_, true), "train-images-idx3-ubyte is not a regular file");
}

TEST_F(Idx, TestImagesOfAnotherSizeAreRefusedWhenLoaded) {
  // Before, training ran to the end and then failed: "mat1 and mat2 shapes cannot be multiplied".
  write_set("train", 4);
  write("t10k-images-idx3-ubyte", be32(0x803) + be32(2) + be32(2) + be32(3) + std::string(12, '\1'));
  write("t10k-labels-idx1-ubyte", labels(2, 2));
  EXPECT_PUSH_ERROR(load_split(dir_.string(), {}, 0.2, 0), "t10k-images-idx3-ubyte holds images of [1, 2, 3]");
}

TEST_F(Idx, ATargetColumnIsRefusedForAnIdxFolder) {
  // IDX data have their labels as the target: a --target was ignored without a word.
  write_set("train", 4);
  write_set("t10k", 2);
  EXPECT_PUSH_ERROR(load(dir_.string(), CsvOptions{"foo", std::nullopt}),
                    "--target applies to CSV files, not the IDX folder");
}

TEST_F(Idx, ReadsImagesAndLabels) {
  write_set("train", 4);
  write_set("t10k", 2);
  auto d = load_idx(dir_, true);
  EXPECT_EQ(d.x.sizes(), (std::vector<int64_t>{4, 1, 3, 2}));
  EXPECT_FLOAT_EQ(d.x[2][0][1][1].item<float>(), 23 / 255.0f);
  EXPECT_TRUE(torch::equal(d.y, torch::tensor({0, 1, 2, 0}, torch::kLong)));
  EXPECT_EQ(d.num_classes, 3);
  EXPECT_EQ(d.class_labels, (std::vector<double>{0, 1, 2}));
  auto [train, test] = load_split(dir_.string(), {}, 0.2, 0);
  EXPECT_EQ(train.size(), 4);
  EXPECT_EQ(test.size(), 2);
}

TEST_F(Idx, LabelsAreClassNumbersWithEveryClassPresent) {
  // A stray label 99 in a 3-class set would make a 100-class problem.
  write_set("train", 6);
  std::string bad = labels(6, 6);
  bad[8 + 4] = 99;
  write("train-labels-idx1-ubyte", bad);
  EXPECT_PUSH_ERROR(load_idx(dir_, true), "its labels go up to 99 (item 4) but no item has label 3");
  // A test label beyond the training classes is named too.
  write_set("train", 6);
  write_set("t10k", 2);
  std::string test = labels(2, 2);
  test[8 + 1] = 7;
  write("t10k-labels-idx1-ubyte", test);
  EXPECT_PUSH_ERROR(load_split(dir_.string(), {}, 0.2, 0), "has label 7 but the training labels are 0 to 2");
}

TEST_F(Idx, TruncatedOrInconsistentFilesNameTheProblem) {
  write_set("t10k", 2);
  // A file that announces 60000 images but holds one.
  write("train-images-idx3-ubyte", images(1, 60000));
  write("train-labels-idx1-ubyte", labels(60000, 60000));
  EXPECT_PUSH_ERROR(load_idx(dir_, true), "train-images-idx3-ubyte is truncated");
  // A header cut to 10 bytes.
  write("train-images-idx3-ubyte", images(4, 4).substr(0, 10));
  EXPECT_PUSH_ERROR(load_idx(dir_, true), "train-images-idx3-ubyte");
  EXPECT_PUSH_ERROR(load_idx(dir_, true), "header");
  // One pixel short, or one label short.
  write("train-images-idx3-ubyte", images(4, 4).substr(0, 16 + 4 * 6 - 1));
  write("train-labels-idx1-ubyte", labels(4, 4));
  EXPECT_PUSH_ERROR(load_idx(dir_, true), "truncated");
  write("train-images-idx3-ubyte", images(4, 4));
  write("train-labels-idx1-ubyte", labels(3, 4));
  EXPECT_PUSH_ERROR(load_idx(dir_, true), "train-labels-idx1-ubyte is truncated");
  // Counts that disagree, trailing bytes, a wrong magic number.
  write("train-labels-idx1-ubyte", labels(3, 3));
  EXPECT_PUSH_ERROR(load_idx(dir_, true), "4 images but 3 labels");
  write("train-labels-idx1-ubyte", labels(4, 4) + "xx");
  EXPECT_PUSH_ERROR(load_idx(dir_, true), "2 bytes after");
  write("train-labels-idx1-ubyte", images(4, 4));
  EXPECT_PUSH_ERROR(load_idx(dir_, true), "magic");
  fs::remove(dir_ / "train-labels-idx1-ubyte");
  EXPECT_PUSH_ERROR(load_idx(dir_, true), "no IDX file");
}

}  // namespace
}  // namespace push::data
