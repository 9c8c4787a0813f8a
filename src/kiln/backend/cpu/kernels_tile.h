// The tiling driver shared by the SIMD paths: include it inside a file's target region so
// the templates compile for that instruction set. Not a public header.
//
// A kernel K provides kRows, kTokens, a Panel type with `void prepare(const GemmArgs&,
// int64_t row0, int num_rows)` (weights unpacked once per row tile and token chunk, e.g.
// K-quant nibbles and scales; empty for kernels that read the blocks directly) and
// `template <int R, int T> static void tile(const GemmArgs&, const Panel&, int64_t row0,
// int64_t token0)` computing rows [row0, row0 + R) for tokens [token0, token0 + T) over the
// whole reduction. A kernel may also provide kHasGemv, kGemvMaxTokens and `static void
// gemv(const GemmArgs&)` for n_tokens <= kGemvMaxTokens (decode and small decode batches),
// which must compute the same operations as tile (it only skips the panel), and
// kSingleRowTokens: up to that many tokens, 1-row tiles only. Every instantiation performs
// the same per-(row, token) arithmetic, so the
// result never depends on R, T or the tiling below.
// Included inside an anonymous namespace (internal linkage per instruction set): no
// include guard, no namespace of its own.

// Calls f.template operator()<n>() for a runtime n in [1, N] (nothing otherwise): turns a
// tail count of tokens into a compile-time tile size.
template <int N, class F>
inline void with_count(int64_t n, F&& f) {
  if constexpr (N > 0) {
    if (n == N) {
      f.template operator()<N>();
    } else {
      with_count<N - 1>(n, f);
    }
  }
}

template <class K, int R>
inline void row_tile(const GemmArgs& g, typename K::Panel& p, int64_t r, int64_t tb, int64_t te) {
  p.prepare(g, r, R);
  int64_t t = tb;
  for (; t + K::kTokens <= te; t += K::kTokens) K::template tile<R, K::kTokens>(g, p, r, t);
  with_count<K::kTokens - 1>(te - t, [&]<int T>() { K::template tile<R, T>(g, p, r, t); });
}

// Tokens go in chunks whose activations stay in L2 while the row tiles of [row_begin,
// row_end) stream past them; each row tile is reused from L1 across the chunk's token tiles.
// n_tokens = 1 is the GEMV case: each weight row is read once.
template <class K>
void gemm(const GemmArgs& g) {
  constexpr int64_t kTokenChunk = 64;
  if constexpr (requires { K::kHasGemv; }) {
    if (K::kHasGemv && g.n_tokens <= K::kGemvMaxTokens) {
      K::gemv(g);
      return;
    }
  }
  thread_local typename K::Panel panel;  // grown once per thread, reused
  for (int64_t tb = 0; tb < g.n_tokens; tb += kTokenChunk) {
    const int64_t te = tb + kTokenChunk < g.n_tokens ? tb + kTokenChunk : g.n_tokens;
    int64_t r = g.row_begin;
    bool single_rows = false;  // rows one at a time: one sequential stream of weights
    if constexpr (requires { K::kSingleRowTokens; })
      single_rows = g.n_tokens <= K::kSingleRowTokens;
    if (!single_rows) {
      for (; r + K::kRows <= g.row_end; r += K::kRows) row_tile<K, K::kRows>(g, panel, r, tb, te);
    }
    for (; r < g.row_end; ++r) row_tile<K, 1>(g, panel, r, tb, te);
  }
}
