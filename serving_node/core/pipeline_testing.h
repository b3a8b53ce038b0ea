#pragma once
// Tests only: a fake row source and a fake model runner whose scores the test can recompute from
// the tables (pipeline and node tests).

#include <atomic>
#include <cstdint>
#include <span>
#include <stdexcept>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "common/rng.h"
#include "gtest/gtest.h"
#include "serving_node/core/model_runner.h"
#include "serving_node/core/pipeline.h"
#include "serving_node/core/row_source.h"

namespace hlem::serving::testing {

constexpr uint32_t kDim = 8;
constexpr uint64_t kPageBytes = 4 << 10;  // 1 layer · 2 · 8 floats = 64 B a token: 64 tokens

inline float RowValue(uint32_t table, uint64_t row, uint32_t d) {
  return static_cast<float>(static_cast<double>(KeyedHash(table, row, d) % 2001) / 1000.0 - 1.0);
}

class FakeRowSource final : public RowSource {
 public:
  absl::Status Fetch(uint32_t table_id, std::span<const uint64_t> rows, std::span<std::byte> out,
                     absl::Time) override {
    const int call = fetches++;
    fetched_rows += rows.size();
    if (fail || (fail_from_call >= 0 && call >= fail_from_call)) {
      return absl::UnavailableError("shard down");
    }
    float* f = reinterpret_cast<float*>(out.data());
    for (size_t r = 0; r < rows.size(); ++r) {
      for (uint32_t d = 0; d < kDim; ++d) f[r * kDim + d] = RowValue(table_id, rows[r], d);
    }
    return absl::OkStatus();
  }
  std::atomic<int> fetches{0};
  std::atomic<uint64_t> fetched_rows{0};
  std::atomic<bool> fail{false};
  std::atomic<int> fail_from_call{-1};  // fail every Fetch from this call number on
};

// A model whose scores depend on every history token's cached K and on the candidates, so the
// test can recompute them from the tables: K of a token = its input embedding, V = -K;
// score(c) = Σ_history Σ_d K[t][d] · cand[d] + Σ_d cand[d].
class FakeRunner final : public ModelRunner {
 public:
  uint32_t dim() const override { return kDim; }
  uint32_t targets() const override { return 1; }
  uint32_t layers() const override { return 1; }
  uint32_t kv_dim() const override { return kDim; }
  uint32_t max_positions() const override { return 1024; }
  absl::Status Run(std::span<const ModelStep> steps) override {
    {
      absl::MutexLock lock(&gate_mu);
      gate_mu.Await(absl::Condition(&gate_open));
    }
    ++batches;
    if (throw_next.exchange(false)) throw std::runtime_error("the fake runner threw");
    for (const ModelStep& s : steps) {
      const KvGeometry& g = s.kv.geometry;
      auto at = [&](uint64_t t, KvPart part) {
        return reinterpret_cast<float*>(s.kv.pool + s.kv.page_offsets[t / g.page_tokens] +
                                        g.OffsetInPage(0, part, t % g.page_tokens));
      };
      const uint64_t n = s.new_history_emb.size() / kDim;
      for (uint64_t i = 0; i < n; ++i) {
        for (uint32_t d = 0; d < kDim; ++d) {
          at(s.cached_len + i, KvPart::kKey)[d] = s.new_history_emb[i * kDim + d];
          at(s.cached_len + i, KvPart::kValue)[d] = -s.new_history_emb[i * kDim + d];
        }
      }
      const uint64_t C = s.candidate_emb.size() / kDim;
      for (uint64_t c = 0; c < C; ++c) {
        double score = 0;
        for (uint32_t d = 0; d < kDim; ++d) score += s.candidate_emb[c * kDim + d];
        for (uint64_t t = 0; t < s.cached_len + n; ++t) {
          for (uint32_t d = 0; d < kDim; ++d) {
            score += double{at(t, KvPart::kKey)[d]} * s.candidate_emb[c * kDim + d];
          }
        }
        s.scores[c] = static_cast<float>(score);
      }
      ++runs;
    }
    return absl::OkStatus();
  }
  void SetGate(bool open) {
    absl::MutexLock lock(&gate_mu);
    gate_open = open;
  }
  std::atomic<int> runs{0};             // steps
  std::atomic<int> batches{0};          // Run calls
  std::atomic<bool> throw_next{false};  // the next Run throws (libtorch throws c10::Error)
  absl::Mutex gate_mu;
  bool gate_open = true;  // Run waits while false (tests of the queue)
};

// Two features per token: item (table 0, 1000 rows) and category (table 1, 50 rows).
inline const std::vector<FeatureSpec> kFeatures = {{.table_id = 0, .rows = 1000},
                                                   {.table_id = 1, .rows = 50}};

inline std::vector<float> Embedding(std::span<const uint64_t> ids, size_t token) {
  std::vector<float> e(kDim, 0.0f);
  for (size_t f = 0; f < kFeatures.size(); ++f) {
    for (uint32_t d = 0; d < kDim; ++d)
      e[d] += RowValue(kFeatures[f].table_id, ids[token * 2 + f], d);
  }
  return e;
}

// What FakeRunner must answer for a history window and candidates, from the tables directly.
inline std::vector<float> Expected(std::span<const uint64_t> window,
                                   std::span<const uint64_t> cand) {
  std::vector<float> out;
  for (size_t c = 0; c < cand.size() / 2; ++c) {
    const std::vector<float> ce = Embedding(cand, c);
    double score = 0;
    for (float v : ce) score += v;
    for (size_t t = 0; t < window.size() / 2; ++t) {
      const std::vector<float> te = Embedding(window, t);
      for (uint32_t d = 0; d < kDim; ++d) score += double{te[d]} * ce[d];
    }
    out.push_back(static_cast<float>(score));
  }
  return out;
}

inline void ExpectNear(const std::vector<float>& got, const std::vector<float>& want) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) EXPECT_NEAR(got[i], want[i], 1e-3) << i;
}

// n random events of kFeatures (item < 1000, category < 50), event-major.
inline std::vector<uint64_t> RandomEvents(Rng& rng, size_t n) {
  std::vector<uint64_t> ids;
  for (size_t i = 0; i < n; ++i) {
    ids.push_back(rng() % 1000);
    ids.push_back(rng() % 50);
  }
  return ids;
}

}  // namespace hlem::serving::testing
