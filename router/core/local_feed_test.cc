#include "router/core/local_feed.h"

#include <thread>
#include <vector>

#include "gtest/gtest.h"

namespace hlem::router {
namespace {

using serving::ResidencyEvent;
using Kind = ResidencyEvent::Kind;

TEST(LocalResidencyFeedTest, StreamsSnapshotsAndRefusesWhatTheLogNoLongerHolds) {
  serving::ResidencyEventLog log(/*epoch=*/5, /*capacity=*/4);
  std::shared_ptr<serving::ResidencyState> state = serving::FollowResidency(log);
  LocalResidencyFeed feed(log, state, absl::Milliseconds(1));
  for (uint64_t u = 1; u <= 3; ++u)
    log.Publish({.kind = Kind::kKvStored, .user_id = u, .tokens = 9});

  // From seq 2: events 2 and 3, then (after the stop) nothing more.
  std::vector<uint64_t> seqs;
  auto collect = [&](uint64_t epoch, const std::vector<ResidencyEvent>& events) {
    EXPECT_EQ(epoch, 5u);
    for (const ResidencyEvent& e : events) seqs.push_back(e.seq);
    return seqs.size() < 3;
  };
  std::thread later([&] {
    absl::SleepFor(absl::Milliseconds(20));
    log.Publish({.kind = Kind::kKvEvicted, .user_id = 1});
  });
  EXPECT_TRUE(feed.Stream(0, 2, collect).ok());  // waits for event 4, then on_batch stops it
  later.join();
  EXPECT_EQ(seqs, (std::vector<uint64_t>{2, 3, 4}));

  EXPECT_EQ(feed.Stream(6, 1, collect).code(), absl::StatusCode::kFailedPrecondition);  // epoch
  EXPECT_EQ(feed.Stream(5, 9, collect).code(), absl::StatusCode::kOutOfRange);
  log.Publish({.kind = Kind::kKvStored, .user_id = 4, .tokens = 1});  // seq 5: seq 1 dropped
  EXPECT_EQ(feed.Stream(5, 1, collect).code(), absl::StatusCode::kFailedPrecondition);

  absl::StatusOr<serving::ResidencySnapshot> snapshot = feed.Snapshot();
  ASSERT_TRUE(snapshot.ok());
  EXPECT_EQ(snapshot->epoch, 5u);
  EXPECT_EQ(snapshot->seq, 5u);
  EXPECT_EQ(snapshot->users.size(), 3u);  // 2, 3 and 4

  feed.Cancel();
  EXPECT_EQ(feed.Stream(0, 5, collect).code(), absl::StatusCode::kCancelled);
  EXPECT_EQ(feed.Snapshot().status().code(), absl::StatusCode::kCancelled);
}

}  // namespace
}  // namespace hlem::router
