#include "router/core/residency_sync.h"

#include <functional>
#include <memory>
#include <vector>

#include "common/clock.h"
#include "gtest/gtest.h"

namespace hlem::router {
namespace {

using serving::ResidencyEvent;
using Kind = ResidencyEvent::Kind;

// A scripted node: an event log per epoch with a retention window, and knobs for failures.
class FakeFeed final : public ResidencyFeed {
 public:
  absl::Status Stream(
      uint64_t epoch, uint64_t from_seq,
      const std::function<bool(uint64_t, const std::vector<ResidencyEvent>&)>& on_batch) override {
    ++streams;
    if (during) during();
    if (cancelled) return absl::CancelledError("cancelled");
    if (down) return absl::UnavailableError("node down");
    if (epoch != 0 && epoch != this->epoch) return absl::FailedPreconditionError("epoch");
    if (from_seq < first_retained) return absl::FailedPreconditionError("dropped");
    std::vector<ResidencyEvent> batch;
    for (const ResidencyEvent& e : log) {
      if (e.seq < from_seq) continue;
      if (drop_seq == e.seq) {  // lost once in transit
        drop_seq = 0;
        continue;
      }
      batch.push_back(e);
    }
    on_batch(this->epoch, batch);
    return absl::OkStatus();  // the node closed the stream
  }
  absl::StatusOr<serving::ResidencySnapshot> Snapshot() override {
    ++snapshots;
    if (during) during();
    if (cancelled) return absl::CancelledError("cancelled");
    if (down) return absl::UnavailableError("node down");
    serving::ResidencySnapshot s{.epoch = epoch, .seq = snapshot_seq};
    s.users = snapshot_users;
    return s;
  }
  void Cancel() override {}

  void Publish(ResidencyEvent e) {
    e.epoch = epoch;
    e.seq = ++last_seq;
    log.push_back(e);
  }
  void Restart(uint64_t new_epoch) {
    epoch = new_epoch;
    log.clear();
    last_seq = 0;
    first_retained = 1;
    snapshot_seq = 0;
    snapshot_users.clear();
  }

  uint64_t epoch = 5, last_seq = 0, first_retained = 1, drop_seq = 0, snapshot_seq = 0;
  std::vector<ResidencyEvent> log;
  std::vector<std::pair<uint64_t, uint64_t>> snapshot_users;
  bool down = false;
  bool cancelled = false;        // the calls end CANCELLED
  std::function<void()> during;  // runs inside each call (e.g. a Stop() racing it)
  int streams = 0, snapshots = 0;
};

class ResidencySyncTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ClusterOptions o;
    o.features = {{.table_id = 0, .residency_shard_rows = 100}};
    cluster_ = *Cluster::Create(o, clock_);
    node_ = *cluster_->AddNode("n0", "");
    sync_ = std::make_unique<ResidencySync>(*cluster_, node_, feed_, clock_);
  }
  NodeStatus Status() { return cluster_->Nodes()[0]; }

  SimClock clock_;
  std::unique_ptr<Cluster> cluster_;
  int node_ = 0;
  FakeFeed feed_;
  std::unique_ptr<ResidencySync> sync_;
};

TEST_F(ResidencySyncTest, SnapshotThenStreamThenReplayAfterAGap) {
  feed_.snapshot_users = {{1, 10}};
  feed_.snapshot_seq = 0;
  sync_->Step();  // snapshot
  EXPECT_EQ(Status().view, NodeView::kExact);
  EXPECT_EQ(Status().resident_users, 1u);
  for (uint64_t u = 2; u <= 5; ++u) feed_.Publish({.kind = Kind::kKvStored, .user_id = u});
  feed_.drop_seq = 2;  // user 3's event is lost once
  sync_->Step();       // stream: seq 1 applied, seq 3 is a gap
  EXPECT_EQ(Status().view, NodeView::kDegraded);
  EXPECT_EQ(Status().last_seq, 1u);
  sync_->Step();                               // replay from 2
  EXPECT_EQ(Status().view, NodeView::kExact);  // the replay closed the gap
  EXPECT_EQ(Status().last_seq, 4u);
  EXPECT_EQ(Status().resident_users, 5u);
  EXPECT_EQ(sync_->stats().replays, 1u);
  EXPECT_EQ(feed_.snapshots, 1);
}

