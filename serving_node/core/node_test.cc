#include "serving_node/core/node.h"

#include <memory>
#include <thread>
#include <vector>

#include "common/clock.h"
#include "common/rng.h"
#include "gtest/gtest.h"
#include "serving_node/core/emb_cache.h"
#include "serving_node/core/hbm_pool.h"
#include "serving_node/core/kv_cache.h"
#include "serving_node/core/memory_manager.h"
#include "serving_node/core/pipeline_testing.h"
#include "serving_node/core/request_queue.h"
#include "serving_node/core/residency_state.h"
#include "serving_node/device/cpu_device.h"

namespace hlem::serving {
namespace {

using namespace ::hlem::serving::testing;  // NOLINT: the fakes

constexpr uint32_t kNodePages = 64;

// One node on the cpu device with the fake model. The pipeline and the device run on a real
// clock; the node's own clock (timers, latencies) is `node_clock`.
class NodeTest : public ::testing::Test {
 protected:
  void SetUp() override { Build({}, clock_); }
  void Build(NodeOptions options, Clock& node_clock) {
    node_.reset();
    queue_.reset();
    pipeline_.reset();
    manager_.reset();
    emb_.reset();
    kv_.reset();
    pool_ = *HbmPool::Create({.pool_bytes = kNodePages * kPageBytes, .page_bytes = kPageBytes});
    device_ =
        *CpuDevice::Create({.pool_bytes = kNodePages * kPageBytes,
                            .link = {.bytes_per_second = 1e10, .latency = absl::Microseconds(1)}},
                           clock_);
    events_ = std::make_unique<ResidencyEventLog>(7, 1 << 16);
    residency_ = FollowResidency(*events_);
    kv_ = *KvCache::Create({.layers = 1, .kv_dim = kDim, .dtype_bytes = 4}, *pool_, events_.get(),
                           clock_);
    emb_ = *EmbCache::Create({.tables = {{0, kDim * 4}, {1, kDim * 4}}}, *pool_, clock_);
    manager_ = *MemoryManager::Create({.initial_alpha = 0.25}, *pool_, *kv_, *emb_, clock_);
    pipeline_ =
        *Pipeline::Create({.features = kFeatures, .max_history = 500}, *kv_, *emb_, *device_,
                          device_->pool_data(), source_, runner_, nullptr, clock_);
    queue_ = *RequestQueue::Create({.max_batch = 4, .max_queue = 8}, *pipeline_, clock_);
    auto node = Node::Create(options,
                             {.pipeline = pipeline_.get(),
                              .queue = queue_.get(),
                              .memory = manager_.get(),
                              .kv = kv_.get(),
                              .emb = emb_.get(),
                              .device = device_.get(),
                              .events = events_.get(),
                              .residency = residency_.get(),
                              .row_bytes = kDim * 4,
                              .link_bytes_per_second = 1e10,
                              .max_queue = 8},
                             node_clock);
    ASSERT_TRUE(node.ok()) << node.status();
    node_ = std::move(*node);
  }
  static std::vector<uint64_t> Events(Rng& rng, size_t n) { return RandomEvents(rng, n); }

