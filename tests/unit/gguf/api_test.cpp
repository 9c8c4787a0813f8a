// Typed getters and their errors, the debug print, writer checks, the mmap wrapper.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <limits>

#include "kiln/gguf/gguf.h"
#include "kiln/gguf/writer.h"
#include "kiln/util/mmap.h"

namespace kiln::gguf {
namespace {

using ::testing::HasSubstr;

std::unique_ptr<File> parse_writer(const Writer& w) {
  auto bytes = w.to_bytes();
  EXPECT_TRUE(bytes.ok()) << bytes.error().message;
  // Metadata only: the File's views would point into `bytes`, but no tensors are written here.
  auto f = File::parse(*bytes);
  EXPECT_TRUE(f.ok()) << f.error().message;
  return std::move(f).value();
}

std::string message(const auto& expected) {
  return expected.ok() ? std::string("(ok)") : expected.error().message;
}

TEST(GgufGetters, ConversionsAndRangeChecks) {
  Writer w;
  w.set_int32("neg", -5);
  w.set_uint8("small", 7);
  w.set_uint64("huge", std::numeric_limits<uint64_t>::max());
  w.set_string("name", "x");
  w.set_float32("f", 1.5f);
  w.set_bool("b", true);
  w.set_int32_array("ints", std::vector<int32_t>{-1, 2});
  w.set_string_array("strs", std::vector<std::string>{"a"});
  auto f = parse_writer(w);

  EXPECT_EQ(*f->get_int("small"), 7);  // unsigned read as signed
  EXPECT_EQ(*f->get_uint("small"), 7u);
  EXPECT_EQ(*f->get_float("small"), 7.0);  // integers read as numbers
  EXPECT_EQ(*f->get_int("neg"), -5);
  EXPECT_THAT(message(f->get_uint("neg")), HasSubstr("key 'neg' value -5 (int32) is out of range"));
  EXPECT_THAT(message(f->get_int("huge")), HasSubstr("key 'huge'"));
  EXPECT_THAT(message(f->get_int("huge")), HasSubstr("out of range for int64"));
  EXPECT_THAT(message(f->get_uint("name")),
              HasSubstr("key 'name' has type string, expected an unsigned integer"));
  EXPECT_THAT(message(f->get_int("f")), HasSubstr("key 'f' has type float32, expected an integer"));
  EXPECT_THAT(message(f->get_string("b")), HasSubstr("key 'b' has type bool, expected string"));
  EXPECT_THAT(message(f->get_bool("small")),
              HasSubstr("key 'small' has type uint8, expected bool"));
  EXPECT_THAT(message(f->get_float("name")), HasSubstr("expected a number"));
  EXPECT_THAT(message(f->get_uint("nope")), HasSubstr("missing key 'nope'"));

  EXPECT_EQ(*f->get_uint_or("nope", 42), 42u);
  EXPECT_EQ(*f->get_int_or("nope", -1), -1);
  EXPECT_EQ(*f->get_float_or("nope", 0.5), 0.5);
  EXPECT_EQ(*f->get_bool_or("nope", true), true);
  EXPECT_EQ(*f->get_string_or("nope", "d"), "d");
  EXPECT_EQ(*f->get_uint_or("small", 42), 7u);
  EXPECT_FALSE(f->get_uint_or("name", 42).ok());  // present with the wrong type: still an error

  EXPECT_THAT(message(f->get_string_array("ints")),
              HasSubstr("key 'ints' has type array[int32], expected array[string]"));
  EXPECT_THAT(message(f->get_uint_array("ints")), HasSubstr("key 'ints' element 0"));
  EXPECT_THAT(message(f->get_float_array("strs")),
              HasSubstr("key 'strs' element 0 has type string, expected a number"));
  EXPECT_THAT(message(f->get_int_array("name")),
              HasSubstr("key 'name' has type string, expected an array of integers"));
  EXPECT_EQ(*f->get_float_array("ints"), (std::vector<float>{-1.0f, 2.0f}));
}

TEST(GgufValue, DebugPrint) {
  EXPECT_EQ(to_string(Value::uint32(42)), "42");
  EXPECT_EQ(to_string(Value::int8(-3)), "-3");
  EXPECT_EQ(to_string(Value::float32(0.1f)), "0.1");
  EXPECT_EQ(to_string(Value::float64(1e300)), "1e+300");
  EXPECT_EQ(to_string(Value::boolean(false)), "false");
  EXPECT_EQ(to_string(Value::string("a\"b\n\x01")), "\"a\\\"b\\n\\x01\"");
  EXPECT_EQ(to_string(Value::string("abcdef"), PrintLimits{16, 3}), "\"abc\"...(+3 bytes)");
  std::vector<Value> items;
  for (int i = 0; i < 5; ++i) items.push_back(Value::int32(i));
  const Value arr = Value::array(ValueType::kInt32, std::move(items));
  EXPECT_EQ(to_string(arr, PrintLimits{3, 10}), "[0, 1, 2, ... (+2 more)]");
  EXPECT_EQ(to_string(arr, PrintLimits{0, 10}), "[... (+5 more)]");
  EXPECT_EQ(to_string(Value::array(ValueType::kString, {})), "[]");
  EXPECT_EQ(arr.type_description(), "array[int32]");
  EXPECT_EQ(value_type_name(static_cast<ValueType>(77)), "type#77");
}

TEST(GgufWriter, RejectsBadTensors) {
  Writer w;
  const std::vector<uint8_t> f32x4(16, 0);
  ASSERT_TRUE(w.add_tensor("t", quant::Type::F32, {4}, f32x4).ok());
  EXPECT_THAT(message(w.add_tensor("t", quant::Type::F32, {4}, f32x4)),
              HasSubstr("duplicate tensor 't'"));
  EXPECT_THAT(message(w.add_tensor("u", quant::Type::F32, {5}, f32x4)),
              HasSubstr("data is 16 bytes, the shape needs 20"));
  EXPECT_THAT(message(w.add_tensor("u", quant::Type::F32, {4, 0}, f32x4)), HasSubstr("ne[1] = 0"));
  EXPECT_THAT(message(w.add_tensor("u", quant::Type::F32, {}, f32x4)), HasSubstr("0 dims"));
  EXPECT_THAT(message(w.add_tensor("u", quant::Type::F32, {4, 1, 1, 1, 1}, f32x4)),
              HasSubstr("5 dims"));
  EXPECT_THAT(message(w.add_tensor("u", quant::Type::Q4_K, {128}, f32x4)),
              HasSubstr("not a multiple of the q4_K block size 256"));
  EXPECT_THAT(message(w.add_tensor("u", quant::Type::F32, {int64_t{1} << 62}, {})),
              HasSubstr("overflows"));
  EXPECT_THAT(message(w.add_tensor(std::string(64, 'n'), quant::Type::F32, {4}, f32x4)),
              HasSubstr("must be 1..63 bytes"));
  EXPECT_THAT(message(w.add_tensor("", quant::Type::F32, {4}, f32x4)),
              HasSubstr("must be 1..63 bytes"));
}

TEST(GgufWriter, RejectsBadValuesAndAlignment) {
  {
    Writer w;
    w.set_alignment(48);
    EXPECT_THAT(message(w.to_bytes()), HasSubstr("general.alignment = 48"));
  }
  {
    Writer w;
    w.set_array("mixed", ValueType::kInt32, {Value::int32(1), Value::string("x")});
    EXPECT_THAT(message(w.to_bytes()),
                HasSubstr("key 'mixed': element 1 has type string in an array of int32"));
  }
  {
    Writer w;
    w.set("bad", Value{ValueType::kUint8, uint64_t{300}});
    EXPECT_THAT(message(w.to_bytes()), HasSubstr("key 'bad'"));
  }
  {
    Writer w;
    w.set("bad", Value{ValueType::kString, int64_t{1}});
    EXPECT_THAT(message(w.to_bytes()), HasSubstr("key 'bad': string value holds no string"));
  }
  {
    Writer w;
    Value v = Value::array(ValueType::kUint8, {Value::uint8(1)});
    for (int i = 0; i < kMaxArrayDepth; ++i) v = Value::array(ValueType::kArray, {v});
    w.set("deep", v);
    EXPECT_THAT(message(w.to_bytes()), HasSubstr("nested deeper than 8"));
  }
  {
    Writer w;  // exactly the deepest allowed nesting writes and reads back
    Value v = Value::array(ValueType::kUint8, {Value::uint8(1)});
    for (int i = 1; i < kMaxArrayDepth; ++i) v = Value::array(ValueType::kArray, {v});
    w.set("deep", v);
    auto f = parse_writer(w);
    EXPECT_EQ(to_string(*f->find("deep")), "[[[[[[[[1]]]]]]]]");
  }
  {
    Writer w;
    w.set_uint8("a", 1);
    w.set_uint8("b", 2);
    EXPECT_TRUE(w.remove("a"));
    EXPECT_FALSE(w.remove("a"));
    auto f = parse_writer(w);
    ASSERT_EQ(f->metadata().size(), 1u);
    EXPECT_EQ(f->metadata()[0].key, "b");
  }
}

TEST(GgufWriter, WriteFileFailureNamesPath) {
  Writer w;
  auto s = w.write_file("/nonexistent-dir/x.gguf");
  EXPECT_THAT(message(s), HasSubstr("'/nonexistent-dir/x.gguf.tmp'"));
  EXPECT_THAT(message(s), HasSubstr("No such file or directory"));
}

std::string temp_path(const char* name) {
  return (std::filesystem::temp_directory_path() / name).string();
}

TEST(MappedFile, EmptyMissingDirectoryAndMove) {
  const std::string empty = temp_path("kiln_mmap_empty_test.bin");
  { std::ofstream(empty, std::ios::binary); }
  auto m = util::MappedFile::open(empty);
  ASSERT_TRUE(m.ok()) << m.error().message;
  EXPECT_EQ(m->size_bytes(), 0u);
  EXPECT_TRUE(m->bytes().empty());
  // An empty file is not a GGUF file: the error names the path and the missing magic.
  auto g = File::open(empty);
  EXPECT_THAT(message(g), HasSubstr("gguf: '" + empty + "': truncated file: magic"));
  std::filesystem::remove(empty);

  auto missing = util::MappedFile::open("/nonexistent/kiln.gguf");
  EXPECT_THAT(message(missing),
              HasSubstr("cannot open '/nonexistent/kiln.gguf': No such file or directory"));
  auto dir = util::MappedFile::open("/tmp");
  EXPECT_THAT(message(dir), HasSubstr("'/tmp' is not a regular file"));

  const std::string full = temp_path("kiln_mmap_full_test.bin");
  { std::ofstream(full, std::ios::binary) << "hello"; }
  auto a = util::MappedFile::open(full);
  ASSERT_TRUE(a.ok());
  const uint8_t* p = a->data();
  util::MappedFile b = std::move(*a);
  EXPECT_EQ(a->data(), nullptr);
  EXPECT_EQ(a->size_bytes(), 0u);
  EXPECT_EQ(b.data(), p);
  ASSERT_EQ(b.size_bytes(), 5u);
  EXPECT_EQ(std::string(reinterpret_cast<const char*>(b.data()), 5), "hello");
  EXPECT_EQ(b.path(), full);
  util::MappedFile c;
  c = std::move(b);
  EXPECT_EQ(c.data(), p);
  std::filesystem::remove(full);  // the mapping outlives the name
  EXPECT_EQ(c.bytes()[4], 'o');
}

}  // namespace
}  // namespace kiln::gguf
