// Hostile inputs: hand-built files (v2, v1), every truncation of a valid file, patched fields
// with absurd values, random mutations. Every bad file must give an Error naming the field;
// none may crash (the ASan build proves the absence of overreads).
#include <gtest/gtest.h>

#include <limits>
#include <random>

#include "kiln/gguf/gguf.h"
#include "kiln/gguf/writer.h"
#include "unit/gguf/test_bytes.h"

namespace kiln::gguf {
namespace {

using testing::Bytes;

// A parse of a copy of `bytes` in an exactly sized heap buffer, so that any read past the end
// is caught by ASan rather than landing in the caller's larger buffer. `buf` keeps the views of
// a successful parse alive.
struct Parsed {
  std::unique_ptr<uint8_t[]> buf;
  Expected<std::unique_ptr<File>> file;
  bool ok() const { return file.ok(); }
  const Error& error() const { return file.error(); }
  const File& operator*() const { return **file; }
  const File* operator->() const { return file->get(); }
};

Parsed parse_exact(const std::vector<uint8_t>& bytes, size_t len) {
  auto buf = std::make_unique<uint8_t[]>(len);
  if (len > 0) std::memcpy(buf.get(), bytes.data(), len);
  auto f = File::parse(std::span<const uint8_t>(buf.get(), len));
  if (f.ok()) {
    for (const TensorInfo& t : (*f)->tensors()) {
      EXPECT_GE(t.data, buf.get());
      EXPECT_LE(t.data + t.size_bytes, buf.get() + len);
    }
  }
  return Parsed{std::move(buf), std::move(f)};
}

std::string error_of(const std::vector<uint8_t>& bytes) {
  auto f = parse_exact(bytes, bytes.size());
  if (f.ok()) return "(parsed OK)";
  return f.error().message;
}

// A small valid file built by hand, remembering where each field lives.
struct Base {
  Bytes b;
  size_t n_tensors_at, n_kv_at;
  size_t arch_key_len_at, arch_str_len_at;
  size_t align_type_at, align_value_at;
  size_t tokens_elem_type_at, tokens_count_at, token0_len_at;
  size_t flag_value_at;
  size_t w_name_at, w_n_dims_at, w_ne0_at, w_ne1_at, w_type_at, w_offset_at;
  size_t b_name_at, b_ne0_at, b_offset_at;
  size_t data_at;

