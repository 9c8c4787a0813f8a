// /v1/embeddings: request parsing, Matryoshka cut + renormalization, base64, batch order and
// errors, over a FakeEngine whose pooled vectors are known (fake_engine.h).
#include <cmath>
#include <cstring>

#include "kiln/server/embeddings.h"
#include "kiln/util/base64.h"
#include "unit/server/test_util.h"

namespace kiln::server::testing {
namespace {

using OJson = nlohmann::ordered_json;

std::variant<EmbeddingsRequest, ApiError> parse(const std::string& body, int32_t width = 8) {
  return parse_embeddings_request(OJson::parse(body), qwen3_tokenizer(), width);
}

std::string error_param(const std::variant<EmbeddingsRequest, ApiError>& r) {
  const auto* e = std::get_if<ApiError>(&r);
  if (e == nullptr) return "<no error>";
  EXPECT_EQ(e->status, 400) << e->message;
  return e->param.value_or("");
}

double norm(const std::vector<float>& v) {
  double s = 0;
  for (float x : v) s += static_cast<double>(x) * x;
  return std::sqrt(s);
}

TEST(EmbeddingsParse, InputShapes) {
  const auto& tok = qwen3_tokenizer();
  auto one = parse(R"({"input":"hello world"})");
  ASSERT_TRUE(std::holds_alternative<EmbeddingsRequest>(one));
  const auto& r1 = std::get<EmbeddingsRequest>(one);
  ASSERT_EQ(r1.inputs.size(), 1u);
  EXPECT_EQ(r1.inputs[0], *tok.encode("hello world", true, true));
  EXPECT_FALSE(r1.dimensions);
  EXPECT_FALSE(r1.base64);

  auto list = parse(R"({"input":["a","bb cc"]})");
  const auto& r2 = std::get<EmbeddingsRequest>(list);
  ASSERT_EQ(r2.inputs.size(), 2u);
  EXPECT_EQ(r2.inputs[0], *tok.encode("a", true, true));
  EXPECT_EQ(r2.inputs[1], *tok.encode("bb cc", true, true));

  auto ids = parse(R"({"input":[5,6,7]})");
  EXPECT_EQ(std::get<EmbeddingsRequest>(ids).inputs,
            (std::vector<std::vector<int32_t>>{{5, 6, 7}}));
  auto lists = parse(R"({"input":[[5,6],[7],[8,9,10]]})");
  EXPECT_EQ(std::get<EmbeddingsRequest>(lists).inputs,
            (std::vector<std::vector<int32_t>>{{5, 6}, {7}, {8, 9, 10}}));
  auto mixed = parse(R"({"input":["x",[7,8]]})");
  ASSERT_EQ(std::get<EmbeddingsRequest>(mixed).inputs.size(), 2u);
  EXPECT_EQ(std::get<EmbeddingsRequest>(mixed).inputs[1], (std::vector<int32_t>{7, 8}));
}

TEST(EmbeddingsParse, OptionsAndErrors) {
  auto ok = parse(R"({"input":"x","dimensions":3,"encoding_format":"base64","user":"u"})");
  ASSERT_TRUE(std::holds_alternative<EmbeddingsRequest>(ok));
  EXPECT_EQ(std::get<EmbeddingsRequest>(ok).dimensions, 3);
  EXPECT_TRUE(std::get<EmbeddingsRequest>(ok).base64);
  EXPECT_FALSE(
      std::get<EmbeddingsRequest>(parse(R"({"input":"x","encoding_format":"float"})")).base64);
  EXPECT_EQ(std::get<EmbeddingsRequest>(parse(R"({"input":"x","dimensions":8})")).dimensions, 8);

  EXPECT_EQ(error_param(parse(R"({})")), "input");
  EXPECT_EQ(error_param(parse(R"({"messages":[{"role":"user","content":"x"}]})")), "input");
  EXPECT_EQ(error_param(parse(R"({"input":""})")), "input");
  EXPECT_EQ(error_param(parse(R"({"input":[]})")), "input");
  EXPECT_EQ(error_param(parse(R"({"input":[[]]})")), "input");
  EXPECT_EQ(error_param(parse(R"({"input":["a",""]})")), "input");
  EXPECT_EQ(error_param(parse(R"({"input":[1,"a"]})")), "input");
  EXPECT_EQ(error_param(parse(R"({"input":[-1]})")), "input");
  EXPECT_EQ(error_param(parse(R"({"input":[100000000]})")), "input");
  EXPECT_EQ(error_param(parse(R"({"input":[{"a":1}]})")), "input");
  EXPECT_EQ(error_param(parse(R"({"input":7})")), "input");
  EXPECT_EQ(error_param(parse(R"({"input":"x","dimensions":9})")), "dimensions");
  EXPECT_EQ(error_param(parse(R"({"input":"x","dimensions":0})")), "dimensions");
  EXPECT_EQ(error_param(parse(R"({"input":"x","dimensions":2.5})")), "dimensions");
  EXPECT_EQ(error_param(parse(R"({"input":"x","encoding_format":"int8"})")), "encoding_format");
}

TEST(Embeddings, MatryoshkaKeepsLeadingValuesAndRenormalizes) {
  const std::vector<float> pooled = {3, 4, 12, -84};
  const std::vector<float> full = finish_embedding(pooled, std::nullopt);
  EXPECT_NEAR(norm(full), 1.0, 1e-6);
  EXPECT_FLOAT_EQ(full[0], 3.0f / 85.0f);
  EXPECT_FLOAT_EQ(full[3], -84.0f / 85.0f);
  const std::vector<float> cut = finish_embedding(pooled, 2);
  ASSERT_EQ(cut.size(), 2u);
  EXPECT_FLOAT_EQ(cut[0], 0.6f);
  EXPECT_FLOAT_EQ(cut[1], 0.8f);
  // Cutting the normalized vector and normalizing again gives the same.
  EXPECT_EQ(finish_embedding(full, 2), cut);
  EXPECT_EQ(finish_embedding(pooled, 4), full);
  // A zero vector stays zero (torch's normalize: x / max(||x||, eps)).
  EXPECT_EQ(finish_embedding({0, 0}, std::nullopt), (std::vector<float>{0, 0}));
}

TEST(Embeddings, Base64IsLittleEndianFloat32) {
  const std::vector<float> v = {1.0f, -2.5f, 0.15625f};
  const std::string b64 = embedding_base64(v);
  // 1.0f = 0x3f800000 -> bytes 00 00 80 3f.
  auto bytes = base64::decode(b64);
  ASSERT_TRUE(bytes);
  ASSERT_EQ(bytes->size(), 12u);
  EXPECT_EQ(static_cast<unsigned char>((*bytes)[2]), 0x80);
  EXPECT_EQ(static_cast<unsigned char>((*bytes)[3]), 0x3f);
  std::vector<float> back(3);
  std::memcpy(back.data(), bytes->data(), 12);
  EXPECT_EQ(back, v);
  EXPECT_EQ(b64, "AACAPwAAIMAAACA+");
}

TEST(Embeddings, ResponseShape) {
  const std::string body = embeddings_response({{0.5f, -0.25f}, {1.0f / 3.0f}}, false, "m", 7);
  const json j = json::parse(body);
  EXPECT_EQ(j["object"], "list");
  EXPECT_EQ(j["model"], "m");
  ASSERT_EQ(j["data"].size(), 2u);
  EXPECT_EQ(j["data"][1]["object"], "embedding");
  EXPECT_EQ(j["data"][1]["index"], 1);
  EXPECT_EQ(j["data"][0]["embedding"], json::parse("[0.5,-0.25]"));
  // Shortest form that reads back as the same float.
  EXPECT_EQ(static_cast<float>(j["data"][1]["embedding"][0].get<double>()), 1.0f / 3.0f);
  EXPECT_EQ(j["usage"]["prompt_tokens"], 7);
  EXPECT_EQ(j["usage"]["total_tokens"], 7);
  const json b = json::parse(embeddings_response({{0.5f}}, true, "m", 1));
  EXPECT_EQ(b["data"][0]["embedding"], embedding_base64(std::vector<float>{0.5f}));
}

class EmbeddingsServerTest : public ServerTest {
 protected:
  void SetUp() override { engine_.pooling_ = model::Pooling::kLast; }
};

TEST_F(EmbeddingsServerTest, BatchInOrderNormalizedWithUsage) {
  start();
  // prompt[0] decides the fake engine's delay: these finish out of input order.
  const json body = json::parse(R"({"model":"test-model","input":[[6,1],[2],[5,5,5],[0]]})");
  Reply r = post("/v1/embeddings", body);
  ASSERT_EQ(r.status, 200) << r.body;
  const json j = r.js();
  EXPECT_EQ(j["object"], "list");
  EXPECT_EQ(j["model"], "test-model");
  EXPECT_EQ(j["usage"]["prompt_tokens"], 7);
  EXPECT_EQ(j["usage"]["total_tokens"], 7);
  ASSERT_EQ(j["data"].size(), 4u);
  const std::vector<std::vector<int32_t>> inputs = {{6, 1}, {2}, {5, 5, 5}, {0}};
  for (size_t i = 0; i < inputs.size(); ++i) {
    EXPECT_EQ(j["data"][i]["index"], i);
    const std::vector<float> got = j["data"][i]["embedding"].get<std::vector<float>>();
    const std::vector<float> want =
        finish_embedding(FakeEngine::fake_embedding(inputs[i], 8), std::nullopt);
    ASSERT_EQ(got.size(), 8u);
    for (size_t k = 0; k < 8; ++k) EXPECT_FLOAT_EQ(got[k], want[k]) << i << " " << k;
    EXPECT_NEAR(norm(got), 1.0, 1e-6);
  }
  // Each input its own engine request, marked embed.
  auto reqs = engine_.requests();
  ASSERT_EQ(reqs.size(), 4u);
  for (const auto& q : reqs) EXPECT_TRUE(q.embed);
}

TEST_F(EmbeddingsServerTest, DimensionsAndBase64) {
  start();
  Reply f = post("/v1/embeddings", json::parse(R"({"input":[3,4],"dimensions":3})"));
  ASSERT_EQ(f.status, 200) << f.body;
  const std::vector<float> floats = f.js()["data"][0]["embedding"].get<std::vector<float>>();
  ASSERT_EQ(floats.size(), 3u);
  EXPECT_NEAR(norm(floats), 1.0, 1e-6);
  EXPECT_EQ(floats, finish_embedding(FakeEngine::fake_embedding({3, 4}, 8), 3));
  Reply b = post("/v1/embeddings",
                 json::parse(R"({"input":[3,4],"dimensions":3,"encoding_format":"base64"})"));
  ASSERT_EQ(b.status, 200) << b.body;
  auto bytes = base64::decode(b.js()["data"][0]["embedding"].get<std::string>());
  ASSERT_TRUE(bytes);
  ASSERT_EQ(bytes->size(), 12u);
  std::vector<float> decoded(3);
  std::memcpy(decoded.data(), bytes->data(), 12);
  EXPECT_EQ(decoded, floats);
}

TEST_F(EmbeddingsServerTest, Errors) {
  start();
  auto status_param = [&](const json& body) {
    Reply r = post("/v1/embeddings", body);
    const json j = json::parse(r.body, nullptr, false);
    return std::to_string(r.status) + " " +
           (j.is_object() && j["error"]["param"].is_string()
                ? j["error"]["param"].get<std::string>()
                : std::string("-"));
  };
  EXPECT_EQ(status_param({{"input", ""}}), "400 input");
  EXPECT_EQ(status_param({{"input", json::array()}}), "400 input");
  EXPECT_EQ(status_param({{"prompt", "x"}}), "400 input");
  EXPECT_EQ(status_param({{"input", "x"}, {"dimensions", 9}}), "400 dimensions");
  EXPECT_EQ(status_param({{"input", "x"}, {"model", "other"}}), "404 model");
  engine_.n_ctx_ = 4;
  Reply r = post("/v1/embeddings", json::parse(R"({"input":[[1,2],[1,2,3,4,5]]})"));
  EXPECT_EQ(r.status, 400);
  EXPECT_EQ(r.js()["error"]["code"], "context_length_exceeded");
  EXPECT_NE(r.js()["error"]["message"].get<std::string>().find("input 1 has 5 tokens"),
            std::string::npos);
  EXPECT_EQ(post("/v1/embeddings", json::parse(R"({"input":[1,2,3,4]})")).status, 200);
  EXPECT_TRUE(engine_.requests().size() == 1u);  // the refused batch reached no engine
}

TEST_F(EmbeddingsServerTest, MoreInputsThanTheQueueTakesIs400) {
  ServerOptions o;
  o.max_choices = 2;
  start(o);
  Reply r = post("/v1/embeddings", json::parse(R"({"input":["a","b","c"]})"));
  EXPECT_EQ(r.status, 400);
  EXPECT_EQ(r.js()["error"]["param"], "input");
  EXPECT_TRUE(engine_.requests().empty());
  EXPECT_EQ(post("/v1/embeddings", json::parse(R"({"input":["a","b"]})")).status, 200);
}

TEST_F(EmbeddingsServerTest, GenerationModelAnswers400) {
  engine_.pooling_ = model::Pooling::kNone;
  start();
  Reply r = post("/v1/embeddings", {{"input", "x"}});
  EXPECT_EQ(r.status, 400);
  EXPECT_NE(r.js()["error"]["message"].get<std::string>().find("--pooling"), std::string::npos);
  EXPECT_TRUE(engine_.requests().empty());
}

}  // namespace
}  // namespace kiln::server::testing
