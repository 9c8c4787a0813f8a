// Engines for the tests: one started on given options (started_engine), and one on a Hugging
// Face fixture (tests/fixtures/hf/<name>) converted to F32 by kiln convert. The fixtures have no
// tokenizer and the engine wants one: 256 SentencePiece byte tokens (bos 1, eos 2) are written
// beside the weights.
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <memory>
#include <string>

#include <fmt/format.h>

#include "kiln/engine/engine.h"
#include "kiln/model/convert/hf_to_gguf.h"
#include "kiln/tokenizer/gguf_vocab.h"

namespace kiln::engine {

// An engine on options `o`, started and ready; null, with a test failure, when it does not start.
inline std::unique_ptr<Engine> started_engine(const EngineOptions& o) {
  auto e = std::make_unique<Engine>(o);
  e->start();
  const Status ready = e->wait_ready();
  if (!ready.ok()) {
    ADD_FAILURE() << "engine not ready: " << ready.error().message;
    return nullptr;
  }
  return e;
}

// `o` holds every option but model_path (a temporary file, removed once the engine has loaded
// it). Null, with a test failure, when conversion or start fails.
inline std::unique_ptr<Engine> start_fixture_engine(const std::string& fixture, EngineOptions o) {
  const std::string path = (std::filesystem::temp_directory_path() /
                            ("kiln_fixture_" + std::to_string(::getpid()) + ".gguf"))
                               .string();
  model::ConvertOptions co;
  co.hf_dir = fixture;
  co.type = "f32";
  auto w = model::convert_hf(co);
  if (!w.ok()) {
    ADD_FAILURE() << w.error().message;
    return nullptr;
  }
  tokenizer::VocabData vocab;
  vocab.model = "llama";
  for (int b = 0; b < 256; ++b) {
    vocab.tokens.push_back(fmt::format("<0x{:02X}>", b));
    vocab.token_type.push_back(static_cast<int32_t>(tokenizer::TokenType::kByte));
    vocab.scores.push_back(0.0f);
  }
  vocab.bos_id = 1;
  vocab.eos_id = 2;
  tokenizer::write_vocab(*w, vocab);
  if (!w->write_file(path).ok()) {
    ADD_FAILURE() << "cannot write " << path;
    return nullptr;
  }
  o.model_path = path;
  std::unique_ptr<Engine> e = started_engine(o);
  std::filesystem::remove(path);
  return e;
}

}  // namespace kiln::engine
