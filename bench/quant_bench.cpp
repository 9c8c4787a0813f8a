// Reference (scalar) dequantize and quantize throughput per GGUF type.
// bytes_per_second counts the quantized bytes: read by dequantize_row, written by quantize_row.
// The scalar reference is not the fast path; these figures are the baseline that the SIMD
// kernels of a later issue are measured against.
#include <benchmark/benchmark.h>

#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "kiln/quant/convert.h"
#include "kiln/quant/types.h"

namespace {

using kiln::quant::Type;

constexpr int64_t kRowElems = 256 * 256;  // 64K weights: a few tens to 256 KB quantized

std::vector<float> random_row() {
  std::mt19937 rng(1);
  std::normal_distribution<float> g(0.0f, 1.0f);
  std::vector<float> x(kRowElems);
  for (float& v : x) v = g(rng);
  return x;
}

void bm_dequantize(benchmark::State& state, Type type) {
  const auto x = random_row();
  const uint64_t num_bytes = *kiln::quant::row_bytes(type, kRowElems);
  std::vector<uint8_t> q(num_bytes);
  if (!kiln::quant::quantize_row(type, x.data(), q.data(), kRowElems).ok()) {
    state.SkipWithError("quantize failed");
    return;
  }
  std::vector<float> y(kRowElems);
  for (auto _ : state) {
    auto s = kiln::quant::dequantize_row(type, q.data(), y.data(), kRowElems);
    benchmark::DoNotOptimize(y.data());
    benchmark::ClobberMemory();
    if (!s.ok()) state.SkipWithError(s.error().message.c_str());
  }
  state.SetBytesProcessed(state.iterations() * static_cast<int64_t>(num_bytes));
  state.SetItemsProcessed(state.iterations() * kRowElems);  // weights per second
}

void bm_quantize(benchmark::State& state, Type type) {
  const auto x = random_row();
  const uint64_t num_bytes = *kiln::quant::row_bytes(type, kRowElems);
  std::vector<uint8_t> q(num_bytes);
  for (auto _ : state) {
    auto s = kiln::quant::quantize_row(type, x.data(), q.data(), kRowElems);
    benchmark::DoNotOptimize(q.data());
    benchmark::ClobberMemory();
    if (!s.ok()) state.SkipWithError(s.error().message.c_str());
  }
  state.SetBytesProcessed(state.iterations() * static_cast<int64_t>(num_bytes));
  state.SetItemsProcessed(state.iterations() * kRowElems);
}

}  // namespace

int main(int argc, char** argv) {
  const Type types[] = {Type::F32,  Type::F16,  Type::BF16, Type::Q4_0,   Type::Q4_1,  Type::Q5_0,
                        Type::Q5_1, Type::Q8_0, Type::Q8_1, Type::Q2_K,   Type::Q3_K,  Type::Q4_K,
                        Type::Q5_K, Type::Q6_K, Type::Q8_K, Type::IQ4_NL, Type::IQ4_XS};
  for (Type t : types) {
    const std::string name(kiln::quant::type_name(t));
    benchmark::RegisterBenchmark(("dequantize/" + name).c_str(), bm_dequantize, t);
  }
  for (Type t : types) {
    const std::string name(kiln::quant::type_name(t));
    benchmark::RegisterBenchmark(("quantize/" + name).c_str(), bm_quantize, t);
  }
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
