// The twin's shard clients (sim/twin/sim_shards.h) against the rules of the real one
// (embedding_shard/core/shard_client.cc): failover after a failed attempt, skipping a server
// marked down, probes bringing it back, the last replica waiting for the deadline.
#include "sim/twin/sim_shards.h"

#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace hlem::sim {
namespace {

using ::testing::HasSubstr;
using State = SimShards::State;

constexpr uint32_t kTable = 7;

// Two servers, range partitioning of one 100-row table: rows 0–49 in partition 0, 50–99 in 1.
SimShardOptions TwoShards(uint32_t replicas, bool dead_refuses) {
  SimShardOptions o;
  o.client.tables = {{.id = kTable, .name = "t", .rows = 100, .dim = 4}};
  o.client.map = {.num_shards = 2, .replicas = replicas};
  o.dead_refuses = dead_refuses;
  return o;  // the real client's timings: probes every 500 ms (300 ms timeout), attempts 250 ms
}

class SimShardsTest : public ::testing::Test {
 protected:
  std::unique_ptr<SimShards> Make(uint32_t replicas, bool dead_refuses = false) {
    auto s = SimShards::Create(TwoShards(replicas, dead_refuses), clock_);
    EXPECT_TRUE(s.ok()) << s.status();
    return s.ok() ? std::move(*s) : nullptr;
  }
  absl::Time Deadline() { return clock_.Now() + absl::Seconds(1); }
  SimClock clock_{absl::UnixEpoch()};
};

TEST_F(SimShardsTest, PartitionsFollowTheShardMap) {
  auto shards = Make(1);
  std::vector<uint32_t> p;
  const std::vector<uint64_t> rows = {99, 3, 60, 4, 100'000};  // out of range: left out
  shards->PartitionsOf(kTable, rows, &p);
  EXPECT_EQ(p, (std::vector<uint32_t>{0, 1}));
  p.clear();
  shards->PartitionsOf(/*table=*/8, rows, &p);
  EXPECT_TRUE(p.empty());
  SimShardOptions bad = TwoShards(3, false);
  EXPECT_FALSE(SimShards::Create(bad, clock_).ok());  // more replicas than servers
  bad = TwoShards(1, false);
  bad.client.tables.push_back(bad.client.tables[0]);
  EXPECT_THAT(std::string(SimShards::Create(bad, clock_).status().message()), HasSubstr("twice"));
}

TEST_F(SimShardsTest, AStoppedPrimaryCostsOneAttemptThenIsSkippedUntilAProbeFindsItBack) {
  auto shards = Make(/*replicas=*/2);
  const uint32_t c = shards->NewClient();
  const std::vector<uint32_t> p0 = {0};
  SimShards::Fetch f = shards->Start(c, kTable, p0, Deadline());
  EXPECT_TRUE(f.status.ok());
  EXPECT_EQ(f.waited, absl::ZeroDuration());

  clock_.AdvanceBy(absl::Milliseconds(100));
  shards->Set(0, State::kStopped);
  f = shards->Start(c, kTable, p0, Deadline());
  EXPECT_TRUE(f.status.ok()) << f.status;  // served by the replica on server 1
  EXPECT_TRUE(f.failed_over);
  EXPECT_EQ(f.waited, absl::Milliseconds(250));  // the attempt timeout
  // A fetch starting before that attempt timed out does not know yet: it waits too.
  clock_.AdvanceBy(absl::Milliseconds(100));
  EXPECT_EQ(shards->Start(c, kTable, p0, Deadline()).waited, absl::Milliseconds(250));
  // Marked down: straight to the replica.
  clock_.AdvanceBy(absl::Milliseconds(200));
  f = shards->Start(c, kTable, p0, Deadline());
  EXPECT_TRUE(f.status.ok());
  EXPECT_EQ(f.waited, absl::ZeroDuration());
  EXPECT_FALSE(f.failed_over);
  // Resumed at 600 ms, but the client keeps away from it until its next probe (1 s): with the
  // replica stopped at 700 ms, a fetch then waits for the replica until its deadline.
  clock_.AdvanceBy(absl::Milliseconds(200));
  shards->Set(0, State::kUp);
  clock_.AdvanceBy(absl::Milliseconds(100));
  shards->Set(1, State::kStopped);
  f = shards->Start(c, kTable, p0, clock_.Now() + absl::Milliseconds(100));
  EXPECT_EQ(f.status.code(), absl::StatusCode::kDeadlineExceeded) << f.status;
  EXPECT_EQ(f.waited, absl::Milliseconds(100));
  clock_.AdvanceTo(absl::UnixEpoch() + absl::Milliseconds(1000));
  f = shards->Start(c, kTable, p0, Deadline());
  EXPECT_TRUE(f.status.ok()) << f.status;
  EXPECT_EQ(f.waited, absl::ZeroDuration());  // back on its primary, server 0
  EXPECT_EQ(shards->counters().failovers, 2u);
  EXPECT_EQ(shards->counters().failed_attempts, 3u);
  EXPECT_EQ(shards->counters().deadline_exceeded, 1u);
}

TEST_F(SimShardsTest, ADeadServerRefusesAtOnceOverGrpc) {
  auto shards = Make(/*replicas=*/2, /*dead_refuses=*/true);
  const uint32_t c = shards->NewClient();
  clock_.AdvanceBy(absl::Milliseconds(1));
  shards->Set(0, State::kKilled);
  const std::vector<uint32_t> both = {0, 1};
  SimShards::Fetch f = shards->Start(c, kTable, both, Deadline());
  EXPECT_TRUE(f.status.ok()) << f.status;
  EXPECT_TRUE(f.failed_over);
  EXPECT_EQ(f.waited, absl::ZeroDuration());
  // A client that starts now asks every server first: it never tries the dead one.
  const uint32_t fresh = shards->NewClient();
  f = shards->Start(fresh, kTable, both, Deadline());
  EXPECT_TRUE(f.status.ok());
  EXPECT_FALSE(f.failed_over);
  EXPECT_EQ(shards->counters().failed_attempts, 1u);
}

TEST_F(SimShardsTest, WithoutAReplicaTheLastAttemptWaitsForTheDeadlineThenFailsFast) {
  auto shards = Make(/*replicas=*/1);
  const uint32_t c = shards->NewClient();
  clock_.AdvanceTo(absl::UnixEpoch() + absl::Milliseconds(10));
  shards->Set(1, State::kStopped);
  const std::vector<uint32_t> p0 = {0}, both = {0, 1};
  EXPECT_TRUE(shards->Start(c, kTable, p0, Deadline()).status.ok());  // server 0 is fine
  SimShards::Fetch f = shards->Start(c, kTable, both, clock_.Now() + absl::Milliseconds(400));
  EXPECT_EQ(f.status.code(), absl::StatusCode::kDeadlineExceeded) << f.status;
  EXPECT_EQ(f.waited, absl::Milliseconds(400));
  EXPECT_THAT(std::string(f.status.message()), HasSubstr("shard 1: no answer in 400ms"));
  // The failed attempt marked it down (at 410 ms): no live replica, at once.
  clock_.AdvanceTo(absl::UnixEpoch() + absl::Milliseconds(450));
  f = shards->Start(c, kTable, both, Deadline());
  EXPECT_EQ(f.status.code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(f.waited, absl::ZeroDuration());
  EXPECT_THAT(std::string(f.status.message()),
              HasSubstr("partition 1 of table 7: no live replica"));
  clock_.AdvanceTo(absl::UnixEpoch() + absl::Milliseconds(1200));
  shards->Set(1, State::kUp);
  // Its 1 s probe has not given up yet (1.3 s): the verdict in is the 500 ms probe's (down).
  EXPECT_EQ(shards->Start(c, kTable, both, Deadline()).status.code(),
            absl::StatusCode::kUnavailable);
  clock_.AdvanceTo(absl::UnixEpoch() + absl::Milliseconds(1500));
  EXPECT_TRUE(shards->Start(c, kTable, both, Deadline()).status.ok());
  EXPECT_EQ(shards->counters().deadline_exceeded, 1u);
  EXPECT_EQ(shards->counters().unavailable, 2u);
}

TEST_F(SimShardsTest, AProbeMarksAStoppedServerDownAfterItsTimeout) {
  auto shards = Make(/*replicas=*/1);
  const uint32_t c = shards->NewClient(), d = shards->NewClient();
  clock_.AdvanceTo(absl::UnixEpoch() + absl::Milliseconds(400));
  shards->Set(1, State::kStopped);
  const std::vector<uint32_t> p1 = {1};
  // The 500 ms probe is still waiting at 790 ms: the client still tries the server.
  clock_.AdvanceTo(absl::UnixEpoch() + absl::Milliseconds(790));
  SimShards::Fetch f = shards->Start(c, kTable, p1, clock_.Now() + absl::Milliseconds(5));
  EXPECT_EQ(f.status.code(), absl::StatusCode::kDeadlineExceeded);
  // At 800 ms it gives up: a client that never failed a fetch there knows it now.
  clock_.AdvanceTo(absl::UnixEpoch() + absl::Milliseconds(800));
  f = shards->Start(d, kTable, p1, Deadline());
  EXPECT_EQ(f.status.code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(f.waited, absl::ZeroDuration());
  // A client starting now asks the servers first: it knows at once.
  const uint32_t e = shards->NewClient();
  EXPECT_EQ(shards->Start(e, kTable, p1, Deadline()).status.code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(shards->counters().failed_attempts, 1u);
}

}  // namespace
}  // namespace hlem::sim
