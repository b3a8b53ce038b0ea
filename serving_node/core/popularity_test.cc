#include "serving_node/core/popularity.h"

#include <algorithm>
#include <iostream>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "common/rng.h"
#include "common/zipf.h"
#include "gtest/gtest.h"

namespace hlem::serving {
namespace {

std::unique_ptr<PopularitySketch> MakeSketch(PopularityOptions options) {
  auto s = PopularitySketch::Create(options);
  EXPECT_TRUE(s.ok()) << s.status();
  return std::move(s).value();
}

// Share of `want` keys (table, row) found in the sketch's top k.
double Recall(const PopularitySketch& sketch, uint32_t k,
              const absl::flat_hash_set<std::pair<uint32_t, uint64_t>>& want) {
  uint32_t found = 0;
  for (const PopularRow& p : sketch.TopK(k)) found += want.contains({p.table_id, p.row});
  return static_cast<double>(found) / want.size();
}

TEST(PopularitySketchTest, RejectsBadOptions) {
  EXPECT_EQ(PopularitySketch::Create({.capacity = 0}).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(PopularitySketch::Create({.sample_one_in = 0}).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(PopularitySketch::Create({.decay_factor = 0}).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(PopularitySketch::Create({.decay_factor = 1.5}).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(PopularitySketchTest, ExactWhileEveryKeyFits) {
  auto sketch = MakeSketch({.capacity = 16, .decay_factor = 1});
  for (int i = 0; i < 5; ++i) sketch->Record(1, 7);
  for (int i = 0; i < 3; ++i) sketch->Record(2, 7);  // another table, same row id
  std::vector<uint64_t> rows = {9, 9, 8};
  sketch->RecordBatch(1, rows);
  std::vector<PopularRow> top = sketch->TopK(10);
  ASSERT_EQ(top.size(), 4u);
  EXPECT_EQ(top[0].table_id, 1u);
  EXPECT_EQ(top[0].row, 7u);
  EXPECT_EQ(top[0].count, 5);
  EXPECT_EQ(top[1].table_id, 2u);
  EXPECT_EQ(top[1].count, 3);
  EXPECT_EQ(top[2].row, 9u);
  EXPECT_EQ(top[2].count, 2);
  EXPECT_EQ(top[3].row, 8u);
  EXPECT_EQ(top[3].error, 0);
  EXPECT_EQ(sketch->TopK(1).size(), 1u);
  PopularityStats s = sketch->GetStats();
  EXPECT_EQ(s.accesses, 11u);
  EXPECT_EQ(s.samples, 11u);
  EXPECT_EQ(s.tracked, 4u);
  EXPECT_EQ(s.replacements, 0u);
}

TEST(PopularitySketchTest, FindsTheTopKeysOfAZipfStream) {
  constexpr uint64_t kSeed = 7;
  Rng rng(kSeed);
  ZipfSampler zipf(1000000, 1.0);
  auto sketch = MakeSketch({.capacity = 2000, .sample_one_in = 4, .decay_every_samples = 1 << 30});
  absl::flat_hash_map<std::pair<uint32_t, uint64_t>, uint64_t> exact;
  constexpr int kAccesses = 2000000;
  std::vector<uint64_t> batch;
  for (int i = 0; i < kAccesses; ++i) {
    const uint64_t rank = zipf(rng);
    const uint32_t table = rank % 3;
    const uint64_t row = Mix64(rank) >> 24;  // popularity not by row id
    ++exact[{table, row}];
    if (i % 2 == 0) {
      sketch->Record(table, row);
    } else {
      batch.assign(1, row);
      sketch->RecordBatch(table, batch);
    }
  }
  std::vector<std::pair<uint64_t, std::pair<uint32_t, uint64_t>>> by_count;
  for (const auto& [key, n] : exact) by_count.emplace_back(n, key);
  std::partial_sort(by_count.begin(), by_count.begin() + 100, by_count.end(),
                    [](const auto& a, const auto& b) {
                      // Ties by key, so the set does not depend on hash-map order.
                      return a.first != b.first ? a.first > b.first : a.second < b.second;
                    });
  absl::flat_hash_set<std::pair<uint32_t, uint64_t>> top100;
  for (int i = 0; i < 100; ++i) top100.insert(by_count[i].second);
  const double recall = Recall(*sketch, 100, top100);
  PopularityStats s = sketch->GetStats();
  std::cout << "zipf 1.0, 1e6 keys, 2e6 accesses, 1 in 4 sampled, 2000 counters: top-100 recall "
            << recall << " samples " << s.samples << "\n";
  EXPECT_GE(recall, 0.9);
  EXPECT_NEAR(static_cast<double>(s.samples) / kAccesses, 0.25, 0.01);
  // The estimate of the hottest key is close to its true count.
  const PopularRow hottest = sketch->TopK(1)[0];
  EXPECT_EQ(std::make_pair(hottest.table_id, hottest.row), by_count[0].second);
  EXPECT_NEAR(hottest.count, static_cast<double>(by_count[0].first), 0.05 * by_count[0].first);
}

TEST(PopularitySketchTest, DecayLetsANewHotSetTakeOver) {
  // Two phases of a uniform hot set of 100 keys over background noise; the second phase is a
  // quarter as long as the first.
  auto run = [](double decay_factor) {
    Rng rng(3);
    auto sketch =
        MakeSketch({.capacity = 500, .decay_every_samples = 4000, .decay_factor = decay_factor});
    auto phase = [&](uint64_t base, int accesses) {
      for (int i = 0; i < accesses; ++i) {
        if (rng() % 2 == 0) {
          sketch->Record(0, base + rng() % 100);
        } else {
          sketch->Record(0, 1000000 + rng() % 100000);  // noise
        }
      }
    };
    phase(0, 200000);
    phase(5000, 50000);
    absl::flat_hash_set<std::pair<uint32_t, uint64_t>> second;
    for (uint64_t r = 5000; r < 5100; ++r) second.insert({0u, r});
    return Recall(*sketch, 100, second);
  };
  const double with_decay = run(0.5);
  const double without = run(1.0);
  std::cout << "new hot set in the top 100: with decay " << with_decay << ", without " << without
            << "\n";
  EXPECT_GE(with_decay, 0.95);
  EXPECT_LE(without, 0.5);
}

}  // namespace
}  // namespace hlem::serving
