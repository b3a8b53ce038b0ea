#include "serving_node/core/residency_tracker.h"

#include <vector>

#include "common/clock.h"
#include "gtest/gtest.h"
#include "serving_node/core/emb_cache_testing.h"

namespace hlem::serving {
namespace {

// Residency shards of 4 rows (OneTable), 4 windows of horizon.
class ResidencyTrackerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    pool_ = testing::MakePool(8, 4096);
    cache_ = testing::MakeCache(*pool_, clock_, testing::OneTable(256, 8));
    tracker_ = *ResidencyTracker::Create(
        {.residency_shard_rows = 4, .windows = 4, .threshold = 0.5}, *cache_, &events_);
  }
  void Hold(std::vector<uint64_t> rows) {
    for (uint64_t r : rows) ASSERT_TRUE(cache_->Insert(0, r).ok());
  }
  std::vector<ResidencyEvent> Events() { return *events_.Since(1); }

  SimClock clock_;
  ResidencyEventLog events_{3, 1024};
  std::unique_ptr<HbmPool> pool_;
  std::unique_ptr<EmbCache> cache_;
  std::unique_ptr<ResidencyTracker> tracker_;
};

TEST_F(ResidencyTrackerTest, RejectsBadOptions) {
  EXPECT_FALSE(ResidencyTracker::Create({.residency_shard_rows = 0}, *cache_, nullptr).ok());
  EXPECT_FALSE(ResidencyTracker::Create({.windows = 0}, *cache_, nullptr).ok());
  EXPECT_FALSE(ResidencyTracker::Create({.threshold = 0}, *cache_, nullptr).ok());
  EXPECT_FALSE(ResidencyTracker::Create({.threshold = 1.5}, *cache_, nullptr).ok());
}

TEST_F(ResidencyTrackerTest, CountsDistinctRowsLookedUpInTheHorizon) {
  std::vector<uint64_t> rows = {0, 1, 1, 2, 9};
  tracker_->Record(0, rows);
  tracker_->Record(0, rows);  // the same rows again: still 3 distinct rows of shard 0
  EXPECT_EQ(tracker_->LookedUpRows(0, 0), 3u);
  EXPECT_EQ(tracker_->LookedUpRows(0, 2), 1u);
  tracker_->CloseWindow();
  std::vector<uint64_t> again = {2, 3};
  tracker_->Record(0, again);  // row 2 moves to this window, row 3 is new
  EXPECT_EQ(tracker_->LookedUpRows(0, 0), 4u);
  for (int i = 0; i < 3; ++i) tracker_->CloseWindow();
  // Rows 0 and 1 were last seen 4 windows ago: out of the horizon; 2 and 3 still in.
  EXPECT_EQ(tracker_->LookedUpRows(0, 0), 2u);
  tracker_->CloseWindow();
  EXPECT_EQ(tracker_->LookedUpRows(0, 0), 0u);
}

TEST_F(ResidencyTrackerTest, PublishesResidentAndEvictedAtTheThreshold) {
  std::vector<uint64_t> looked = {0, 1, 2, 3, 4, 5};  // shard 0: 4 rows, shard 1: 2 rows
  tracker_->Record(0, looked);
  Hold({0, 1});  // shard 0: 2 of 4 held = 0.5 -> resident; shard 1: 0 of 2
  EXPECT_EQ(tracker_->CloseWindow(), 1u);
  auto events = Events();
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(events[0].kind, ResidencyEvent::Kind::kEmbShardResident);
  EXPECT_EQ(events[0].table_id, 0u);
  EXPECT_EQ(events[0].shard, 0u);
  EXPECT_EQ(events[0].epoch, 3u);
  EXPECT_EQ(tracker_->ResidentShards(), (std::vector<ResidentShard>{{0, 0}}));
  // Nothing changes: nothing published.
  tracker_->Record(0, looked);
  EXPECT_EQ(tracker_->CloseWindow(), 0u);
  // The EMB side loses its pages (alpha down): shard 0 is no longer resident.
  std::vector<PageId> freed;
  cache_->SetBudgetPages(0, &freed);
  EXPECT_EQ(tracker_->CloseWindow(), 1u);
  events = Events();
  ASSERT_EQ(events.size(), 2u);
  EXPECT_EQ(events[1].kind, ResidencyEvent::Kind::kEmbShardEvicted);
  EXPECT_EQ(events[1].shard, 0u);
  EXPECT_TRUE(tracker_->ResidentShards().empty());
}

TEST_F(ResidencyTrackerTest, ShardsNobodyLooksUpAnyMoreStopBeingResident) {
  std::vector<uint64_t> looked = {8, 9};  // shard 2
  tracker_->Record(0, looked);
  Hold({8, 9});
  EXPECT_EQ(tracker_->CloseWindow(), 1u);  // resident
  for (int i = 0; i < 3; ++i) EXPECT_EQ(tracker_->CloseWindow(), 0u);
  // Its lookups left the horizon: not resident "for this node's traffic" any more.
  EXPECT_EQ(tracker_->CloseWindow(), 1u);
  EXPECT_EQ(Events().back().kind, ResidencyEvent::Kind::kEmbShardEvicted);
}

}  // namespace
}  // namespace hlem::serving
