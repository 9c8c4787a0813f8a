// kiln bench's measurements (cli/bench_report prints them): prompt-processing and generation
// speed like llama-bench, after a context of --depth tokens (llama-bench's -d), over P
// sequences decoding together (--parallel, llama-batched-bench's S_TG), and the roofline of a
// decode step (--roofline): per class of matmul, the bytes it reads, its time, the GB/s it
// achieves and its fraction of the device's copy bandwidth measured in the same run.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "kiln/backend/backend.h"
#include "kiln/engine/executor.h"
#include "kiln/model/model.h"
#include "kiln/util/status.h"

namespace kiln::engine {

// One test of a run ("pp512", "tg128 @ d32768", "tg128 x8 @ d32768"): tokens per second of
// each timed repetition.
struct BenchFigure {
  std::string test;
  int32_t n_tokens = 0;  // tokens one repetition times: the test's, times n_seqs
  std::vector<double> tok_per_s;
  bool gen = false;     // generation (tg), else prompt processing (pp)
  int32_t n_depth = 0;  // context tokens before the test, per sequence
  int32_t n_seqs = 1;   // sequences run together
};

// The name llama-bench gives a test ("pp512", "tg128 @ d32768"), with " xP" after the count
// for P > 1 sequences ("tg128 x8 @ d32768").
std::string bench_test_name(bool gen, int32_t n, int32_t n_seqs, int32_t depth);

struct BenchPlan {
  int32_t n_prompt = 512;  // 0: no pp test
  int32_t n_gen = 128;     // 0: no tg test
  int32_t reps = 3;        // timed repetitions of each test, after one warm-up
  int32_t batch = 512;     // rows per prefill step (the context's and pp's)
  int32_t depth = 0;       // context tokens of each sequence before each test
  int32_t parallel = 1;    // sequences run together
  quant::Type kv_type = quant::Type::F16;
  bool roofline = false;                    // needs n_gen > 0
  int32_t roofline_steps = 16;              // profiled decode steps, after two unprofiled ones
  uint64_t copy_bytes = uint64_t{1} << 30;  // the copy that measures the copy bandwidth
  bool graphs = ExecutorOptions::graphs_default();
  model::MeshShape mesh;  // --tp / --pp / --ep
};

// One row of the roofline: figures per decode step.
struct RooflineRow {
  std::string label;
  double calls = 0;  // ops per step
  double bytes = 0;  // bytes the ops must read per step (0: not counted)
  double us = 0;     // time per step
  double gb_per_s() const { return us > 0 ? bytes / us / 1e3 : 0; }
};

struct Roofline {
  int32_t n_seqs = 1;
  int32_t depth = 0;
  int32_t steps = 0;                   // profiled steps
  double copy_gbs = 0;                 // the device's copy bandwidth: read + written, GB/s
  uint64_t copy_bytes = 0;             // of each timed copy
  double kv_bytes_per_token = 0;       // per sequence, all layers, K and V
  std::vector<RooflineRow> classes;    // matmul, matmuls groups, moe: the longest first
  RooflineRow matmuls;                 // the classes' sum
  RooflineRow attention;               // bytes: the KV cache the step reads
  RooflineRow other;                   // the eager step's wall time minus the profiled ops
  RooflineRow eager_step;              // wall time of a profiled step; bytes: matmuls + KV
  std::optional<RooflineRow> tg_step;  // the tg figure's time per step ("step (graphs)")
  double percent_of_copy(const RooflineRow& r) const {
    return copy_gbs > 0 ? 100.0 * r.gb_per_s() / copy_gbs : 0;
  }
};

struct BenchResult {
  std::vector<BenchFigure> figures;
  std::optional<Roofline> roofline;
};

// Runs the plan's tests: pp (the P prompts after their contexts, in steps of `batch` rows),
// tg (n_gen decode steps of one token per sequence, each step's logits back on the host), each
// repetition after the same contexts (prefilled once, untimed; each repetition truncates back
// to them); then, with roofline, the copy bandwidth and the profiled eager decode steps.
Expected<BenchResult> run_bench(const model::Model& model, backend::Backend& be,
                                const BenchPlan& plan);

// The device's copy bandwidth in GB/s, counted as read + written (2 x bytes / time): the
// median of 5 timed copies between two buffers of backend memory, after a warm-up, each timed
// by the backend's profiling (its wall time with a sync where the backend has none). *bytes
// (in: the copy wanted) is cut to an eighth of the free memory (the two buffers: a quarter).
Expected<double> copy_bandwidth_gbs(backend::Backend& be, uint64_t* bytes);

}  // namespace kiln::engine
