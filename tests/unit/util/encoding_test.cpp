// base64 (RFC 4648) and SHA-1 (FIPS 180-4) against the RFCs' test vectors and Python's
// hashlib (the lengths around the 56- and 64-byte padding boundaries).
#include <gtest/gtest.h>

#include <random>
#include <string>

#include "kiln/util/base64.h"
#include "kiln/util/sha1.h"

namespace kiln {
namespace {

std::string hex(const Sha1Digest& d) {
  static const char* kHex = "0123456789abcdef";
  std::string out;
  for (uint8_t b : d) {
    out += kHex[b >> 4];
    out += kHex[b & 15];
  }
  return out;
}

TEST(Base64, Rfc4648Vectors) {
  // RFC 4648 section 10.
  const std::pair<const char*, const char*> vectors[] = {{"", ""},
                                                         {"f", "Zg=="},
                                                         {"fo", "Zm8="},
                                                         {"foo", "Zm9v"},
                                                         {"foob", "Zm9vYg=="},
                                                         {"fooba", "Zm9vYmE="},
                                                         {"foobar", "Zm9vYmFy"}};
  for (const auto& [plain, encoded] : vectors) {
    EXPECT_EQ(base64::encode(plain), encoded);
    auto back = base64::decode(encoded);
    ASSERT_TRUE(back.has_value()) << encoded;
    EXPECT_EQ(*back, plain);
  }
}

TEST(Base64, RoundTripsEveryByteValueAndLength) {
  std::mt19937 rng(7);
  for (size_t n = 0; n < 300; ++n) {
    std::string bytes(n, '\0');
    for (char& c : bytes) c = static_cast<char>(rng() & 0xFF);
    const std::string text = base64::encode(bytes);
    EXPECT_EQ(text.size(), (n + 2) / 3 * 4);
    auto back = base64::decode(text);
    ASSERT_TRUE(back.has_value()) << n;
    EXPECT_EQ(*back, bytes);
  }
}

TEST(Base64, RejectsNonCanonicalText) {
  for (const char* bad :
       {"Zg=", "Zg", "Z===", "Zm9v!A==", "Zm=v", "=m9v", "Zh==", "Zm9=Zm9v", "Zm 9v", "Zm9\n"})
    EXPECT_FALSE(base64::decode(bad).has_value()) << bad;
}

TEST(Sha1, Fips180Vectors) {
  EXPECT_EQ(hex(sha1("")), "da39a3ee5e6b4b0d3255bfef95601890afd80709");
  EXPECT_EQ(hex(sha1("abc")), "a9993e364706816aba3e25717850c26c9cd0d89d");
  EXPECT_EQ(hex(sha1("abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq")),
            "84983e441c3bd26ebaae4aa1f95129e5e54670f1");
  EXPECT_EQ(hex(sha1(std::string(1000000, 'a'))), "34aa973cd4c4daa4f61eeb2bdbad27316534016f");
}

TEST(Sha1, PaddingBoundaries) {
  // hashlib.sha1(b"a" * n).hexdigest()
  const std::pair<size_t, const char*> vectors[] = {
      {55, "c1c8bbdc22796e28c0e15163d20899b65621d65a"},
      {56, "c2db330f6083854c99d4b5bfb6e8f29f201be699"},
      {63, "03f09f5b158a7a8cdad920bddc29b81c18a551f5"},
      {64, "0098ba824b5c16427bd7a1122a5a442a25ec644d"},
      {65, "11655326c708d70319be2610e8a57d9a5b959d3b"},
      {119, "ee971065aaa017e0632a8ca6c77bb3bf8b1dfc56"},
      {120, "f34c1488385346a55709ba056ddd08280dd4c6d6"}};
  for (const auto& [n, digest] : vectors) EXPECT_EQ(hex(sha1(std::string(n, 'a'))), digest) << n;
}

TEST(Sha1, WebSocketAcceptOfRfc6455Example) {
  // RFC 6455 section 1.3: the key "dGhlIHNhbXBsZSBub25jZQ==" is answered with this.
  const Sha1Digest d = sha1("dGhlIHNhbXBsZSBub25jZQ==258EAFA5-E914-47DA-95CA-C5AB0DC85B11");
  EXPECT_EQ(base64::encode(std::string_view(reinterpret_cast<const char*>(d.data()), d.size())),
            "s3pPLMBiTxaQ9kYGzzhZRbK+xOo=");
}

}  // namespace
}  // namespace kiln
