#include "kiln/chat/output_parser.h"

#include <gtest/gtest.h>

namespace kiln::chat {
namespace {
TEST(OutputParser, Smoke) {
  ParserConfig c;
  c.format = ToolFormat::kHermes;
  auto m = parse_all(c, "hi <tool_call>{\"name\":\"f\",\"arguments\":{\"a\":1}}</tool_call>");
  EXPECT_EQ(m.content, "hi");
  ASSERT_EQ(m.tool_calls.size(), 1u);
}
}  // namespace
}  // namespace kiln::chat
