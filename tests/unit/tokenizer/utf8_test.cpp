#include "kiln/util/utf8.h"

#include <gtest/gtest.h>

namespace kiln::utf8 {
namespace {

TEST(Utf8, SequenceLength) {
  EXPECT_EQ(sequence_length(0x41), 1);
  EXPECT_EQ(sequence_length(0x80), 0);  // continuation
  EXPECT_EQ(sequence_length(0xC1), 0);  // would be overlong
  EXPECT_EQ(sequence_length(0xC2), 2);
  EXPECT_EQ(sequence_length(0xE0), 3);
  EXPECT_EQ(sequence_length(0xF4), 4);
  EXPECT_EQ(sequence_length(0xF5), 0);
}

TEST(Utf8, DecodeEncodeRoundTrip) {
  for (char32_t cp : {0x0u, 0x41u, 0x7Fu, 0x80u, 0x7FFu, 0x800u, 0xD7FFu, 0xE000u, 0xFFFDu, 0xFFFFu,
                      0x10000u, 0x1F600u, 0x10FFFFu}) {
    std::string s;
    append(s, cp);
    const Decoded d = decode(s, 0);
    EXPECT_EQ(d.cp, cp);
    EXPECT_EQ(static_cast<size_t>(d.num_bytes), s.size());
    EXPECT_TRUE(is_valid(s));
  }
  std::string s;
  append(s, 0xD800);  // a surrogate is not a scalar value
  EXPECT_EQ(s, "\xEF\xBF\xBD");
}

TEST(Utf8, RejectsMalformed) {
  EXPECT_EQ(find_invalid("abc"), kNpos);
  EXPECT_EQ(find_invalid("ab\x80"), 2u);                       // lone continuation
  EXPECT_EQ(find_invalid("\xC0\xAF"), 0u);                     // overlong '/'
  EXPECT_EQ(find_invalid("\xE0\x80\xAF"), 0u);                 // overlong
  EXPECT_EQ(find_invalid("x\xED\xA0\x80"), 1u);                // surrogate U+D800
  EXPECT_EQ(find_invalid("\xF4\x90\x80\x80"), 0u);             // above U+10FFFF
  EXPECT_EQ(find_invalid("\xE4\xBD"), 0u);                     // truncated
  EXPECT_EQ(find_invalid("12345678\xFF"), 8u);                 // after the ASCII fast path
  EXPECT_EQ(find_invalid("\xE4\xBD\xA0\xE5\xA5\xBD"), kNpos);  // 你好
}

TEST(Utf8, IncompleteTail) {
  EXPECT_EQ(incomplete_tail_length(""), 0u);
  EXPECT_EQ(incomplete_tail_length("a"), 0u);
  EXPECT_EQ(incomplete_tail_length("a\xE4"), 1u);
  EXPECT_EQ(incomplete_tail_length("a\xE4\xBD"), 2u);
  EXPECT_EQ(incomplete_tail_length("a\xE4\xBD\xA0"), 0u);  // complete
  EXPECT_EQ(incomplete_tail_length("\xF0\x9F\x98"), 3u);
  EXPECT_EQ(incomplete_tail_length("\xF0\x9F"), 2u);
  EXPECT_EQ(incomplete_tail_length("\x80"), 0u);      // invalid, not incomplete
  EXPECT_EQ(incomplete_tail_length("\xE0\x80"), 0u);  // can never become valid
  EXPECT_EQ(incomplete_tail_length("\xED\xA0"), 0u);  // surrogate prefix
  EXPECT_EQ(incomplete_tail_length("\xC3"), 1u);
}

TEST(Utf8, RepairUsesMaximalSubparts) {
  // Expected strings follow the WHATWG decoder (the same as Python errors="replace").
  EXPECT_EQ(repair("ok"), "ok");
  EXPECT_EQ(repair("a\x80"
                   "b"),
            "a\xEF\xBF\xBD"
            "b");
  EXPECT_EQ(repair("\xE4\xBD"
                   "a"),
            "\xEF\xBF\xBD"
            "a");                                             // one U+FFFD for 2 bytes
  EXPECT_EQ(repair("\xF0\x9F\x98"), "\xEF\xBF\xBD");          // truncated emoji
  EXPECT_EQ(repair("\xC0\xAF"), "\xEF\xBF\xBD\xEF\xBF\xBD");  // each byte invalid
  EXPECT_EQ(repair("\xED\xA0\x80"), "\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD");
  EXPECT_EQ(count_code_points("a\xE4\xBD\xA0\xF0\x9F\x98\x80"), 3u);
}

}  // namespace
}  // namespace kiln::utf8
