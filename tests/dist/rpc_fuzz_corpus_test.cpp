// The wire fuzzer's kept corpus (tests/dist/fuzz_corpus/, found by tests/dist/fuzz/run.sh)
// as regression inputs: each decodes or fails cleanly, through the fuzzer's own function.
#include "fuzz_wire.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <vector>

TEST(RpcFuzzCorpus, EveryKeptInputDecodesOrFailsCleanly) {
  const std::filesystem::path corpus = PUSH_FUZZ_CORPUS;
  ASSERT_TRUE(std::filesystem::is_directory(corpus)) << corpus;
  int inputs = 0;
  for (const auto& entry : std::filesystem::directory_iterator(corpus)) {
    std::ifstream in(entry.path(), std::ios::binary);
    const std::vector<char> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    push::testing::fuzz_wire(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size());
    ++inputs;
  }
  EXPECT_GE(inputs, 100) << "the kept corpus is missing (tests/dist/fuzz/run.sh BUILD --merge makes it)";
}