TEST_F(ResidencySyncTest, DroppedEventsNewEpochsAndDownNodesResnapshot) {
  sync_->Step();
  for (uint64_t u = 1; u <= 3; ++u) feed_.Publish({.kind = Kind::kKvStored, .user_id = u});
  feed_.first_retained = 3;  // the node no longer retains seq 1-2 and we have not read them
  sync_->Step();             // FAILED_PRECONDITION: snapshot next
  feed_.snapshot_seq = 3;
  feed_.snapshot_users = {{1, 1}, {2, 1}, {3, 1}};
  sync_->Step();
  EXPECT_EQ(feed_.snapshots, 2);
  EXPECT_EQ(Status().view, NodeView::kExact);
  EXPECT_EQ(Status().resident_users, 3u);
  // The node restarts: its stream of the old epoch is refused, the snapshot drops old entries.
  feed_.Restart(9);
  feed_.Publish({.kind = Kind::kKvStored, .user_id = 50});
  feed_.snapshot_seq = 1;
  feed_.snapshot_users = {{50, 1}};
  sync_->Step();  // stream with epoch 5 refused
  sync_->Step();  // snapshot of epoch 9
  EXPECT_EQ(Status().epoch, 9u);
  EXPECT_EQ(Status().resident_users, 1u);
  // Down: unreachable (no dispatches), then back with a snapshot after the backoff.
  feed_.down = true;
  sync_->Step();
  EXPECT_EQ(Status().view, NodeView::kUnreachable);
  EXPECT_EQ(cluster_->Route(1, {}, false).decision.node, -1);
  feed_.down = false;
  const absl::Time before = clock_.Now();
  sync_->Step();  // backs off, then snapshots
  EXPECT_GE(clock_.Now() - before, absl::Milliseconds(500));
  EXPECT_EQ(Status().view, NodeView::kExact);
  EXPECT_GE(sync_->stats().failures, 1u);
}

// Stop() cancels the feed when the node is dropped: a snapshot or a stream that it ends with
// CANCELLED is not the node's failure (no unreachable mark, no failure counted, no backoff).
TEST_F(ResidencySyncTest, ACallThatStopCancelsIsNoFailure) {
  const NodeView initial = Status().view;
  feed_.cancelled = true;
  feed_.during = [this] { sync_->Stop(); };
  const absl::Time before = clock_.Now();
  sync_->Step();  // the snapshot, cancelled by Stop()
  EXPECT_EQ(feed_.snapshots, 1);
  EXPECT_EQ(Status().view, initial);
  EXPECT_EQ(clock_.Now(), before);
  EXPECT_EQ(sync_->stats().failures, 0u);
  EXPECT_EQ(sync_->stats().snapshots, 0u);
  // A stream: a second sync of the node, past its snapshot.
  feed_.cancelled = false;
  feed_.during = nullptr;
  ResidencySync sync(*cluster_, node_, feed_, clock_);
  sync.Step();  // the snapshot
  ASSERT_EQ(Status().view, NodeView::kExact);
  feed_.cancelled = true;
  feed_.during = [&sync] { sync.Stop(); };
  sync.Step();  // the stream, cancelled by Stop()
  EXPECT_EQ(feed_.streams, 1);
  EXPECT_EQ(clock_.Now(), before);
  EXPECT_EQ(Status().view, NodeView::kExact);
  EXPECT_EQ(sync.stats().failures, 0u);
}

// CANCELLED without a Stop() came from the node's side (its server shutting down): a failure like
// any other, not a reason to call again at once.
TEST_F(ResidencySyncTest, ACancelFromTheNodeIsAFailure) {
  feed_.cancelled = true;
  sync_->Step();  // the snapshot
  EXPECT_EQ(Status().view, NodeView::kUnreachable);
  EXPECT_EQ(sync_->stats().failures, 1u);
  feed_.cancelled = false;
  sync_->Step();  // backs off, then snapshots
  ASSERT_EQ(Status().view, NodeView::kExact);
  feed_.cancelled = true;
  sync_->Step();  // the stream
  EXPECT_EQ(Status().view, NodeView::kUnreachable);
  EXPECT_EQ(sync_->stats().failures, 2u);
}

}  // namespace
}  // namespace hlem::router
