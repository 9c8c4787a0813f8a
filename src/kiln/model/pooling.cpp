#include "kiln/model/pooling.h"

#include <algorithm>
#include <cmath>

namespace kiln::model {

std::string_view pooling_name(Pooling p) {
  switch (p) {
    case Pooling::kNone:
      return "none";
    case Pooling::kMean:
      return "mean";
    case Pooling::kCls:
      return "cls";
    case Pooling::kLast:
      return "last";
    case Pooling::kRank:
      return "rank";
  }
  return "?";
}

Expected<Pooling> parse_pooling(std::string_view name) {
  for (uint32_t i = 0; i <= kMaxPooling; ++i)
    if (pooling_name(static_cast<Pooling>(i)) == name) return static_cast<Pooling>(i);
  return err("unknown pooling '{}' (none, mean, cls, last, rank)", name);
}

void PoolAccumulator::wanted_rows(Pooling pooling, int32_t first, int32_t n, int32_t num_tokens,
                                  int32_t row0, std::vector<int32_t>* rows) {
  switch (pooling) {
    case Pooling::kMean:
      for (int32_t i = 0; i < n; ++i) rows->push_back(row0 + i);
      break;
    case Pooling::kCls:
      if (first == 0 && n > 0) rows->push_back(row0);
      break;
    case Pooling::kLast:
      if (first + n == num_tokens && n > 0) rows->push_back(row0 + n - 1);
      break;
    case Pooling::kNone:
    case Pooling::kRank:
      break;
  }
}

void PoolAccumulator::reset() {
  sum_.assign(static_cast<size_t>(width_), 0.0);
  num_rows_ = 0;
}

void PoolAccumulator::add(std::span<const float> row) {
  if (sum_.size() != static_cast<size_t>(width_)) reset();
  const size_t w = std::min(row.size(), sum_.size());
  if (pooling_ == Pooling::kMean) {
    for (size_t i = 0; i < w; ++i) sum_[i] += row[i];
  } else {
    for (size_t i = 0; i < w; ++i) sum_[i] = row[i];
  }
  ++num_rows_;
}

std::vector<float> PoolAccumulator::result() const {
  if (num_rows_ == 0) return {};
  const double scale = pooling_ == Pooling::kMean ? 1.0 / static_cast<double>(num_rows_) : 1.0;
  std::vector<float> out(sum_.size());
  for (size_t i = 0; i < sum_.size(); ++i) out[i] = static_cast<float>(sum_[i] * scale);
  return out;
}

void l2_normalize(std::span<float> x) {
  double ss = 0;
  for (float v : x) ss += static_cast<double>(v) * v;
  const double norm = std::max(std::sqrt(ss), 1e-12);
  for (float& v : x) v = static_cast<float>(v / norm);
}

}  // namespace kiln::model
