// core/utf8.h: strict decoding and repair by maximal invalid subparts (Unicode table 3-7 and its
// "best practice" for U+FFFD), loose decoding as the Jinja interpreter reads strings, encoding
// round trips, the incomplete suffix a stream decoder holds back, and, over every string of up to
// two bytes, agreement between decode, length, valid and repair.
#include <gtest/gtest.h>

#include <cstdint>
#include <string>

#include "core/utf8.h"

namespace oscar::utf8 {
namespace {

constexpr char kFffd[] = "\xEF\xBF\xBD";

TEST(Utf8, RepairReplacesMaximalInvalidSubparts) {
  EXPECT_EQ(repair("plain \xE2\x82\xAC"), "plain \xE2\x82\xAC");
  EXPECT_EQ(repair("a\xFF"
                   "b"),
            std::string("a") + kFffd + "b");
  EXPECT_EQ(repair("\xe0\x80"), std::string(kFffd) + kFffd);              // E0 needs A0..BF next
  EXPECT_EQ(repair("\xf0\x9f\x98"), kFffd);                               // one maximal subpart
  EXPECT_EQ(repair("\xed\xa0\x80"), std::string(kFffd) + kFffd + kFffd);  // surrogate
  EXPECT_EQ(repair("\xc0\x80"), std::string(kFffd) + kFffd);              // overlong
  EXPECT_EQ(repair("\xf4\x90\x80\x80"), std::string(kFffd) + kFffd + kFffd + kFffd);  // > U+10FFFF
  EXPECT_EQ(repair("\xe4\xb8"
                   "x"),
            std::string(kFffd) + "x");  // cut short by "x"
}

TEST(Utf8, Valid) {
  EXPECT_TRUE(valid(""));
  EXPECT_TRUE(valid("a\xC3\xA9\xE4\xB8\xAD\xF0\x9F\x98\x80"));
  EXPECT_FALSE(valid("\xE4\xB8"));
  EXPECT_FALSE(valid("\xED\xA0\x80"));
  EXPECT_FALSE(valid("\x80"));
}

TEST(Utf8, DecodeAtReportsLengthAndTruncation) {
  Decoded d = decode_at("\xE4\xB8\xAD", 0);
  EXPECT_TRUE(d.ok);
  EXPECT_EQ(d.cp, U'\u4E2D');
  EXPECT_EQ(d.len, 3u);
  d = decode_at("a\xF0\x9F\x98", 1);
  EXPECT_FALSE(d.ok);
  EXPECT_TRUE(d.truncated);
  EXPECT_EQ(d.cp, kReplacement);
  EXPECT_EQ(d.len, 3u);
  d = decode_at("\xF0\x9F\x41", 0);
  EXPECT_FALSE(d.ok);
  EXPECT_FALSE(d.truncated);
  EXPECT_EQ(d.len, 2u);
  d = decode_at("\xF0\x9F\x41", 0, Decoding::kLoose);
  EXPECT_FALSE(d.ok);
  EXPECT_FALSE(d.truncated);
  EXPECT_EQ(d.len, 1u);
}

TEST(Utf8, StrictDecode) {
  EXPECT_EQ(decode("a\xE2\x82\xAC\xF0\x9F\x98\x80"), U"a\u20AC\U0001F600");
  EXPECT_EQ(decode("\xC0\x80"), U"\uFFFD\uFFFD");
  EXPECT_EQ(decode("A\xE4\xB8"), U"A\uFFFD");
  EXPECT_EQ(decode("\xED\xA0\x80"), U"\uFFFD\uFFFD\uFFFD");
}

TEST(Utf8, LooseDecodeAcceptsAnyLeadAndReplacesByteByByte) {
  EXPECT_EQ(decode("a\xE2\x82\xAC", Decoding::kLoose), U"a\u20AC");
  EXPECT_EQ(decode("\xC0\x80", Decoding::kLoose), std::u32string(1, U'\0'));
  EXPECT_EQ(decode("\xED\xA0\x80", Decoding::kLoose), std::u32string(1, char32_t{0xD800}));
  EXPECT_EQ(decode("\xF7\xBF\xBF\xBF", Decoding::kLoose), std::u32string(1, char32_t{0x1FFFFF}));
  EXPECT_EQ(decode("\xE4\xB8", Decoding::kLoose), U"\uFFFD\uFFFD");
  EXPECT_EQ(decode("\xE4\x41", Decoding::kLoose), U"\uFFFDA");
  EXPECT_EQ(decode("\xF8\x80", Decoding::kLoose), U"\uFFFD\uFFFD");
  EXPECT_EQ(length("\xE4\xB8", Decoding::kLoose), 2u);
  EXPECT_EQ(length("\xE4\xB8"), 1u);
}

TEST(Utf8, EncodeRoundTrips) {
  EXPECT_EQ(encode(U"a\u00E9\u4E2D\U0001F600"), "a\xC3\xA9\xE4\xB8\xAD\xF0\x9F\x98\x80");
  std::string s;
  append(s, 0xD800);  // a lone surrogate, as the Jinja lexer writes "\ud800"
  EXPECT_EQ(s, "\xED\xA0\x80");
  for (uint32_t i = 0; i <= 0x1FFFFF; i += 7) {
    const char32_t cp = i;
    const std::string bytes = encode(std::u32string_view(&cp, 1));
    ASSERT_EQ(decode(bytes, Decoding::kLoose), std::u32string(1, cp)) << std::hex << i;
    const bool scalar = i <= 0x10FFFF && (i < 0xD800 || i > 0xDFFF);
    ASSERT_EQ(valid(bytes), scalar) << std::hex << i;
    if (scalar) {
      ASSERT_EQ(decode(bytes), std::u32string(1, cp)) << std::hex << i;
    }
  }
}

TEST(Utf8, IncompleteSuffix) {
  EXPECT_EQ(incomplete_suffix(""), 0u);
  EXPECT_EQ(incomplete_suffix("abc"), 0u);
  EXPECT_EQ(incomplete_suffix("a\xE4"), 1u);
  EXPECT_EQ(incomplete_suffix("a\xE4\xB8"), 2u);
  EXPECT_EQ(incomplete_suffix("\xF0\x9F\x98"), 3u);
  EXPECT_EQ(incomplete_suffix("\xE4\xB8\xAD"), 0u);  // complete
  EXPECT_EQ(incomplete_suffix("\xE0\x80"), 0u);      // can never complete
  EXPECT_EQ(incomplete_suffix("\x80"), 0u);
}

// Every string of zero, one or two bytes: the strict decoder, repair, valid and length agree.
TEST(Utf8, AllShortStringsAgree) {
  for (int n = 0; n < 1 + 256 + 65536; ++n) {
    std::string s;
    if (n > 256) {
      s = {static_cast<char>((n - 257) >> 8), static_cast<char>((n - 257) & 0xFF)};
    } else if (n > 0) {
      s = std::string(1, static_cast<char>(n - 1));
    }
    const std::u32string strict = decode(s);
    ASSERT_EQ(encode(strict), repair(s)) << n;
    ASSERT_EQ(valid(s), repair(s) == s) << n;
    ASSERT_EQ(length(s), strict.size()) << n;
    ASSERT_EQ(length(s, Decoding::kLoose), decode(s, Decoding::kLoose).size()) << n;
  }
}

}  // namespace
}  // namespace oscar::utf8
