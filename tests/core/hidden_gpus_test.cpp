// tests/test_main.cpp hides the GPUs from every test not named _CUDA, and from the
// processes it starts, so that CPU-lane tests check CPU lanes on a GPU machine too.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <string>

namespace push {
namespace {

TEST(TestMain, TestsNotNamedCudaAndTheirChildrenSeeNoGpu) {
  const char* keep = std::getenv("PUSH_TEST_GPUS");
  if (keep != nullptr && std::string(keep) == "visible") GTEST_SKIP() << "PUSH_TEST_GPUS=visible";
  const char* visible = std::getenv("CUDA_VISIBLE_DEVICES");
  ASSERT_NE(visible, nullptr);
  EXPECT_STREQ(visible, "");
  FILE* child = popen("printf '[%s]' \"${CUDA_VISIBLE_DEVICES-unset}\"", "r");
  ASSERT_NE(child, nullptr);
  char out[64] = {};
  const size_t n = fread(out, 1, sizeof(out) - 1, child);
  pclose(child);
  EXPECT_EQ(std::string(out, n), "[]");
}

}  // namespace
}  // namespace push
