#pragma once
// Tests only: one serving node's memory system and pipeline on the cpu device (a fast link) over a
// given model and row source, with every feature table of the model's row width.

#include <algorithm>
#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "common/clock.h"
#include "gtest/gtest.h"
#include "serving_node/core/emb_cache.h"
#include "serving_node/core/hbm_pool.h"
#include "serving_node/core/kv_cache.h"
#include "serving_node/core/pipeline.h"
#include "serving_node/device/cpu_device.h"

namespace hlem::serving::testing {

struct TestNode {
  TestNode(ModelRunner& model, RowSource& source, Clock& clock, std::vector<FeatureSpec> features,
           uint32_t max_history) {
    constexpr uint64_t kPageBytes = 32 << 10;
    constexpr uint32_t kPages = 128;
    pool = *HbmPool::Create({.pool_bytes = kPages * kPageBytes, .page_bytes = kPageBytes});
    device =
        *CpuDevice::Create({.pool_bytes = kPages * kPageBytes,
                            .link = {.bytes_per_second = 1e10, .latency = absl::Microseconds(1)}},
                           clock);
    kv = *KvCache::Create({.layers = model.layers(),
                           .kv_dim = model.kv_dim(),
                           .dtype_bytes = 4,
                           .budget_pages = kPages / 2},
                          *pool, nullptr, clock);
    EmbCacheOptions emb_options{.budget_pages = kPages / 4};
    for (const FeatureSpec& f : features) {
      emb_options.tables.push_back({f.table_id, model.dim() * 4});
    }
    emb = *EmbCache::Create(emb_options, *pool, clock);
    auto p = Pipeline::Create({.features = std::move(features), .max_history = max_history}, *kv,
                              *emb, *device, device->pool_data(), source, model, nullptr, clock);
    EXPECT_TRUE(p.ok()) << p.status();
    if (p.ok()) pipeline = std::move(*p);
  }
  std::unique_ptr<HbmPool> pool;
  std::unique_ptr<KvCache> kv;
  std::unique_ptr<EmbCache> emb;
  std::unique_ptr<CpuDevice> device;  // destroyed before the caches (late completions)
  std::unique_ptr<Pipeline> pipeline;
};

// Scores of a warm node against a fresh node's, within 1e-4 relative.
inline void ExpectScoresNear(const std::vector<float>& got, const std::vector<float>& want,
                             const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t i = 0; i < want.size(); ++i) {
    EXPECT_NEAR(got[i], want[i], 1e-4 * std::max(1.0f, std::abs(want[i])))
        << what << " score " << i;
  }
}

}  // namespace hlem::serving::testing
