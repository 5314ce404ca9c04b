// The main of every push test binary: GoogleTest's, except that tests run with the GPUs
// hidden (CUDA_VISIBLE_DEVICES=""), they and every process they start, unless every test
// the filter selects is named ..._CUDA. Lanes go to the GPUs whenever a process sees any
// (PushOptions::device_type), and the other tests check CPU lanes: their lane counts
// (devices(2) on a one-GPU machine is an error), their CPU tensors and their bitwise
// results. CTest runs each test in a process of its own with --gtest_filter naming it, so
// a GPU machine runs the _CUDA tests on its GPUs and the rest as a machine without one
// does. A whole binary run without a filter hides them (its _CUDA tests skip);
// PUSH_TEST_GPUS=visible keeps them for any filter. A rank worker (PUSH_DIST_WORKER)
// inherits what its test decided.
#include <gtest/gtest.h>

#include <algorithm>
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

// Every positive pattern of the filter (the part before a '-') names a _CUDA test.
bool only_cuda_tests(const std::string& filter) {
  const std::string positive = filter.substr(0, filter.find('-'));
  bool any = false;
  size_t start = 0;
  while (start <= positive.size()) {
    const size_t end = std::min(positive.find(':', start), positive.size());
    const std::string pattern = positive.substr(start, end - start);
    if (!pattern.empty() && pattern.find("_CUDA") == std::string::npos) return false;
    any = any || !pattern.empty();
    start = end + 1;
  }
  return any;
}

}  // namespace

int main(int argc, char** argv) {
  const char* gpus = std::getenv("PUSH_TEST_GPUS");
  const bool keep = (gpus != nullptr && std::string(gpus) == "visible") || std::getenv("PUSH_DIST_WORKER") != nullptr;
  // Before anything touches CUDA: the driver reads the variable once, when it starts.
  if (!keep && !only_cuda_tests(gtest_filter(argc, argv))) setenv("CUDA_VISIBLE_DEVICES", "", 1);
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
