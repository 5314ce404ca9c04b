// The main of every push test binary: GoogleTest's, except that a test not named ..._CUDA
// runs with the GPUs hidden (CUDA_VISIBLE_DEVICES=""), it and every process it starts.
// Lanes go to the GPUs whenever a process sees any (PushOptions::device_type), and those
// tests check CPU lanes: their lane counts (devices(2) on a one-GPU machine is an error),
// their CPU tensors and their bitwise results. CTest runs each test in a process of its
// own with --gtest_filter naming it, so a GPU machine runs the _CUDA tests on its GPUs and
// the rest as a machine without one does. The GPUs stay visible when the filter names a
// _CUDA test, or when PUSH_TEST_GPUS=visible.
#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <string>

namespace {

std::string gtest_filter(int argc, char** argv) {
  std::string filter = std::getenv("GTEST_FILTER") != nullptr ? std::getenv("GTEST_FILTER") : "";
  constexpr const char* kFlag = "--gtest_filter=";
  for (int i = 1; i < argc; ++i) {
    if (std::strncmp(argv[i], kFlag, std::strlen(kFlag)) == 0) filter = argv[i] + std::strlen(kFlag);
  }
  return filter;
}

}  // namespace

int main(int argc, char** argv) {
  const char* gpus = std::getenv("PUSH_TEST_GPUS");
  const bool keep = gpus != nullptr && std::string(gpus) == "visible";
  // Before anything touches CUDA: the driver reads the variable once, when it starts.
  if (!keep && gtest_filter(argc, argv).find("_CUDA") == std::string::npos) setenv("CUDA_VISIBLE_DEVICES", "", 1);
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
