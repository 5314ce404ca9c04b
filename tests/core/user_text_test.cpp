// Numbers read from users' text, text quoted back, and sealed files: the one way push
// reads and checks them.
#include <gtest/gtest.h>

#include "core/sealed_text.h"
#include "core/user_text.h"
#include "test_util.h"

namespace push::detail {
namespace {

TEST(UserText, PlainDecimalsOnly) {
  EXPECT_EQ(parse_decimal("1.5"), 1.5);
  EXPECT_EQ(parse_decimal("-2e-3"), -2e-3);
  EXPECT_EQ(parse_decimal("+.5"), 0.5);
  EXPECT_EQ(parse_decimal("7."), 7.0);
  for (const char* bad : {"", "0x10", "nan", "inf", "1e", "e5", ".", "1 ", " 1", "1,5", "--1", "1e5x"}) {
    EXPECT_FALSE(parse_decimal(bad).has_value()) << bad;
  }
  EXPECT_FALSE(std::isfinite(*parse_decimal("1e999")));  // syntax fine, caller checks the range
}

TEST(UserText, WholeNumbersInRange) {
  EXPECT_EQ(parse_whole("42", 0, 100), 42);
  EXPECT_EQ(parse_whole("+3", 0, 100), 3);
  EXPECT_EQ(parse_whole("-1", -5, 5), -1);
  for (const char* bad : {"-1", "101", "1.0", "", "-", "0x1", "99999999999999999999", "1e2"}) {
    EXPECT_FALSE(parse_whole(bad, 0, 100).has_value()) << bad;
  }
}

TEST(UserText, PrintableEscapesControlBytesAndCuts) {
  EXPECT_EQ(printable("a\x1b[31m\r\n"), "a\\x1b[31m\\x0d\\x0a");
  EXPECT_EQ(printable(std::string("\0z", 2)), "\\x00z");
  EXPECT_EQ(printable("température"), "température");  // UTF-8 passes
  EXPECT_EQ(printable(std::string(100, 'x'), 5), "xxxxx...");
}

TEST(SealedText, EveryByteIsChecked) {
  const std::string sealed = seal("epochs 3\nlosses 1 2 3\n");
  EXPECT_EQ(unseal(sealed, "m"), "epochs 3\nlosses 1 2 3\n");
  std::string edited = sealed;
  edited[7] = '2';
  EXPECT_PUSH_ERROR(unseal(edited, "m"), "m fails its checksum");
  EXPECT_PUSH_ERROR(unseal(sealed.substr(0, sealed.size() - 1), "m"), "m is truncated");
  EXPECT_PUSH_ERROR(unseal(sealed + "more\n", "m"), "m is truncated or has something after its end line");
  EXPECT_PUSH_ERROR(unseal("", "m"), "m is truncated");
  EXPECT_EQ(unseal(seal(""), "m"), "");
}

}  // namespace
}  // namespace push::detail
