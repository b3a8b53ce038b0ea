#include "serving_node/core/window_stats.h"

#include "gtest/gtest.h"

namespace hlem::serving {
namespace {

MemoryCounters At(int64_t seconds) {
  MemoryCounters c;
  c.at = absl::UnixEpoch() + absl::Seconds(seconds);
  return c;
}

TEST(WindowAggregatorTest, RatesAreWindowDeltasAsTheArchitectureDefinesThem) {
  WindowAggregator agg(/*keep=*/2);
  MemoryCounters a = At(0);
  a.kv_lookups = 10;
  a.kv_lookup_hits = 5;
  a.kv_tokens_requested = 1000;
  a.kv_tokens_reused = 400;
  a.emb_rows = 100;
  a.emb_hits = 50;
  a.link_busy_ns = 1'000'000'000;
  a.refill_bytes = 10;
  agg.Start(a);

  MemoryCounters b = At(5);
  b.kv_lookups = 20;               // 10 lookups in the window
  b.kv_lookup_hits = 12;           // 7 of them reused something
  b.kv_tokens_requested = 3000;    // 2000 tokens requested
  b.kv_tokens_reused = 1900;       // 1500 reused
  b.emb_rows = 300;                // 200 rows
  b.emb_hits = 200;                // 150 hits
  b.link_busy_ns = 3'500'000'000;  // 2.5 s of a 5 s window
  b.refill_bytes = 4096 + 10;
  b.kv_bytes = 7;
  b.alpha_target = 0.4;
  b.alpha_effective = 0.3;
  MemoryWindow w = agg.Close(b);
  EXPECT_EQ(w.index, 0u);
  EXPECT_EQ(w.duration, absl::Seconds(5));
  EXPECT_EQ(w.kv_requests, 10u);
  EXPECT_DOUBLE_EQ(w.kv_hit_rate, 0.75);
  EXPECT_DOUBLE_EQ(w.kv_user_hit_rate, 0.7);
  EXPECT_EQ(w.emb_rows, 200u);
  EXPECT_DOUBLE_EQ(w.emb_hit_rate, 0.75);
  EXPECT_DOUBLE_EQ(w.link_utilisation, 0.5);
  EXPECT_EQ(w.refill_bytes, 4096u);
  EXPECT_EQ(w.kv_bytes, 7u);
  EXPECT_DOUBLE_EQ(w.alpha_target, 0.4);
  EXPECT_DOUBLE_EQ(w.alpha_effective, 0.3);
}

TEST(WindowAggregatorTest, EmptyWindowsReportZeroAndOnlyTheLastAreKept) {
  WindowAggregator agg(/*keep=*/2);
  agg.Start(At(0));
  for (int i = 1; i <= 3; ++i) {
    MemoryWindow w = agg.Close(At(5 * i));
    EXPECT_EQ(w.kv_requests, 0u);
    EXPECT_DOUBLE_EQ(w.kv_hit_rate, 0);
    EXPECT_DOUBLE_EQ(w.emb_hit_rate, 0);
  }
  auto recent = agg.Recent();
  ASSERT_EQ(recent.size(), 2u);
  EXPECT_EQ(recent[0].index, 1u);
  EXPECT_EQ(recent[1].index, 2u);
  EXPECT_EQ(recent[1].start, absl::UnixEpoch() + absl::Seconds(10));
}

TEST(WindowAggregatorTest, UtilisationIsCappedAndResetSourcesCountFromZero) {
  WindowAggregator agg;
  MemoryCounters a = At(0);
  a.link_busy_ns = 50;
  a.kv_lookups = 100;
  agg.Start(a);
  MemoryCounters b = At(1);
  b.link_busy_ns = 5'000'000'000;  // more than the window: capped
  b.kv_lookups = 3;                // the source restarted
  MemoryWindow w = agg.Close(b);
  EXPECT_DOUBLE_EQ(w.link_utilisation, 1.0);
  EXPECT_EQ(w.kv_requests, 3u);
}

}  // namespace
}  // namespace hlem::serving
