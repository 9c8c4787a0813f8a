// The engine loop on the real stories260K model: many concurrent requests give the same
// greedy tokens as each alone, cancellation frees blocks, refusals come before any work.
#include "kiln/engine/engine.h"
#include "kiln/engine/executor.h"

#include <gtest/gtest.h>

#include <atomic>
#include <cstdlib>
#include <fstream>
#include <thread>

#include <nlohmann/json.hpp>

#include "unit/engine/fixture_engine.h"

namespace kiln::engine {
namespace {

const std::string kModels = std::string(KILN_SOURCE_DIR) + "/../shared/models/";

struct Result {
  std::vector<int32_t> tokens;
  std::string text;
  FinishEvent finish;
};

Result drain(const std::shared_ptr<RequestChannel>& ch) {
  Result r;
  if (ch == nullptr) return r;  // submit_ok reported the refusal
  for (;;) {
    auto e = ch->pop(std::chrono::milliseconds(30000));
    if (!e) {
      ADD_FAILURE() << "timed out waiting for an event";
      return r;
    }
    if (auto* t = std::get_if<TokenEvent>(&*e)) {
      r.tokens.push_back(t->token);
      r.text += t->text;
      continue;
    }
    r.finish = std::get<FinishEvent>(*e);
    r.text += r.finish.text;
    return r;
  }
}

std::shared_ptr<RequestChannel> submit_ok(Engine& e, GenerationRequest req) {
  auto res = e.submit(std::move(req));
  if (auto* refusal = std::get_if<SubmitRefusal>(&res)) {
    ADD_FAILURE() << refusal->message;
    return nullptr;
  }
  return std::get<std::shared_ptr<RequestChannel>>(res);
}

GenerationRequest greedy(std::vector<int32_t> prompt, int32_t max_tokens) {
  GenerationRequest r;
  r.prompt_tokens = std::move(prompt);
  r.max_tokens = max_tokens;
  r.sampling.temperature = 0;
  return r;
}

// n prompts of different lengths (5 + 7 i tokens after BOS) and contents.
std::vector<std::vector<int32_t>> varied_prompts(int n) {
  std::vector<std::vector<int32_t>> prompts;
  for (int i = 0; i < n; ++i) {
    std::vector<int32_t> p = {1};
    for (int j = 0; j < 5 + 7 * i; ++j) p.push_back(3 + (i * 31 + j * 17) % 500);
    prompts.push_back(p);
  }
  return prompts;
}

// The device the engine tests run on: KILN_TEST_DEVICE (cpu by default; the GPU machine
// runs them with cuda).
std::string test_device() {
  const char* d = std::getenv("KILN_TEST_DEVICE");
  return d == nullptr || *d == '\0' ? "cpu" : d;
}

// stories260K on the test device, 8 sequences in steps of 64 tokens (small: forces chunked
// prefill and several steps per batch).
EngineOptions test_options() {
  EngineOptions o;
  o.model_path = kModels + "stories260K.gguf";
  o.device = test_device();
  o.threads = 2;
  o.n_ctx = 256;
  o.max_seqs = 8;
  o.max_batch_tokens = 64;
  o.max_waiting = 64;
  return o;
}

class EngineTest : public ::testing::Test {
 protected:
  void SetUp() override {
    engine_ = std::make_unique<Engine>(test_options());
    engine_->start();
    ASSERT_TRUE(engine_->wait_ready().ok());
  }
  std::unique_ptr<Engine> engine_;
};

// A step that throws (here bad_alloc, injected before the forward of the 3rd step) fails
// the requests in it with an error; the engine thread goes on and serves the next ones.
TEST(EngineFailure, AFailedStepFailsItsRequestsAndTheEngineGoesOn) {
  EngineOptions o;
  o.model_path = kModels + "stories260K.gguf";
  o.device = test_device();
  o.threads = 2;
  o.n_ctx = 128;
  std::atomic<int> injected{0};
  o.before_step = [&](int64_t step, Executor&) {
    if (step == 2) {
      injected++;
      throw std::bad_alloc();
    }
  };
  Engine e(o);
  e.start();
  ASSERT_TRUE(e.wait_ready().ok());
  Result failed = drain(submit_ok(e, greedy({1, 403, 407}, 16)));
  EXPECT_EQ(injected.load(), 1);
  EXPECT_EQ(failed.finish.reason, FinishReason::kError);
  EXPECT_NE(failed.finish.error.find("bad_alloc"), std::string::npos) << failed.finish.error;
  EXPECT_LT(failed.tokens.size(), 16u);
  Result ok = drain(submit_ok(e, greedy({1, 403, 407}, 16)));
  EXPECT_EQ(ok.finish.reason, FinishReason::kLength);
  EXPECT_EQ(ok.tokens.size(), 16u);
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  EXPECT_EQ(e.stats().num_kv_blocks_used, 0);
  EXPECT_EQ(e.state(), EngineState::kReady);
  // The engine thread's time by phase: every step scheduled, run and updated.
  const EngineStats st = e.stats();
  EXPECT_GT(st.num_steps, 0);
  EXPECT_GT(st.step_schedule_seconds, 0);
  EXPECT_GT(st.step_launch_seconds, 0);
  EXPECT_GE(st.step_wait_seconds, 0);
  EXPECT_GT(st.step_update_seconds, 0);
  EXPECT_GT(st.step_deliver_seconds, 0);  // every token event handed over
}

// A device mesh (--tp 2 on the CPU's collective backend) serves like one device; when a rank
// fails (here the mesh given up before the 4th step, as a rank that died would leave it), the
// requests in flight fail as unavailable (the server's 503), so do later ones, the engine's
// state is kFailed (/health answers 503), and nothing hangs.
TEST(EngineFailure, AFailedMeshRankFailsEveryRequestAsUnavailable) {
  EngineOptions o;
  o.model_path = kModels + "stories260K.gguf";
  o.device = "cpu";
  o.threads = 1;
  o.n_ctx = 128;
  o.mesh.tp = 2;
  Engine whole_engine([&] {
    EngineOptions w = o;
    w.mesh = {};
    return w;
  }());
  whole_engine.start();
  ASSERT_TRUE(whole_engine.wait_ready().ok());
  const Result whole = drain(submit_ok(whole_engine, greedy({1, 403, 407}, 16)));
  std::atomic<bool> fail{false};
  o.before_step = [&](int64_t, Executor& ex) {
    if (fail.load()) ex.abort("rank 1 is gone (injected)");
  };
  Engine e(o);
  e.start();
  ASSERT_TRUE(e.wait_ready().ok());
  const Result meshed = drain(submit_ok(e, greedy({1, 403, 407}, 16)));
  EXPECT_EQ(meshed.finish.reason, FinishReason::kLength);
  EXPECT_EQ(meshed.tokens, whole.tokens);  // stories260K is F32: the same greedy tokens
  fail = true;
  const Result failed = drain(submit_ok(e, greedy({1, 403, 407}, 16)));
  EXPECT_EQ(failed.finish.reason, FinishReason::kError);
  EXPECT_TRUE(failed.finish.unavailable);
  EXPECT_NE(failed.finish.error.find("rank 1 is gone (injected)"), std::string::npos)
      << failed.finish.error;
  EXPECT_EQ(e.state(), EngineState::kFailed);
  auto later = e.submit(greedy({1, 403}, 4));
  ASSERT_TRUE(std::holds_alternative<SubmitRefusal>(later));
  EXPECT_EQ(std::get<SubmitRefusal>(later).error, SubmitError::kUnavailable);
}

// Without --ctx the context is the model's trained one (stories260K: 2048), known once loaded;
// a given context stands from the start.
TEST(EngineContext, DefaultIsTheModelsTrainedContext) {
  EngineOptions o;
  o.model_path = kModels + "stories260K.gguf";
  o.device = test_device();
  o.threads = 1;
  Engine e(o);
  EXPECT_EQ(e.context_length(), 0);
  e.start();
  ASSERT_TRUE(e.wait_ready().ok());
  EXPECT_EQ(e.context_length(), 2048);
  o.n_ctx = 300;
  Engine given(o);
  EXPECT_EQ(given.context_length(), 300);
}

TEST_F(EngineTest, GreedyMatchesLlamaCpp) {
  std::ifstream f(kModels + "stories260K.greedy64.nodellamacpp.json");
  const nlohmann::json g = nlohmann::json::parse(f);
  Result r = drain(submit_ok(*engine_, greedy(g["prompt_ids"], 64)));
  EXPECT_EQ(r.tokens, g["greedy_ids"].get<std::vector<int32_t>>());
  EXPECT_EQ(r.text, g["text"].get<std::string>());
  EXPECT_EQ(r.finish.reason, FinishReason::kLength);
  EXPECT_EQ(r.finish.usage.prompt_tokens, 5);
  EXPECT_EQ(r.finish.usage.completion_tokens, 64);
}

TEST_F(EngineTest, ConcurrentEqualsAlone) {
  const std::vector<std::vector<int32_t>> prompts = varied_prompts(12);
  std::vector<Result> alone;
  for (const auto& p : prompts) alone.push_back(drain(submit_ok(*engine_, greedy(p, 20))));
  std::vector<std::shared_ptr<RequestChannel>> chans;
  for (const auto& p : prompts) chans.push_back(submit_ok(*engine_, greedy(p, 20)));
  for (size_t i = 0; i < chans.size(); ++i) {
    Result r = drain(chans[i]);
    EXPECT_EQ(r.tokens, alone[i].tokens) << "request " << i;
    EXPECT_EQ(r.text, alone[i].text);
  }
  // Blocks all back (cached ones are free and evictable).
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  EXPECT_EQ(engine_->stats().num_kv_blocks_used, 0);
  EXPECT_EQ(engine_->stats().num_running, 0);
}

// Plain greedy requests take their tokens from the device's argmax (the step's logits never
// come back); the same requests with logprobs (which need the logits) take the sampler's
// greedy choice: the same tokens, alone and in one batch with each other (a mixed step brings
// the logits back for every row).
TEST_F(EngineTest, DeviceArgmaxEqualsTheSamplersGreedyChoice) {
  const std::vector<std::vector<int32_t>> prompts = varied_prompts(6);
  auto with_logprobs = [](GenerationRequest r) {
    r.sampling.logprobs = true;
    return r;
  };
  const int64_t argmax0 = engine_->stats().num_argmax_steps;
  std::vector<Result> plain, sampled;
  for (const auto& p : prompts) plain.push_back(drain(submit_ok(*engine_, greedy(p, 24))));
  std::this_thread::sleep_for(std::chrono::milliseconds(200));  // stats follow each step
  const int64_t argmax1 = engine_->stats().num_argmax_steps;
  EXPECT_GE(argmax1 - argmax0, 24) << "plain greedy requests took the argmax path";
  for (const auto& p : prompts)
    sampled.push_back(drain(submit_ok(*engine_, with_logprobs(greedy(p, 24)))));
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  EXPECT_EQ(engine_->stats().num_argmax_steps, argmax1) << "logprobs need the logits";
  std::vector<std::shared_ptr<RequestChannel>> mixed;
  for (size_t i = 0; i < prompts.size(); ++i)
    mixed.push_back(submit_ok(
        *engine_, i % 2 == 0 ? greedy(prompts[i], 24) : with_logprobs(greedy(prompts[i], 24))));
  for (size_t i = 0; i < prompts.size(); ++i) {
    EXPECT_EQ(plain[i].tokens, sampled[i].tokens) << "request " << i;
    EXPECT_EQ(plain[i].text, sampled[i].text) << "request " << i;
    EXPECT_EQ(plain[i].finish.reason, sampled[i].finish.reason) << "request " << i;
    const Result r = drain(mixed[i]);
    EXPECT_EQ(r.tokens, plain[i].tokens) << "request " << i << " in a mixed batch";
  }
}

// Seeded sampled requests (temperature, top-p, penalties) sampled on 4 host threads in one
// batch draw the same tokens as each alone, and as an engine sampling on the engine thread:
// each row's draw is its own sampler's.
TEST(EngineSampling, ParallelHostSamplingDrawsWhatEachRowDrawsAlone) {
  auto make = [](int sample_threads) -> std::unique_ptr<Engine> {
    EngineOptions o = test_options();
    o.sample_threads = sample_threads;
    // An explicit KV budget: on a GPU the default fills --gpu-memory-fraction of the card, and
    // this test holds two engines at once.
    o.kv_memory_bytes = uint64_t{64} << 20;
    return started_engine(o);
  };
  auto sampled = [](std::vector<int32_t> prompt, int i) {
    GenerationRequest r;
    r.prompt_tokens = std::move(prompt);
    r.max_tokens = 24;
    r.sampling.temperature = 0.9f;
    r.sampling.top_p = 0.95f;
    r.sampling.repetition_penalty = 1.1f;
    r.sampling.seed = 1000 + static_cast<uint64_t>(i);
    return r;
  };
  const std::vector<std::vector<int32_t>> prompts = varied_prompts(8);
  auto parallel = make(4), serial = make(1);
  ASSERT_NE(parallel, nullptr);
  ASSERT_NE(serial, nullptr);
  std::vector<Result> alone;
  for (size_t i = 0; i < prompts.size(); ++i)
    alone.push_back(drain(submit_ok(*serial, sampled(prompts[i], static_cast<int>(i)))));
  std::vector<std::shared_ptr<RequestChannel>> chans;
  for (size_t i = 0; i < prompts.size(); ++i)
    chans.push_back(submit_ok(*parallel, sampled(prompts[i], static_cast<int>(i))));
  bool any_differ_from_greedy = false;
  for (size_t i = 0; i < chans.size(); ++i) {
    const Result r = drain(chans[i]);
    EXPECT_EQ(r.tokens, alone[i].tokens) << "request " << i;
    EXPECT_EQ(r.text, alone[i].text) << "request " << i;
    const Result g = drain(submit_ok(*serial, greedy(prompts[i], 24)));
    any_differ_from_greedy |= g.tokens != r.tokens;
  }
  EXPECT_TRUE(any_differ_from_greedy) << "the requests sampled (not all greedy)";
}

TEST_F(EngineTest, StopStringAndPrefixCache) {
  std::ifstream f(kModels + "stories260K.greedy64.nodellamacpp.json");
  const nlohmann::json g = nlohmann::json::parse(f);
  GenerationRequest req = greedy(g["prompt_ids"], 64);
  req.stop = {"Lily"};
  Result r = drain(submit_ok(*engine_, req));
  EXPECT_EQ(r.text, ", there was a little girl named ");
  EXPECT_EQ(r.finish.reason, FinishReason::kStop);
  // A 40-token prompt twice: the second reuses two full blocks and gives the same tokens.
  std::vector<int32_t> p(g["prompt_ids"].begin(), g["prompt_ids"].end());
  for (int v : g["greedy_ids"]) {
    if (p.size() == 40) break;
    p.push_back(v);
  }
  Result a = drain(submit_ok(*engine_, greedy(p, 10)));
  Result b = drain(submit_ok(*engine_, greedy(p, 10)));
  EXPECT_EQ(a.tokens, b.tokens);
  EXPECT_EQ(b.finish.usage.cached_tokens, 32);
}

// A generation that ends by length while the tail is held back as a possible stop-string
// prefix releases it at the end, after the rest: the text equals the run without stops.
// (The engine used to call flush() and feed() in one unsequenced expression, which
// reordered the tail and tripped the matcher's assert: found by the serving soak.)
TEST_F(EngineTest, LengthFinishReleasesHeldStopPrefix) {
  std::ifstream f(kModels + "stories260K.greedy64.nodellamacpp.json");
  const nlohmann::json g = nlohmann::json::parse(f);
  int num_held_at_end = 0;
  for (int32_t n = 1; n <= 16; ++n) {
    Result plain = drain(submit_ok(*engine_, greedy(g["prompt_ids"], n)));
    if (plain.text.find("named Lily") != std::string::npos) break;
    GenerationRequest req = greedy(g["prompt_ids"], n);
    req.stop = {"named Lily", "girl named Tom"};
    Result held = drain(submit_ok(*engine_, req));
    EXPECT_EQ(held.text, plain.text) << n;
    EXPECT_EQ(held.finish.reason, FinishReason::kLength) << n;
    if (plain.text.ends_with(" named") || plain.text.ends_with(" girl")) ++num_held_at_end;
  }
  EXPECT_GE(num_held_at_end, 1);  // the case this test exists for did occur
}

TEST_F(EngineTest, CancelFreesBlocks) {
  std::vector<std::shared_ptr<RequestChannel>> chans;
  for (int i = 0; i < 6; ++i) {
    GenerationRequest r = greedy({1, 403, 407, 261, 378, static_cast<int32_t>(300 + i)}, 200);
    r.sampling.temperature = 0.8f;
    r.sampling.seed = static_cast<uint64_t>(i);
    chans.push_back(submit_ok(*engine_, r));
  }
  for (auto& c : chans) {
    auto e = c->pop(std::chrono::milliseconds(30000));  // first token arrived
    ASSERT_TRUE(e.has_value());
    c->cancel();
  }
  for (auto& c : chans) {
    Result r = drain(c);
    EXPECT_EQ(r.finish.reason, FinishReason::kCancelled);
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  EXPECT_EQ(engine_->stats().num_kv_blocks_used, 0);
}

TEST_F(EngineTest, RefusesBeforeAnyWork) {
  auto too_long = engine_->submit(greedy(std::vector<int32_t>(200, 5), 100));
  ASSERT_TRUE(std::holds_alternative<SubmitRefusal>(too_long));
  EXPECT_EQ(std::get<SubmitRefusal>(too_long).error, SubmitError::kContextLengthExceeded);
  auto bad_token = engine_->submit(greedy({1, 99999}, 4));
  ASSERT_TRUE(std::holds_alternative<SubmitRefusal>(bad_token));
  EXPECT_EQ(std::get<SubmitRefusal>(bad_token).error, SubmitError::kInvalid);
  GenerationRequest bad_temp = greedy({1, 2}, 4);
  bad_temp.sampling.temperature = -1;
  auto r = engine_->submit(bad_temp);
  ASSERT_TRUE(std::holds_alternative<SubmitRefusal>(r));
  EXPECT_NE(std::get<SubmitRefusal>(r).message.find("temperature"), std::string::npos);
}

// Options reachable from the command line are refused with an error naming them, never
// an assertion of the scheduler or the thread pool (issue 13: --max-seqs 0, -t 10000).
TEST(EngineOptionsTest, BadOptionsFailStartWithAnError) {
  struct Case {
    const char* name;
    void (*set)(EngineOptions&);
  };
  const Case cases[] = {
      {"max_seqs", [](EngineOptions& o) { o.max_seqs = 0; }},
      {"max_batch_tokens", [](EngineOptions& o) { o.max_batch_tokens = 0; }},
      {"max_waiting", [](EngineOptions& o) { o.max_waiting = 0; }},
      {"threads", [](EngineOptions& o) { o.threads = 10000; }},
      {"threads", [](EngineOptions& o) { o.threads = -3; }},
      {"sample_threads", [](EngineOptions& o) { o.sample_threads = -1; }},
      {"sample_threads", [](EngineOptions& o) { o.sample_threads = 5000; }},
      {"n_ctx", [](EngineOptions& o) { o.n_ctx = -5; }},
      {"step_prompt_tokens", [](EngineOptions& o) { o.step_prompt_tokens = -1; }},
      {"state_checkpoint_blocks", [](EngineOptions& o) { o.state_checkpoint_blocks = 0; }},
      {"state_snapshots", [](EngineOptions& o) { o.state_snapshots = -2; }},
  };
  for (const Case& c : cases) {
    EngineOptions o;
    o.model_path = kModels + "stories260K.gguf";
    c.set(o);
    Engine engine(o);
    engine.start();
    Status st = engine.wait_ready();
    ASSERT_FALSE(st.ok()) << c.name;
    EXPECT_NE(st.error().message.find(c.name), std::string::npos) << st.error().message;
    EXPECT_EQ(engine.state(), EngineState::kFailed);
    engine.stop();
  }
}

}  // namespace
}  // namespace kiln::engine
