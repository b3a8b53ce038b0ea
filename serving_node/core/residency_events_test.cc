#include "serving_node/core/residency_events.h"

#include <vector>

#include "gtest/gtest.h"

namespace hlem::serving {
namespace {

ResidencyEvent Stored(uint64_t user, uint64_t tokens) {
  ResidencyEvent e;
  e.kind = ResidencyEvent::Kind::kKvStored;
  e.user_id = user;
  e.tokens = tokens;
  return e;
}

TEST(ResidencyEventLogTest, NumbersEventsWithoutGapsAndNotifiesInOrder) {
  ResidencyEventLog log(/*epoch=*/9, /*capacity=*/100);
  std::vector<uint64_t> seen;
  log.Subscribe([&](const ResidencyEvent& e) {
    EXPECT_EQ(e.epoch, 9u);
    seen.push_back(e.seq);
  });
  for (int i = 0; i < 5; ++i) EXPECT_EQ(log.Publish(Stored(i, 10)), uint64_t(i + 1));
  EXPECT_EQ(seen, (std::vector<uint64_t>{1, 2, 3, 4, 5}));
  EXPECT_EQ(log.last_seq(), 5u);
  auto since = log.Since(3);
  ASSERT_TRUE(since.ok());
  ASSERT_EQ(since->size(), 3u);
  EXPECT_EQ((*since)[0].seq, 3u);
  EXPECT_EQ((*since)[0].user_id, 2u);
  EXPECT_TRUE(log.Since(6).ok());
  EXPECT_TRUE(log.Since(6)->empty());
  EXPECT_EQ(log.Since(7).status().code(), absl::StatusCode::kOutOfRange);
}

TEST(ResidencyEventLogTest, DroppedEventsNeedASnapshot) {
  ResidencyEventLog log(1, /*capacity=*/3);
  for (int i = 0; i < 10; ++i) log.Publish(Stored(i, 1));
  EXPECT_EQ(log.Since(5).status().code(), absl::StatusCode::kFailedPrecondition);
  auto kept = log.Since(8);
  ASSERT_TRUE(kept.ok());
  EXPECT_EQ(kept->size(), 3u);
}

}  // namespace
}  // namespace hlem::serving