  RealClock clock_;
  std::unique_ptr<HbmPool> pool_;
  std::unique_ptr<ResidencyEventLog> events_;
  std::shared_ptr<ResidencyState> residency_;
  std::unique_ptr<KvCache> kv_;
  std::unique_ptr<EmbCache> emb_;
  std::unique_ptr<CpuDevice> device_;  // destroyed before the caches (late completions)
  std::unique_ptr<MemoryManager> manager_;
  FakeRowSource source_;
  FakeRunner runner_;
  std::unique_ptr<Pipeline> pipeline_;
  std::unique_ptr<RequestQueue> queue_;
  std::unique_ptr<Node> node_;
};

TEST_F(NodeTest, WindowsReportTheSignalsOfTheControlLoop) {
  NodeOptions o;
  o.slo = absl::Hours(1);
  Build(o, clock_);
  Rng rng(1);
  const std::vector<uint64_t> a = Events(rng, 40), b = Events(rng, 20), cand = Events(rng, 3);
  ASSERT_TRUE(node_->InferSync({.user = 1, .history = a, .candidates = cand}).ok());
  ASSERT_TRUE(node_->InferSync({.user = 1, .history = a, .candidates = cand}).ok());  // returning
  auto stale =
      node_->InferSync({.user = 2, .history = b, .candidates = cand, .expected_kv_resident = true});
  ASSERT_TRUE(stale.ok());
  EXPECT_TRUE(stale->stale_kv_hit);
  EXPECT_EQ(node_->InferSync({.user = 3, .history = a, .candidates = {}}).status().code(),
            absl::StatusCode::kInvalidArgument);

  NodeWindow w = node_->CloseWindow();
  EXPECT_EQ(w.index, 0u);
  EXPECT_EQ(w.requests, 4u);
  EXPECT_DOUBLE_EQ(w.hot_user_ratio, 1.0 / 3);
  EXPECT_DOUBLE_EQ(w.stale_hit_rate, 1.0);
  // Tokens: 40 + 40 (all reused) + 20 requested, 40 reused.
  EXPECT_DOUBLE_EQ(w.kv_hit_rate, 40.0 / 100);
  EXPECT_DOUBLE_EQ(w.kv_user_hit_rate, 1.0 / 3);
  EXPECT_DOUBLE_EQ(w.mean_seq_len_tokens, 100.0 / 3);
  EXPECT_DOUBLE_EQ(w.mean_seq_len_norm, 100.0 / 3 / 500);
  EXPECT_GT(w.emb_hit_rate, 0.0);
  EXPECT_EQ(w.slo_violation_fraction, 0.0);  // the bad request is the client's, not judged
  EXPECT_GT(w.p50_seconds, 0.0);
  EXPECT_GE(w.p99_seconds, w.p50_seconds);
  EXPECT_DOUBLE_EQ(w.alpha_effective, 0.25);
  EXPECT_EQ(w.pool_bytes, kNodePages * kPageBytes);
  EXPECT_GT(w.kv_bytes, 0u);
  EXPECT_GT(w.shard_fetch_bytes, 0u);
  EXPECT_GT(w.emb_miss_bytes, 0u);

  // Next window: user 1 is returning (served in the previous window), user 4 is new.
  ASSERT_TRUE(node_->InferSync({.user = 1, .history = a, .candidates = cand}).ok());
  ASSERT_TRUE(node_->InferSync({.user = 4, .history = b, .candidates = cand}).ok());
  w = node_->CloseWindow();
  EXPECT_EQ(w.index, 1u);
  EXPECT_DOUBLE_EQ(w.hot_user_ratio, 0.5);
  EXPECT_EQ(w.stale_hit_rate, 0.0);  // nobody expected residency
  ASSERT_EQ(node_->Windows(12).size(), 2u);
  EXPECT_EQ(node_->Windows(0).size(), 1u);
  EXPECT_EQ(node_->Windows(0)[0].index, 1u);

  // An SLO no request can meet: every judged request violates it.
  o.slo = absl::Nanoseconds(1);
  Build(o, clock_);
  ASSERT_TRUE(node_->InferSync({.user = 1, .history = a, .candidates = cand}).ok());
  w = node_->CloseWindow();
  EXPECT_EQ(w.slo_violation_fraction, 1.0);
  EXPECT_DOUBLE_EQ(w.p99_norm, 1.0);  // capped
}

TEST_F(NodeTest, OverloadDrainAndExactlyOneAnswer) {
  NodeOptions o;
  o.max_in_flight_tokens = 30;
  Build(o, clock_);
  Rng rng(2);
  const std::vector<uint64_t> h = Events(rng, 20), cand = Events(rng, 2);
  runner_.SetGate(false);  // the model holds the first request
  std::atomic<int> answers{0};
  std::vector<absl::StatusCode> codes(3, absl::StatusCode::kUnknown);
  node_->Infer({.user = 1, .history = h, .candidates = cand}, [&](auto r) {
    codes[0] = r.status().code();
    ++answers;
  });
  // 22 tokens in flight: another 22 would pass 30.
  node_->Infer({.user = 2, .history = h, .candidates = cand}, [&](auto r) {
    codes[1] = r.status().code();
    ++answers;
  });
  EXPECT_EQ(codes[1], absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(node_->Gauges().in_flight_tokens, 22u);
  EXPECT_GT(node_->Gauges().load, 0.7);
  const DrainResult not_yet = node_->Drain(/*wait=*/false, absl::InfinitePast());
  EXPECT_FALSE(not_yet.drained);
  EXPECT_EQ(not_yet.in_flight_requests, 1u);
  node_->Infer({.user = 3, .history = h, .candidates = cand}, [&](auto r) {
    codes[2] = r.status().code();
    ++answers;
  });
  EXPECT_EQ(codes[2], absl::StatusCode::kUnavailable);
  EXPECT_EQ(node_->Gauges().load, 1.0);  // draining
  runner_.SetGate(true);
  const DrainResult drained = node_->Drain(/*wait=*/true, absl::Now() + absl::Seconds(30));
  EXPECT_TRUE(drained.drained);
  EXPECT_EQ(answers, 3);
  EXPECT_EQ(codes[0], absl::StatusCode::kOk);
  const NodeWindow w = node_->CloseWindow();
  EXPECT_EQ(w.requests, 3u);
  EXPECT_DOUBLE_EQ(w.slo_violation_fraction, 2.0 / 3);  // shed + refused while draining
}

TEST_F(NodeTest, SetAlphaIsFencedByTheAllocatorEpoch) {
  EXPECT_EQ(node_->SetAlpha(1.5, 1, 1).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(node_->SetAlpha(std::nan(""), 1, 1).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(node_->SetAlpha(0.5, 0, 1).status().code(), absl::StatusCode::kInvalidArgument);
  auto r = node_->SetAlpha(0.5, 2, 10);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_TRUE(r->changed);
  EXPECT_DOUBLE_EQ(r->alpha_target, 0.5);
  EXPECT_DOUBLE_EQ(node_->Gauges().alpha_target, 0.5);
  // The same decision again changes nothing; an older one is refused.
  r = node_->SetAlpha(0.7, 2, 10);
  ASSERT_TRUE(r.ok());
  EXPECT_FALSE(r->changed);
  EXPECT_DOUBLE_EQ(r->alpha_target, 0.5);
  EXPECT_EQ(node_->SetAlpha(0.7, 2, 9).status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(node_->SetAlpha(0.7, 1, 99).status().code(), absl::StatusCode::kFailedPrecondition);
  r = node_->SetAlpha(0.3, 3, 1);  // a restarted allocator: new epoch, decisions from 1
  ASSERT_TRUE(r.ok());
  EXPECT_TRUE(r->changed);
  EXPECT_EQ(node_->Gauges().alpha_epoch, 3u);
  EXPECT_EQ(node_->Gauges().alpha_decision_id, 1u);
}

TEST_F(NodeTest, SnapshotAndStreamAgree) {
  Rng rng(3);
  const std::vector<uint64_t> cand = Events(rng, 2);
  for (uint64_t user = 1; user <= 5; ++user) {
    ASSERT_TRUE(
        node_->InferSync({.user = user, .history = Events(rng, 10), .candidates = cand}).ok());
  }
  kv_->Evict(3);
  node_->ReportLoad();
  const ResidencySnapshot snap = node_->Snapshot();
  EXPECT_EQ(snap.epoch, 7u);
  EXPECT_EQ(snap.seq, events_->last_seq());
  ASSERT_EQ(snap.users.size(), 4u);
  for (const auto& [user, tokens] : snap.users) {
    EXPECT_NE(user, 3u);
    EXPECT_EQ(tokens, 10u);
  }
  // A subscriber that replays the log from seq 1 reaches the same state.
  ResidencyState replay(7);
  auto all = events_->Since(1);
  ASSERT_TRUE(all.ok());
  for (const ResidencyEvent& e : *all) ASSERT_TRUE(replay.Apply(e).ok());
  EXPECT_EQ(replay.Take().users, snap.users);
  EXPECT_EQ(all->back().kind, ResidencyEvent::Kind::kLoadReport);
  // A gap is refused.
  ResidencyEvent late = all->back();
  late.seq += 5;
  EXPECT_EQ(replay.Apply(late).code(), absl::StatusCode::kFailedPrecondition);
}

TEST_F(NodeTest, TimersCloseWindowsAndReportLoad) {
  SimClock sim;
  NodeOptions o;
  o.window = absl::Seconds(5);
  o.load_report_interval = absl::Seconds(1);
  Build(o, sim);
  node_->Start();
  const uint64_t seq0 = events_->last_seq();  // the first load report runs at once
  sim.AdvanceBy(absl::Seconds(3));
  EXPECT_EQ(events_->last_seq(), seq0 + 4);  // at 0, 1, 2 and 3 s
  EXPECT_TRUE(node_->Windows(12).empty());
  sim.AdvanceBy(absl::Seconds(7));
  ASSERT_EQ(node_->Windows(12).size(), 2u);
  EXPECT_EQ(node_->Windows(12)[1].duration, absl::Seconds(5));
  node_->Stop();
  const uint64_t seq = events_->last_seq();
  sim.AdvanceBy(absl::Seconds(20));
  EXPECT_EQ(events_->last_seq(), seq);
  EXPECT_EQ(node_->Windows(12).size(), 2u);
}

}  // namespace
}  // namespace hlem::serving