  explicit Base(uint32_t version = 3) {
    b.u32(kMagic);
    b.u32(version);
    n_tensors_at = b.u64(2);
    n_kv_at = b.u64(4);
    arch_key_len_at = b.str("general.architecture");
    b.u32(static_cast<uint32_t>(ValueType::kString));
    arch_str_len_at = b.str("llama");
    b.str("general.alignment");
    align_type_at = b.u32(static_cast<uint32_t>(ValueType::kUint32));
    align_value_at = b.u32(32);
    b.str("tokens");
    b.u32(static_cast<uint32_t>(ValueType::kArray));
    tokens_elem_type_at = b.u32(static_cast<uint32_t>(ValueType::kString));
    tokens_count_at = b.u64(2);
    token0_len_at = b.str("a");
    b.str("bc");
    b.str("flag");
    b.u32(static_cast<uint32_t>(ValueType::kBool));
    flag_value_at = b.u8(1);
    // w: q8_0 [32, 2] = 2 blocks of 34 bytes at offset 0.
    w_name_at = b.str("w");
    w_n_dims_at = b.u32(2);
    w_ne0_at = b.u64(32);
    w_ne1_at = b.u64(2);
    w_type_at = b.u32(static_cast<uint32_t>(quant::Type::Q8_0));
    w_offset_at = b.u64(0);
    // b: f32 [8] = 32 bytes at offset 96 (68 rounded up to 32).
    b_name_at = b.str("b");
    b.u32(1);
    b_ne0_at = b.u64(8);
    b.u32(static_cast<uint32_t>(quant::Type::F32));
    b_offset_at = b.u64(96);
    b.pad_to(32);
    data_at = b.pos();
    b.fill(68, 0xAB);
    b.fill(28, 0);
    b.fill(32, 0xCD);
  }
};

TEST(GgufHostile, BaseFileIsValid) {
  Base base;
  auto f = parse_exact(base.b.data(), base.b.data().size());
  ASSERT_TRUE(f.ok()) << f.error().message;
  EXPECT_EQ(f->version(), 3u);
  EXPECT_EQ(*f->get_string("general.architecture"), "llama");
  EXPECT_EQ(f->data_offset(), base.data_at);
  ASSERT_EQ(f->tensors().size(), 2u);
  EXPECT_EQ(f->tensors()[0].size_bytes, 68u);
  EXPECT_EQ(f->tensors()[1].offset, 96u);
}

TEST(GgufHostile, HandWrittenV2FileReads) {
  Base base(2);
  const std::vector<uint8_t>& bytes = base.b.data();
  auto f = File::parse(bytes);
  ASSERT_TRUE(f.ok()) << f.error().message;
  EXPECT_EQ((*f)->version(), 2u);
  EXPECT_EQ(*(*f)->get_string_array("tokens"), (std::vector<std::string>{"a", "bc"}));
  EXPECT_TRUE(*(*f)->get_bool("flag"));
  const TensorInfo* b = (*f)->find_tensor("b");
  ASSERT_NE(b, nullptr);
  EXPECT_EQ(b->type, quant::Type::F32);
  EXPECT_EQ(b->ne, std::vector<int64_t>{8});
  EXPECT_EQ(b->data, bytes.data() + base.data_at + 96);
  EXPECT_EQ(b->data[0], 0xCD);
  EXPECT_EQ((*f)->find_tensor("w")->data[67], 0xAB);
}

TEST(GgufHostile, VersionsAndMagic) {
  EXPECT_NE(error_of(Base(1).b.data()).find("unsupported version 1"), std::string::npos);
  EXPECT_NE(error_of(Base(4).b.data()).find("unsupported version 4"), std::string::npos);
  EXPECT_NE(error_of(Base(0x03000000).b.data()).find("big-endian"), std::string::npos);
  Base bad;
  bad.b.patch_u8(0, 'X');
  EXPECT_NE(error_of(bad.b.data()).find("bad magic"), std::string::npos);
  EXPECT_NE(error_of({}).find("magic"), std::string::npos);
}

// (a) Every strict prefix of a valid file is an error, never a crash; the full file parses.
void expect_every_truncation_fails(const std::vector<uint8_t>& bytes) {
  for (size_t len = 0; len < bytes.size(); ++len) {
    auto f = parse_exact(bytes, len);
    EXPECT_FALSE(f.ok()) << "prefix of " << len << " of " << bytes.size() << " bytes parsed";
    if (!f.ok()) {
      EXPECT_EQ(f.error().message.rfind("gguf: ", 0), 0u) << f.error().message;
    }
  }
  EXPECT_TRUE(parse_exact(bytes, bytes.size()).ok());
}

std::vector<uint8_t> rich_writer_file() {
  Writer w;
  w.set_string("general.architecture", "llama");
  w.set_uint8("u8", 1);
  w.set_int16("i16", -2);
  w.set_uint64("u64", 3);
  w.set_float64("f64", 4.5);
  w.set_bool("b", true);
  w.set_string("empty", "");
  const std::vector<std::string> toks = {"<s>", "", "hello"};
  w.set_string_array("toks", toks);
  w.set_array(
      "nested", ValueType::kArray,
      {Value::array(ValueType::kInt32, {Value::int32(5)}), Value::array(ValueType::kString, {})});
  std::vector<uint8_t> data(4 * 16, 1);
  EXPECT_TRUE(w.add_tensor("x", quant::Type::F32, {4, 4}, data).ok());
  std::vector<uint8_t> q(34, 2);
  EXPECT_TRUE(w.add_tensor("y", quant::Type::Q8_0, {32}, q).ok());
  return *w.to_bytes();
}

TEST(GgufHostile, EveryTruncationIsAnError) {
  expect_every_truncation_fails(Base().b.data());
  expect_every_truncation_fails(rich_writer_file());
}

// (b) Patched fields with absurd values give clear errors naming the field.
struct PatchCase {
  const char* what;
  std::vector<const char*> expect;  // substrings of the message
};

void expect_error(const std::vector<uint8_t>& bytes, const PatchCase& c) {
  const std::string msg = error_of(bytes);
  for (const char* s : c.expect) {
    EXPECT_NE(msg.find(s), std::string::npos) << c.what << ": '" << s << "' not in: " << msg;
  }
}

TEST(GgufHostile, HugeCountsAndLengths) {
  constexpr uint64_t kHuge = std::numeric_limits<uint64_t>::max();
  {
    Base x;
    x.b.patch_u64(x.n_kv_at, kHuge);
    expect_error(x.b.data(), {"n_kv", {"n_kv 18446744073709551615", "offset 16"}});
  }
  {
    Base x;
    x.b.patch_u64(x.n_tensors_at, uint64_t{1} << 40);
    expect_error(x.b.data(), {"n_tensors", {"n_tensors 1099511627776", "offset 8"}});
  }
  {
    Base x;
    x.b.patch_u64(x.arch_key_len_at, kHuge);
    expect_error(x.b.data(),
                 {"key length",
                  {"key length 18446744073709551615", "key #0", "offset 24", "exceeds remaining"}});
  }
  {
    Base x;
    x.b.patch_u64(x.arch_str_len_at, 4294967295u);
    expect_error(x.b.data(), {"string length",
                              {"string length 4294967295", "'general.architecture'",
                               "exceeds remaining", "truncated file"}});
  }
  {
    Base x;
    x.b.patch_u64(x.tokens_count_at, kHuge / 2);
    expect_error(
        x.b.data(),
        {"array count", {"array count 9223372036854775807", "'tokens'", "exceeds remaining"}});
  }
  {
    Base x;
    x.b.patch_u64(x.token0_len_at, 1000);
    expect_error(x.b.data(), {"array string", {"string length 1000", "'tokens'"}});
  }
  {
    Base x;
    x.b.patch_u32(x.tokens_elem_type_at, 99);
    expect_error(x.b.data(), {"elem type", {"unknown array element type 99", "'tokens'"}});
  }
  {
    Base x;
    x.b.patch_u32(x.align_type_at, 13);
    expect_error(x.b.data(), {"value type", {"unknown value type 13", "'general.alignment'"}});
  }
  {
    Base x;
    x.b.patch_u8(x.flag_value_at, 2);
    expect_error(x.b.data(), {"bool", {"bool value 2", "'flag'"}});
  }
}

// Counts that the bytes could hold but that would cost memory out of proportion (one Value per
// 1-byte element) stop at kiln's limits.
TEST(GgufHostile, MetadataAndTensorCountLimits) {
  {
    Bytes b;  // a uint8 array of kMaxMetadataValues elements, all bytes present
    b.u32(kMagic);
    b.u32(3);
    b.u64(0);
    b.u64(1);
    b.str("blob");
    b.u32(static_cast<uint32_t>(ValueType::kArray));
    b.u32(static_cast<uint32_t>(ValueType::kUint8));
    b.u64(kMaxMetadataValues);
    b.fill(kMaxMetadataValues, 0);
    expect_error(b.data(), {"values limit", {"array count 8388608", "'blob'", "limit"}});
  }
  {
    Base x;
    x.b.patch_u64(x.n_kv_at, kMaxMetadataValues + 1);
    expect_error(x.b.data(), {"n_kv limit", {"n_kv 8388609", "limit"}});
  }
  {
    Base x;
    x.b.patch_u64(x.n_tensors_at, kMaxTensors + 1);
    expect_error(x.b.data(), {"n_tensors limit", {"n_tensors 1048577", "limit"}});
  }
}

TEST(GgufHostile, BadAlignment) {
  for (uint32_t a : {0u, 3u, 48u}) {
    Base x;
    x.b.patch_u32(x.align_value_at, a);
    expect_error(x.b.data(), {"alignment", {"general.alignment", "power of two"}});
  }
  Base x;
  x.b.patch_u32(x.align_type_at, static_cast<uint32_t>(ValueType::kInt32));
  x.b.patch_u32(x.align_value_at, static_cast<uint32_t>(-32));
  expect_error(x.b.data(), {"negative alignment", {"general.alignment", "unsigned"}});
}

TEST(GgufHostile, BadTensorInfos) {
  constexpr uint64_t kHuge = std::numeric_limits<uint64_t>::max();
  {
    Base x;
    x.b.patch_u32(x.w_n_dims_at, 5);
    expect_error(x.b.data(), {"n_dims 5", {"n_dims 5", "'w'", "1..4"}});
  }
  {
    Base x;
    x.b.patch_u32(x.w_n_dims_at, 0);
    expect_error(x.b.data(), {"n_dims 0", {"n_dims 0", "'w'"}});
  }
  {
    Base x;
    x.b.patch_u32(x.w_n_dims_at, 0xffffffffu);
    expect_error(x.b.data(), {"n_dims huge", {"n_dims 4294967295"}});
  }
  {
    Base x;
    x.b.patch_u64(x.w_ne1_at, 0);
    expect_error(x.b.data(), {"ne 0", {"ne[1] = 0", "'w'"}});
  }
  {
    Base x;
    x.b.patch_u64(x.w_ne0_at, kHuge);
    expect_error(x.b.data(), {"ne huge", {"ne[0] = 18446744073709551615", "'w'"}});
  }
  {
    Base x;  // 2^32 * 2^32 elements overflows int64
    x.b.patch_u64(x.w_ne0_at, uint64_t{1} << 32);
    x.b.patch_u64(x.w_ne1_at, uint64_t{1} << 32);
    expect_error(x.b.data(), {"ne product", {"element count", "overflows", "'w'"}});
  }
  {
    Base x;  // 2^62 f32 elements fit int64 but not the byte size
    x.b.patch_u64(x.b_ne0_at, uint64_t{1} << 62);
    expect_error(x.b.data(), {"size overflow", {"byte size", "overflows", "'b'"}});
  }
  {
    Base x;
    x.b.patch_u32(x.w_type_at, 4);  // Q4_2: removed from ggml
    expect_error(x.b.data(), {"type 4", {"unknown tensor type id 4", "'w'"}});
  }
  {
    Base x;
    x.b.patch_u32(x.w_type_at, 0xdeadbeef);
    expect_error(x.b.data(), {"type huge", {"unknown tensor type id 3735928559", "'w'"}});
  }
  {
    Base x;
    x.b.patch_u64(x.w_ne0_at, 16);  // q8_0 blocks hold 32
    expect_error(x.b.data(), {"block", {"ne[0] = 16", "multiple", "q8_0", "'w'"}});
  }
  {
    Base x;
    x.b.patch_u64(x.b_offset_at, 97);
    expect_error(x.b.data(), {"misaligned", {"data offset 97", "alignment 32", "'b'"}});
  }
  {
    Base x;
    x.b.patch_u64(x.b_offset_at, kHuge - 31);
    expect_error(x.b.data(), {"offset huge", {"beyond the file end", "'b'"}});
  }
  {
    Base x;
    x.b.patch_u64(x.b_offset_at, 128);  // in range of an aligned offset but past the data
    expect_error(x.b.data(), {"offset past end", {"beyond the file end", "'b'"}});
  }
  {
    Base x;
    x.b.patch_u64(x.b_offset_at, 64);  // w occupies [0, 68)
    expect_error(x.b.data(), {"overlap", {"overlaps", "'w'", "'b'"}});
  }
  {
    Base x;
    x.b.patch_u8(x.b_name_at + 8, 'w');
    expect_error(x.b.data(), {"dup tensor", {"duplicate tensor name 'w'"}});
  }
  {
    Base x;
    x.b.patch_u64(x.w_name_at, kHuge);
    expect_error(x.b.data(), {"name len", {"tensor name length", "tensor #0"}});
  }
}

TEST(GgufHostile, DuplicateKey) {
  Bytes b;
  b.u32(kMagic);
  b.u32(3);
  b.u64(0);
  b.u64(2);
  for (int i = 0; i < 2; ++i) {
    b.str("k");
    b.u32(static_cast<uint32_t>(ValueType::kUint8));
    b.u8(1);
  }
  expect_error(b.data(), {"dup key", {"duplicate key 'k'", "key #1"}});
}

TEST(GgufHostile, ArrayNestingIsBounded) {
  auto nested = [](int depth) {
    Bytes b;
    b.u32(kMagic);
    b.u32(3);
    b.u64(0);
    b.u64(1);
    b.str("deep");
    b.u32(static_cast<uint32_t>(ValueType::kArray));
    for (int i = 1; i < depth; ++i) {
      b.u32(static_cast<uint32_t>(ValueType::kArray));
      b.u64(1);
    }
    b.u32(static_cast<uint32_t>(ValueType::kUint8));
    b.u64(1);
    b.u8(7);
    return b.data();
  };
  auto ok = File::parse(nested(kMaxArrayDepth));
  ASSERT_TRUE(ok.ok()) << ok.error().message;
  expect_error(nested(kMaxArrayDepth + 1), {"too deep", {"nested deeper than 8", "'deep'"}});
  // A million levels must not recurse a million times.
  expect_error(nested(1000000), {"very deep", {"nested deeper than 8"}});
}

// (c) Random mutations: never a crash; a file that still parses has its views in bounds
// (checked by parse_exact) and can be walked.
void walk(const File& f, std::span<const uint8_t> bytes) {
  for (const KeyValue& kv : f.metadata()) {
    EXPECT_EQ(f.find(kv.key), &kv.value);
    EXPECT_FALSE(to_string(kv.value).empty());
  }
  for (const TensorInfo& t : f.tensors()) {
    EXPECT_EQ(f.find_tensor(t.name), &t);
    EXPECT_EQ(t.data, bytes.data() + f.data_offset() + t.offset);
    EXPECT_LE(f.data_offset() + t.offset + t.size_bytes, bytes.size());
    EXPECT_EQ(t.offset % f.alignment(), 0u);
    EXPECT_GT(t.num_elements(), 0);
    uint64_t sum = 0;
    for (uint8_t byte : t.bytes()) sum += byte;  // ASan: every byte is inside `bytes`
    EXPECT_LE(sum, 255 * t.size_bytes);
  }
}

TEST(GgufHostile, RandomMutationsNeverCrash) {
  const std::vector<std::vector<uint8_t>> seeds = {Base().b.data(), rich_writer_file()};
  std::mt19937_64 rng(12345);
  const uint64_t extremes[] = {0,
                               1,
                               2,
                               31,
                               32,
                               0x7f,
                               0xff,
                               0xffff,
                               0xffffffffu,
                               uint64_t{1} << 63,
                               std::numeric_limits<uint64_t>::max()};
  int num_ok = 0;
  int num_err = 0;
  for (int iter = 0; iter < 20000; ++iter) {
    std::vector<uint8_t> bytes = seeds[iter % seeds.size()];
    const int num_mutations = 1 + static_cast<int>(rng() % 4);
    for (int m = 0; m < num_mutations; ++m) {
      const size_t at = rng() % bytes.size();
      switch (rng() % 4) {
        case 0:
          bytes[at] = static_cast<uint8_t>(rng());
          break;
        case 1:
          bytes[at] ^= static_cast<uint8_t>(1u << (rng() % 8));
          break;
        case 2: {  // an extreme integer written over a field-sized window
          const uint64_t v = extremes[rng() % std::size(extremes)];
          const size_t width = (rng() % 2) ? 8 : 4;
          for (size_t i = 0; i < width && at + i < bytes.size(); ++i) {
            bytes[at + i] = static_cast<uint8_t>(v >> (8 * i));
          }
          break;
        }
        default:
          bytes.resize(at);
          break;
      }
      if (bytes.empty()) break;
    }
    auto f = parse_exact(bytes, bytes.size());
    if (f.ok()) {
      ++num_ok;
    } else {
      ++num_err;
      EXPECT_EQ(f.error().message.rfind("gguf: ", 0), 0u) << f.error().message;
    }
  }
  // Both outcomes happen, so the mutations exercise the reader rather than all failing early.
  EXPECT_GT(num_ok, 100);
  EXPECT_GT(num_err, 1000);
}

TEST(GgufHostile, MutatedFilesThatParseCanBeWalked) {
  const std::vector<uint8_t> base = rich_writer_file();
  std::mt19937_64 rng(777);
  int num_walked = 0;
  for (int iter = 0; iter < 3000; ++iter) {
    std::vector<uint8_t> bytes = base;
    bytes[rng() % bytes.size()] = static_cast<uint8_t>(rng());
    auto f = File::parse(bytes);  // views into `bytes`, alive for the walk
    if (!f.ok()) continue;
    walk(**f, bytes);
    ++num_walked;
  }
  EXPECT_GT(num_walked, 100);  // mutations of tensor data and string bytes still parse
}

}  // namespace
}  // namespace kiln::gguf
