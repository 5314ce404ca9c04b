// libFuzzer's entry point over push::testing::fuzz_wire (tests/dist/fuzz_wire.h).
#include "fuzz_wire.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) { return push::testing::fuzz_wire(data, size); }
