// Writer -> reader round trips: every value type, nested and empty arrays, tensor views.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <limits>

#include "kiln/gguf/gguf.h"
#include "kiln/gguf/writer.h"

namespace kiln::gguf {
namespace {

std::unique_ptr<File> parse_ok(const std::vector<uint8_t>& bytes) {
  auto f = File::parse(bytes);
  EXPECT_TRUE(f.ok()) << (f.ok() ? "" : f.error().message);
  return f.ok() ? std::move(f).value() : nullptr;
}

std::vector<uint8_t> pattern(size_t n, uint8_t seed) {
  std::vector<uint8_t> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = static_cast<uint8_t>(seed + i * 7);
  return v;
}

TEST(GgufRoundTrip, EveryScalarType) {
  Writer w;
  w.set_uint8("u8", 250);
  w.set_int8("i8", -120);
  w.set_uint16("u16", 65000);
  w.set_int16("i16", -32000);
  w.set_uint32("u32", 4000000000u);
  w.set_int32("i32", -2000000000);
  w.set_uint64("u64", std::numeric_limits<uint64_t>::max());
  w.set_int64("i64", std::numeric_limits<int64_t>::min());
  w.set_float32("f32", 0.1f);
  w.set_float64("f64", -1e300);
  w.set_bool("yes", true);
  w.set_bool("no", false);
  w.set_string("s", "héllo\nworld");
  w.set_string("empty", "");
  w.set_string("not utf8", std::string("\xff\xfe\0z", 4));  // kept as bytes
  auto f = parse_ok(*w.to_bytes());
  ASSERT_TRUE(f);
  EXPECT_EQ(f->version(), 3u);
  EXPECT_EQ(f->alignment(), 32u);
  ASSERT_EQ(f->metadata().size(), 15u);
  EXPECT_EQ(f->metadata()[0].key, "u8");
  EXPECT_EQ(f->metadata()[13].key, "empty");

  EXPECT_EQ(f->find("u8")->type, ValueType::kUint8);
  EXPECT_EQ(*f->get_uint("u8"), 250u);
  EXPECT_EQ(f->find("i8")->type, ValueType::kInt8);
  EXPECT_EQ(*f->get_int("i8"), -120);
  EXPECT_EQ(f->find("u16")->type, ValueType::kUint16);
  EXPECT_EQ(*f->get_uint("u16"), 65000u);
  EXPECT_EQ(f->find("i16")->type, ValueType::kInt16);
  EXPECT_EQ(*f->get_int("i16"), -32000);
  EXPECT_EQ(f->find("u32")->type, ValueType::kUint32);
  EXPECT_EQ(*f->get_uint("u32"), 4000000000u);
  EXPECT_EQ(f->find("i32")->type, ValueType::kInt32);
  EXPECT_EQ(*f->get_int("i32"), -2000000000);
  EXPECT_EQ(f->find("u64")->type, ValueType::kUint64);
  EXPECT_EQ(*f->get_uint("u64"), std::numeric_limits<uint64_t>::max());
  EXPECT_EQ(f->find("i64")->type, ValueType::kInt64);
  EXPECT_EQ(*f->get_int("i64"), std::numeric_limits<int64_t>::min());
  EXPECT_EQ(f->find("f32")->type, ValueType::kFloat32);
  EXPECT_EQ(static_cast<float>(*f->get_float("f32")), 0.1f);
  EXPECT_EQ(f->find("f64")->type, ValueType::kFloat64);
  EXPECT_EQ(*f->get_float("f64"), -1e300);
  EXPECT_EQ(f->find("yes")->type, ValueType::kBool);
  EXPECT_TRUE(*f->get_bool("yes"));
  EXPECT_FALSE(*f->get_bool("no"));
  EXPECT_EQ(*f->get_string("s"), "héllo\nworld");
  EXPECT_EQ(*f->get_string("empty"), "");
  EXPECT_EQ(*f->get_string("not utf8"), std::string("\xff\xfe\0z", 4));
  EXPECT_TRUE(f->tensors().empty());
}

TEST(GgufRoundTrip, ArraysIncludingNestedAndEmpty) {
  Writer w;
  const std::vector<std::string> toks = {"a", "", "<|end|>", std::string("\0x", 2)};
  const std::vector<float> scores = {0.0f, -1.5f, 3.25f};
  const std::vector<int32_t> types = {1, -2, 3};
  const std::vector<int64_t> big = {std::numeric_limits<int64_t>::max(), -1};
  const std::vector<uint32_t> us = {7, 8};
  w.set_string_array("toks", toks);
  w.set_float_array("scores", scores);
  w.set_int32_array("types", types);
  w.set_int64_array("big", big);
  w.set_uint32_array("us", us);
  w.set_string_array("empty_strs", {});
  w.set_array("empty_arr", ValueType::kArray, {});
  w.set_array("bools", ValueType::kBool, {Value::boolean(true), Value::boolean(false)});
  w.set_array("f64s", ValueType::kFloat64, {Value::float64(2.5)});
  // [[1, 2], [], [["x"]]] as nested arrays of different element types.
  w.set_array(
      "nested", ValueType::kArray,
      {Value::array(ValueType::kUint8, {Value::uint8(1), Value::uint8(2)}),
       Value::array(ValueType::kInt16, {}),
       Value::array(ValueType::kArray, {Value::array(ValueType::kString, {Value::string("x")})})});
  auto f = parse_ok(*w.to_bytes());
  ASSERT_TRUE(f);
  EXPECT_EQ(*f->get_string_array("toks"), toks);
  EXPECT_EQ(*f->get_float_array("scores"), scores);
  EXPECT_EQ(*f->get_int_array("types"), (std::vector<int64_t>{1, -2, 3}));
  EXPECT_EQ(*f->get_int_array("big"), big);
  EXPECT_EQ(*f->get_uint_array("us"), (std::vector<uint64_t>{7, 8}));
  EXPECT_TRUE(f->get_string_array("empty_strs")->empty());
  EXPECT_EQ(f->find("empty_strs")->as_array()->elem_type, ValueType::kString);
  EXPECT_EQ(f->find("empty_arr")->as_array()->elem_type, ValueType::kArray);
  EXPECT_TRUE(f->find("empty_arr")->as_array()->items.empty());
  EXPECT_EQ(to_string(*f->find("bools")), "[true, false]");
  EXPECT_EQ(*f->get_float_array("f64s"), std::vector<float>{2.5f});
  const Value* nested = f->find("nested");
  ASSERT_NE(nested, nullptr);
  EXPECT_EQ(nested->type_description(), "array[array]");
  EXPECT_EQ(to_string(*nested), "[[1, 2], [], [[\"x\"]]]");
  EXPECT_EQ(nested->as_array()->items[1].as_array()->elem_type, ValueType::kInt16);
}

TEST(GgufRoundTrip, ReplacingAKeyKeepsItsSlot) {
  Writer w;
  w.set_uint32("a", 1);
  w.set_string("b", "x");
  w.set_uint32("c", 3);
  w.set_string("a", "now a string");
  auto f = parse_ok(*w.to_bytes());
  ASSERT_TRUE(f);
  ASSERT_EQ(f->metadata().size(), 3u);
  EXPECT_EQ(f->metadata()[0].key, "a");
  EXPECT_EQ(*f->get_string("a"), "now a string");
  EXPECT_EQ(f->metadata()[2].key, "c");
}

TEST(GgufRoundTrip, TensorViewsPointAtTheirBytes) {
  for (uint32_t alignment : {1u, 8u, 32u, 64u, 4096u}) {
    Writer w;
    if (alignment != 32) w.set_alignment(alignment);
    const auto a = pattern(4 * 3 * 5, 1);    // f32 [3, 5]
    const auto b = pattern(18 * 2, 2);       // q4_0 [32, 2] -> 2 blocks of 18 bytes
    const auto c = pattern(144 * 2 * 3, 3);  // q4_K [256, 2, 3]
    const auto d = pattern(2 * 7, 4);        // f16 [7]
    ASSERT_TRUE(w.add_tensor("a", quant::Type::F32, {3, 5}, a).ok());
    ASSERT_TRUE(w.add_tensor("b", quant::Type::Q4_0, {32, 2}, b).ok());
    ASSERT_TRUE(w.add_tensor("blk.0.c", quant::Type::Q4_K, {256, 2, 3, 1}, c).ok());
    ASSERT_TRUE(w.add_tensor("d", quant::Type::F16, {7}, d).ok());
    const std::vector<uint8_t> bytes = *w.to_bytes();
    auto f = parse_ok(bytes);
    ASSERT_TRUE(f);
    EXPECT_EQ(f->alignment(), alignment);
    EXPECT_EQ(f->data_offset() % alignment, 0u);
    ASSERT_EQ(f->tensors().size(), 4u);
    const std::vector<uint8_t>* want[] = {&a, &b, &c, &d};
    for (size_t i = 0; i < 4; ++i) {
      const TensorInfo& t = f->tensors()[i];
      EXPECT_EQ(t.offset % alignment, 0u) << t.name;
      EXPECT_EQ(t.data, bytes.data() + f->data_offset() + t.offset) << t.name;
      ASSERT_EQ(t.size_bytes, want[i]->size()) << t.name;
      EXPECT_EQ(0, std::memcmp(t.data, want[i]->data(), t.size_bytes)) << t.name;
    }
    const TensorInfo* c_info = f->find_tensor("blk.0.c");
    ASSERT_NE(c_info, nullptr);
    EXPECT_EQ(c_info->type, quant::Type::Q4_K);
    EXPECT_EQ(c_info->ne, (std::vector<int64_t>{256, 2, 3, 1}));
    EXPECT_EQ(c_info->num_elements(), 256 * 2 * 3);
    EXPECT_EQ(f->find_tensor("missing"), nullptr);
    // The gaps between tensors are zeros.
    std::vector<std::pair<uint64_t, uint64_t>> used;  // file ranges of tensor data
    for (const TensorInfo& t : f->tensors()) {
      const auto begin = static_cast<uint64_t>(t.data - bytes.data());
      used.emplace_back(begin, begin + t.size_bytes);
    }
    uint64_t num_padding = 0;
    for (uint64_t i = f->data_offset(); i < bytes.size(); ++i) {
      bool in_tensor = false;
      for (auto [b, e] : used) in_tensor |= (i >= b && i < e);
      if (in_tensor) continue;
      EXPECT_EQ(bytes[i], 0) << "padding byte at " << i;
      ++num_padding;
    }
    if (alignment == 4096) {
      // Gaps after a (60 bytes), b (36) and c (864) up to the next 4096 boundary.
      EXPECT_EQ(num_padding, (4096u - 60) + (4096u - 36) + (4096u - 864));
    }
    // The last tensor ends the file: nothing padded after it.
    const TensorInfo& last = f->tensors().back();
    EXPECT_EQ(last.data + last.size_bytes, bytes.data() + bytes.size());
  }
}

TEST(GgufRoundTrip, WriteFileAndOpenWithMmap) {
  const std::string path =
      (std::filesystem::temp_directory_path() / "kiln_gguf_roundtrip_test.gguf").string();
  Writer w;
  w.set_string("general.architecture", "llama");
  const auto a = pattern(64 * 34 / 32, 9);  // q8_0 [64] -> 2 blocks
  ASSERT_TRUE(w.add_tensor("t", quant::Type::Q8_0, {64}, a).ok());
  ASSERT_TRUE(w.write_file(path).ok());
  EXPECT_FALSE(std::filesystem::exists(path + ".tmp"));
  auto f = File::open(path);
  ASSERT_TRUE(f.ok()) << f.error().message;
  EXPECT_EQ((*f)->path(), path);
  EXPECT_EQ(*(*f)->get_string("general.architecture"), "llama");
  const TensorInfo* t = (*f)->find_tensor("t");
  ASSERT_NE(t, nullptr);
  ASSERT_EQ(t->size_bytes, a.size());
  EXPECT_EQ(0, std::memcmp(t->data, a.data(), a.size()));
  // write_file and to_bytes produce the same bytes.
  auto mapped = util::MappedFile::open(path);
  ASSERT_TRUE(mapped.ok());
  const std::vector<uint8_t> on_disk(mapped->bytes().begin(), mapped->bytes().end());
  EXPECT_EQ(on_disk, *w.to_bytes());
  std::filesystem::remove(path);
}

}  // namespace
}  // namespace kiln::gguf
