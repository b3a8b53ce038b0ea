#include "serving_node/core/pipeline.h"

#include <thread>

#include <cmath>
#include <memory>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "common/clock.h"
#include "common/rng.h"
#include "common/shed.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "serving_node/core/emb_cache.h"
#include "serving_node/core/hbm_pool.h"
#include "serving_node/core/kv_cache.h"
#include "serving_node/core/pipeline_testing.h"
#include "serving_node/core/request_queue.h"
#include "serving_node/device/cpu_device.h"

namespace hlem::serving {
namespace {

using namespace ::hlem::serving::testing;  // NOLINT: the fakes

class PipelineTest : public ::testing::Test {
 protected:
  void SetUp() override { Build({}); }
  void Build(PipelineOptions options, uint32_t emb_pages = 16,
             LinkOptions link = {.bytes_per_second = 1e10, .latency = absl::Microseconds(1)}) {
    pipeline_.reset();
    device_.reset();  // first: a late copy's completion commits into emb_
    emb_.reset();
    kv_.reset();
    pool_ = *HbmPool::Create({.pool_bytes = 64 * kPageBytes, .page_bytes = kPageBytes});
    device_ = *CpuDevice::Create({.pool_bytes = 64 * kPageBytes, .link = link}, clock_);
    kv_ = *KvCache::Create({.layers = 1, .kv_dim = kDim, .dtype_bytes = 4, .budget_pages = 32},
                           *pool_, nullptr, clock_);
    emb_ = *EmbCache::Create({.tables = {{0, kDim * 4}, {1, kDim * 4}}, .budget_pages = emb_pages},
                             *pool_, clock_);
    options.features = kFeatures;
    if (options.max_history == 4096) options.max_history = 1000;
    auto p = Pipeline::Create(options, *kv_, *emb_, *device_, device_->pool_data(), source_,
                              runner_, nullptr, clock_);
    ASSERT_TRUE(p.ok()) << p.status();
    pipeline_ = std::move(*p);
  }
  static std::vector<uint64_t> Events(Rng& rng, size_t n) { return RandomEvents(rng, n); }
  InferInput Input(uint64_t user, std::vector<uint64_t> history, std::vector<uint64_t> cand) {
    return {.user = user, .history = std::move(history), .candidates = std::move(cand)};
  }

  RealClock clock_;
  std::unique_ptr<HbmPool> pool_;
  std::unique_ptr<KvCache> kv_;
  std::unique_ptr<EmbCache> emb_;
  std::unique_ptr<CpuDevice> device_;  // destroyed before the caches (late completions)
  FakeRowSource source_;
  FakeRunner runner_;
  std::unique_ptr<Pipeline> pipeline_;
};

TEST_F(PipelineTest, ReturningUserComputesOnlyTheNewTokens) {
  Rng rng(1);
  std::vector<uint64_t> history = Events(rng, 100);
  const std::vector<uint64_t> cand = Events(rng, 4);
  auto first = pipeline_->Infer(Input(7, history, cand));
  ASSERT_TRUE(first.ok()) << first.status();
  ExpectNear(first->scores, Expected(history, cand));
  EXPECT_EQ(first->cached_prefix_tokens, 0u);
  EXPECT_EQ(first->computed_tokens, 104u);
  EXPECT_GT(first->emb_misses, 0u);
  // The user returns with 10 more events: only they and the candidates are computed, and the
  // answer is what a cold node gives for the whole history.
  const std::vector<uint64_t> more = Events(rng, 10);
  history.insert(history.end(), more.begin(), more.end());
  const uint64_t fetched_before = source_.fetched_rows;
  auto second = pipeline_->Infer(Input(7, history, cand));
  ASSERT_TRUE(second.ok()) << second.status();
  ExpectNear(second->scores, Expected(history, cand));
  EXPECT_EQ(second->cached_prefix_tokens, 100u);
  EXPECT_EQ(second->computed_tokens, 14u);
  EXPECT_EQ(second->history_tokens, 110u);
  EXPECT_GT(second->emb_hits, 0u);  // the candidates' rows stayed in the EMB cache
  EXPECT_LE(source_.fetched_rows - fetched_before, 20u);  // at most the new events' rows
  EXPECT_TRUE(kv_->CheckInvariants().ok()) << kv_->CheckInvariants();
  EXPECT_TRUE(emb_->CheckInvariants().ok()) << emb_->CheckInvariants();
}

// A fetched row crosses the link whether or not the EMB cache takes it (a device computes on
// device memory): into its slot when admitted, into scratch when not, e.g. at α = 0.
TEST_F(PipelineTest, EveryFetchedRowCrossesTheLink) {
  constexpr uint64_t kRowBytes = kDim * 4;
  for (uint32_t emb_pages : {0u, 16u}) {
    SCOPED_TRACE(emb_pages);
    Build({}, emb_pages);
    Rng rng(11);
    const std::vector<uint64_t> history = Events(rng, 80);
    const std::vector<uint64_t> cand = Events(rng, 5);
    auto out = pipeline_->Infer(Input(3, history, cand));
    ASSERT_TRUE(out.ok()) << out.status();
    ExpectNear(out->scores, Expected(history, cand));
    ASSERT_GT(out->emb_misses, 0u);
    const DeviceCopyStats stats = device_->stats();
    const int miss = static_cast<int>(CopyPurpose::kEmbMiss);
    EXPECT_EQ(stats.bytes[miss], out->emb_misses * kRowBytes);
    if (emb_pages == 0) {
      EXPECT_EQ(out->emb_hits, 0u);
      EXPECT_EQ(stats.copies[miss], 1u);  // one staged copy: both tables' rows
    }
  }
}

// A request's hits are read before anything can reuse their slots: with room for 128 rows, a
// request that hits rows cached by an earlier one and misses 300 more (its own admissions evict
// every unpinned row) still sums the rows it hit, not what later landed in their slots.
TEST_F(PipelineTest, HitRowsAreNotEvictedBeforeTheyAreSummed) {
  Build({}, 1);  // one EMB page: 128 rows of 32 B, both tables
  Rng rng(21);
  const std::vector<uint64_t> warm = Events(rng, 30);
  const std::vector<uint64_t> cand = Events(rng, 2);
  ASSERT_TRUE(pipeline_->Infer(Input(1, warm, cand)).ok());
  std::vector<uint64_t> history = warm;
  for (uint64_t i = 0; i < 300; ++i) {
    history.push_back(600 + i);
    history.push_back(i % 50);
  }
  auto out = pipeline_->Infer(Input(2, history, cand));
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_GT(out->emb_hits, 0u);
  ExpectNear(out->scores, Expected(history, cand));
  EXPECT_TRUE(emb_->CheckInvariants().ok()) << emb_->CheckInvariants();
}

TEST_F(PipelineTest, AChangedHistoryIsRecomputedNotServedStale) {
  Rng rng(2);
  std::vector<uint64_t> history = Events(rng, 60);
  const std::vector<uint64_t> cand = Events(rng, 3);
  ASSERT_TRUE(pipeline_->Infer(Input(9, history, cand)).ok());
  history[20] = (history[20] + 1) % 1000;  // an edited event inside the cached prefix
  auto again = pipeline_->Infer(
      {.user = 9, .history = history, .candidates = cand, .expected_kv_resident = true});
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(again->cached_prefix_tokens, 0u);
  EXPECT_FALSE(again->stale_kv_hit);  // the node held K/V: not the router's error
  ExpectNear(again->scores, Expected(history, cand));
}

TEST_F(PipelineTest, LongHistoriesAreTrimmedInSteps) {
  PipelineOptions o;
  o.max_history = 20;
  o.trim_fraction = 0.1;  // the window start moves 2 events at a time
  Build(o);
  Rng rng(3);
  std::vector<uint64_t> history = Events(rng, 25);
  const std::vector<uint64_t> cand = Events(rng, 2);
  auto r = pipeline_->Infer(Input(4, history, cand));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->trimmed_events, 6u);  // ceil(5 / 2) · 2
  EXPECT_EQ(r->history_tokens, 19u);
  ExpectNear(r->scores, Expected(std::span<const uint64_t>(history).subspan(12), cand));
  // One more event: the window start stays, the prefix is reused.
  const std::vector<uint64_t> one = Events(rng, 1);
  history.insert(history.end(), one.begin(), one.end());
  r = pipeline_->Infer(Input(4, history, cand));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->trimmed_events, 6u);
  EXPECT_EQ(r->cached_prefix_tokens, 19u);
  ExpectNear(r->scores, Expected(std::span<const uint64_t>(history).subspan(12), cand));
}

TEST_F(PipelineTest, DeltaModeSendsOnlyTheNewEvents) {
  PipelineOptions o;
  o.max_history = 40;
  o.trim_fraction = 0.25;  // the window start moves 10 events at a time
  Build(o);
  Rng rng(21);
  std::vector<uint64_t> history = Events(rng, 30);
  const std::vector<uint64_t> cand = Events(rng, 3);
  auto full = pipeline_->Infer(Input(5, history, cand));
  ASSERT_TRUE(full.ok()) << full.status();
  EXPECT_EQ(full->next_prefix.len, 30u);
  // The same prefix computed by hand: the rolling hash of the events' tokens.
  uint64_t h = kKvHashSeed;
  for (size_t j = 0; j < 30; ++j) {
    h = KvHashExtend(h, EventToken(std::span<const uint64_t>(history).subspan(j * 2, 2)));
  }
  EXPECT_EQ(full->next_prefix.hash, h);

  // Delta: 5 new events after the named prefix score as the full history does.
  std::vector<uint64_t> more = Events(rng, 5);
  history.insert(history.end(), more.begin(), more.end());
  InferInput delta = Input(5, more, cand);
  delta.delta = full->next_prefix;
  auto d = pipeline_->Infer(delta);
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(d->cached_prefix_tokens, 30u);
  EXPECT_EQ(d->computed_tokens, 8u);
  ExpectNear(d->scores, Expected(history, cand));
  auto again = pipeline_->Infer(Input(6, history, cand));  // another user, full mode
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(d->next_prefix, again->next_prefix);  // the same history names the same prefix

  // An old prefix, or one the node never gave out, is FAILED_PRECONDITION.
  delta.delta = full->next_prefix;
  EXPECT_EQ(pipeline_->Infer(delta).status().code(), absl::StatusCode::kFailedPrecondition);
  delta.delta = ClientPrefix{.len = 35, .hash = 1};
  EXPECT_EQ(pipeline_->Infer(delta).status().code(), absl::StatusCode::kFailedPrecondition);
  // Delta without new events scores the candidates over the cached history.
  InferInput none = Input(5, {}, cand);
  none.delta = d->next_prefix;
  auto n = pipeline_->Infer(none);
  ASSERT_TRUE(n.ok()) << n.status();
  EXPECT_EQ(n->computed_tokens, 3u);
  ExpectNear(n->scores, Expected(history, cand));

  // 10 more events would move the window: the client must resend the full history.
  more = Events(rng, 10);
  InferInput trim = Input(5, more, cand);
  trim.delta = n->next_prefix;
  auto t = pipeline_->Infer(trim);
  EXPECT_EQ(t.status().code(), absl::StatusCode::kFailedPrecondition) << t.status();
  EXPECT_NE(t.status().message().find("window"), std::string::npos) << t.status();
  // Evicted K/V: the prefix is no longer held.
  kv_->Evict(5);
  EXPECT_EQ(pipeline_->Infer(none).status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(kv_->CheckInvariants().ok()) << kv_->CheckInvariants();
  EXPECT_EQ(kv_->Info(5).has_value() ? kv_->Info(5)->pins : 0u, 0u);
}

TEST_F(PipelineTest, BadInputsGetClearErrors) {
  Rng rng(4);
  const std::vector<uint64_t> history = Events(rng, 5), cand = Events(rng, 2);
  auto code = [&](InferInput in) { return pipeline_->Infer(in).status().code(); };
  EXPECT_EQ(code(Input(1, history, {})), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(code(Input(1, {1, 2, 3}, cand)), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(code(Input(1, {1000, 0}, cand)), absl::StatusCode::kOutOfRange);
  EXPECT_EQ(code(Input(1, history, {0, 50})), absl::StatusCode::kOutOfRange);
  InferInput late = Input(1, history, cand);
  late.deadline = clock_.Now() - absl::Seconds(1);
  EXPECT_EQ(code(late), absl::StatusCode::kDeadlineExceeded);
  InferInput sketched = Input(1, {}, cand);  // the simulator's field: never the real node's
  sketched.delta = ClientPrefix{.len = 0, .hash = 0};
  sketched.omitted_events = 5;
  EXPECT_EQ(code(sketched), absl::StatusCode::kInvalidArgument);
  absl::StatusOr<InferOutput> r = pipeline_->Infer(Input(1, {1000, 0}, cand));
  EXPECT_NE(r.status().message().find("history[0].feature_ids[0]"), std::string::npos)
      << r.status();
  PipelineOptions small;
  small.max_history = 10;
  small.max_request_events = 20;
  Build(small);
  r = pipeline_->Infer(Input(1, Events(rng, 21), cand));
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find("exceeds the limit 20"), std::string::npos) << r.status();
  EXPECT_TRUE(pipeline_->Infer(Input(1, Events(rng, 20), cand)).ok());  // trimmed, not refused
  runner_.runs = 0;
  EXPECT_EQ(runner_.runs, 0);  // nothing was computed for them
}

TEST_F(PipelineTest, AFailedFetchLeavesTheUsersKvAsItWas) {
  Rng rng(5);
  std::vector<uint64_t> history = Events(rng, 30);
  const std::vector<uint64_t> cand = Events(rng, 2);
  ASSERT_TRUE(pipeline_->Infer(Input(3, history, cand)).ok());
  const std::vector<uint64_t> more = Events(rng, 5);
  history.insert(history.end(), more.begin(), more.end());
  source_.fail = true;
  auto failed = pipeline_->Infer(Input(3, history, Events(rng, 2)));
  EXPECT_EQ(failed.status().code(), absl::StatusCode::kUnavailable) << failed.status();
  source_.fail = false;
  auto r = pipeline_->Infer(Input(3, history, cand));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->cached_prefix_tokens, 30u);  // the failed request appended nothing
  ExpectNear(r->scores, Expected(history, cand));
  EXPECT_TRUE(kv_->CheckInvariants().ok()) << kv_->CheckInvariants();
  EXPECT_EQ(emb_->GetStats().pending_entries, 0u);
  // The second table's fetch fails after the first table's misses were reserved and copied:
  // those reservations are released, not left pending.
  source_.fail_from_call = source_.fetches + 1;
  auto partial = pipeline_->Infer(Input(4, Events(rng, 40), Events(rng, 3)));
  EXPECT_EQ(partial.status().code(), absl::StatusCode::kUnavailable) << partial.status();
  source_.fail_from_call = -1;
  EXPECT_EQ(emb_->GetStats().pending_entries, 0u);
  EXPECT_TRUE(emb_->CheckInvariants().ok()) << emb_->CheckInvariants();
}

// Copies slower than the request's deadline end it with DEADLINE_EXCEEDED at the deadline (not at
// copy_timeout, 10 s); the rows it reserved are committed when their copies land (not left
// pending, which would hold their slots for good), and the next request finds them resident.
TEST_F(PipelineTest, SlowCopiesEndTheRequestAtItsDeadlineAndSettleWhenTheyLand) {
  using ::testing::HasSubstr;
  Build({}, 16, {.bytes_per_second = 1e10, .latency = absl::Seconds(1)});
  Rng rng(11);
  const std::vector<uint64_t> history = Events(rng, 20), cand = Events(rng, 2);
  InferInput in = Input(6, history, cand);
  in.deadline = clock_.Now() + absl::Milliseconds(100);
  const absl::Time start = absl::Now();
  auto late = pipeline_->Infer(in);
  const absl::Duration took = absl::Now() - start;
  EXPECT_EQ(late.status().code(), absl::StatusCode::kDeadlineExceeded) << late.status();
  EXPECT_THAT(std::string(late.status().message()), HasSubstr("while copying embedding rows"));
  EXPECT_LT(took, absl::Milliseconds(800));         // the copy's latency is 1 s
  EXPECT_GT(emb_->GetStats().pending_entries, 0u);  // still in flight
  const absl::Time give_up = absl::Now() + absl::Seconds(30);
  while (emb_->GetStats().pending_entries > 0 && absl::Now() < give_up) {
    absl::SleepFor(absl::Milliseconds(10));
  }
  EXPECT_EQ(emb_->GetStats().pending_entries, 0u);
  EXPECT_GT(emb_->GetStats().entries, 0u);
  EXPECT_TRUE(emb_->CheckInvariants().ok()) << emb_->CheckInvariants();
  // Without a deadline the same request is served, from the rows the late copies committed.
  auto r = pipeline_->Infer(Input(6, history, cand));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_GT(r->emb_hits, 0u);
  ExpectNear(r->scores, Expected(history, cand));
}

// A runner that throws (libtorch's c10::Error, bad_alloc) fails its batch with INTERNAL, every
// request once, and leaves the users' K/V as it was: the node goes on serving.
TEST_F(PipelineTest, ARunnerThatThrowsFailsItsBatchAndTheNodeGoesOn) {
  Rng rng(8);
  std::vector<uint64_t> history = Events(rng, 30);
  const std::vector<uint64_t> cand = Events(rng, 2);
  ASSERT_TRUE(pipeline_->Infer(Input(3, history, cand)).ok());
  const std::vector<uint64_t> more = Events(rng, 5);
  history.insert(history.end(), more.begin(), more.end());
  runner_.throw_next = true;
  const std::vector<InferInput> batch = {Input(3, history, cand), Input(5, Events(rng, 12), cand)};
  std::vector<absl::StatusOr<InferOutput>> r = pipeline_->InferBatch(batch);
  ASSERT_EQ(r.size(), 2u);
  for (const auto& one : r) {
    EXPECT_EQ(one.status().code(), absl::StatusCode::kInternal) << one.status();
    EXPECT_NE(one.status().message().find("the fake runner threw"), std::string::npos);
  }
  auto again = pipeline_->Infer(Input(3, history, cand));
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(again->cached_prefix_tokens, 30u);  // the failed batch appended nothing
  ExpectNear(again->scores, Expected(history, cand));
  EXPECT_TRUE(kv_->CheckInvariants().ok()) << kv_->CheckInvariants();
  EXPECT_EQ(emb_->GetStats().pending_entries, 0u);
}

// No KV room: every other user holding pages is pinned. The answer says so; nothing leaks.
TEST_F(PipelineTest, NoKvRoomIsResourceExhausted) {
  Rng rng(8);
  const std::vector<uint64_t> cand = Events(rng, 1);
  for (uint64_t user : {1, 2}) {  // 1000 events = 16 pages each: the 32-page KV budget
    ASSERT_TRUE(pipeline_->Infer(Input(user, Events(rng, 1000), cand)).ok());
    kv_->Pin(user);
  }
  auto r = pipeline_->Infer(Input(3, Events(rng, 100), cand));
  EXPECT_EQ(r.status().code(), absl::StatusCode::kResourceExhausted) << r.status();
  for (uint64_t user : {1, 2}) ASSERT_TRUE(kv_->Unpin(user).ok());
  EXPECT_TRUE(pipeline_->Infer(Input(3, Events(rng, 100), cand)).ok());  // room again
  EXPECT_TRUE(kv_->CheckInvariants().ok()) << kv_->CheckInvariants();
}

// Another append of the same user stays in flight: the request retries, then answers ABORTED.
TEST_F(PipelineTest, AnAppendThatKeepsConflictingIsAborted) {
  Rng rng(9);
  const std::vector<uint64_t> history = Events(rng, 10);
  std::vector<uint64_t> tokens;
  for (size_t j = 0; j < 10; ++j) {
    tokens.push_back(EventToken(std::span<const uint64_t>(history).subspan(j * 2, 2)));
  }
  kv_->Pin(5);
  auto other = kv_->Append(5, KvPrefix{}, tokens);
  ASSERT_TRUE(other.ok()) << other.status();
  auto r = pipeline_->Infer(Input(5, history, Events(rng, 1)));
  EXPECT_EQ(r.status().code(), absl::StatusCode::kAborted) << r.status();
  ASSERT_TRUE(kv_->AbortAppend(5, other->prefix).ok());
  ASSERT_TRUE(kv_->Unpin(5).ok());
  EXPECT_TRUE(pipeline_->Infer(Input(5, history, Events(rng, 1))).ok());
  EXPECT_TRUE(kv_->CheckInvariants().ok()) << kv_->CheckInvariants();
}

// Requests that arrive together: one model call per round, a bad request fails alone, and a
// user's second request in the batch runs after its first and reuses its tokens.
TEST_F(PipelineTest, ABatchAnswersEveryRequestOnce) {
  Rng rng(6);
  const std::vector<uint64_t> h1 = Events(rng, 40), h2 = Events(rng, 25), cand = Events(rng, 3);
  std::vector<uint64_t> h1_longer = h1;
  const std::vector<uint64_t> more = Events(rng, 6);
  h1_longer.insert(h1_longer.end(), more.begin(), more.end());
  const std::vector<InferInput> batch = {Input(1, h1, cand), Input(2, h2, cand),
                                         Input(1, h1_longer, cand), Input(3, {1000, 0}, cand),
                                         Input(4, Events(rng, 10), {})};
  std::vector<absl::StatusOr<InferOutput>> r = pipeline_->InferBatch(batch);
  ASSERT_EQ(r.size(), batch.size());
  ASSERT_TRUE(r[0].ok()) << r[0].status();
  ASSERT_TRUE(r[1].ok()) << r[1].status();
  ASSERT_TRUE(r[2].ok()) << r[2].status();
  EXPECT_EQ(r[3].status().code(), absl::StatusCode::kOutOfRange);
  EXPECT_EQ(r[4].status().code(), absl::StatusCode::kInvalidArgument);
  ExpectNear(r[0]->scores, Expected(h1, cand));
  ExpectNear(r[1]->scores, Expected(h2, cand));
  ExpectNear(r[2]->scores, Expected(h1_longer, cand));
  EXPECT_EQ(r[2]->cached_prefix_tokens, 40u);  // ran after user 1's first request committed
  EXPECT_EQ(runner_.batches, 2);               // users 1 and 2 together, then user 1 again
  EXPECT_EQ(runner_.runs, 3);
  EXPECT_TRUE(kv_->CheckInvariants().ok()) << kv_->CheckInvariants();
}

// Many clients at once: every request answered once and correctly, in batches.
TEST_F(PipelineTest, QueueBatchesConcurrentRequests) {
  auto queue = *RequestQueue::Create({.max_batch = 8, .batch_window = absl::Milliseconds(5)},
                                     *pipeline_, clock_);
  std::vector<std::thread> clients;
  std::atomic<int> correct{0};
  for (int t = 0; t < 4; ++t) {
    clients.emplace_back([&, t] {
      Rng rng(100 + t);
      for (int i = 0; i < 10; ++i) {
        const std::vector<uint64_t> h = Events(rng, 5 + rng() % 30), c = Events(rng, 2);
        auto r = queue->Infer(Input(static_cast<uint64_t>(t * 100 + i), h, c));
        if (!r.ok()) continue;
        const std::vector<float> want = Expected(h, c);
        bool same = r->scores.size() == want.size();
        for (size_t k = 0; same && k < want.size(); ++k) {
          same = std::abs(r->scores[k] - want[k]) <= 1e-3;
        }
        correct += same;
      }
    });
  }
  for (auto& t : clients) t.join();
  EXPECT_EQ(correct, 40);
  RequestQueueStats s = queue->stats();
  EXPECT_EQ(s.submitted, 40u);
  EXPECT_EQ(s.batched_requests, 40u);
  EXPECT_LE(s.batches, 40u);
  EXPECT_EQ(runner_.runs, 40);
}

// A lone request at low load does not wait out the batch window; with the adaptive window off it
// does.
TEST_F(PipelineTest, AdaptiveWindowSkipsTheWaitAtLowLoad) {
  Rng rng(9);
  for (bool adaptive : {true, false}) {
    auto queue = *RequestQueue::Create(
        {.max_batch = 8, .batch_window = absl::Milliseconds(50), .adaptive_window = adaptive},
        *pipeline_, clock_);
    for (int i = 0; i < 3; ++i) {
      ASSERT_TRUE(queue->Infer(Input(1, Events(rng, 4), Events(rng, 1))).ok());
      absl::SleepFor(absl::Milliseconds(60));  // arrivals further apart than the window
    }
    EXPECT_EQ(queue->stats().windows_waited, adaptive ? 0u : 3u) << adaptive;
  }
}

// Overload, deadlines while queued and draining: each request still gets exactly one answer.
TEST_F(PipelineTest, QueueOverloadDeadlinesAndDrain) {
  auto queue = *RequestQueue::Create({.max_batch = 1, .max_queue = 2, .batch_window = {}},
                                     *pipeline_, clock_);
  Rng rng(7);
  runner_.SetGate(false);  // the model holds the first request
  absl::Mutex mu;
  std::vector<absl::StatusCode> codes;
  auto record = [&](absl::StatusOr<InferOutput> r) {
    absl::MutexLock lock(&mu);
    codes.push_back(r.status().code());
  };
  queue->Submit(Input(1, Events(rng, 5), Events(rng, 1)), record);  // taken by the worker
  // Wait until the worker holds it, so the queue below is exactly what waits.
  for (int i = 0; i < 1000 && queue->stats().depth != 0; ++i) absl::SleepFor(absl::Milliseconds(1));
  InferInput soon = Input(2, Events(rng, 5), Events(rng, 1));
  soon.deadline = clock_.Now() + absl::Milliseconds(20);
  queue->Submit(soon, record);                                      // expires while queued
  queue->Submit(Input(3, Events(rng, 5), Events(rng, 1)), record);  // waits, then runs
  queue->Submit(Input(4, Events(rng, 5), Events(rng, 1)), record);  // queue full: overload
  absl::SleepFor(absl::Milliseconds(40));
  runner_.SetGate(true);
  queue->Drain();
  queue->Submit(Input(5, Events(rng, 5), Events(rng, 1)), record);  // draining: unavailable
  absl::MutexLock lock(&mu);
  std::vector<absl::StatusCode> sorted = codes;
  std::sort(sorted.begin(), sorted.end());
  EXPECT_EQ(sorted,
            (std::vector<absl::StatusCode>{
                absl::StatusCode::kOk, absl::StatusCode::kOk, absl::StatusCode::kDeadlineExceeded,
                absl::StatusCode::kResourceExhausted, absl::StatusCode::kUnavailable}));
  RequestQueueStats s = queue->stats();
  EXPECT_EQ(s.rejected_overload, 1u);
  EXPECT_EQ(s.rejected_draining, 1u);
  EXPECT_EQ(s.expired, 1u);
  EXPECT_EQ(RequestQueue::Create({.max_batch = 0}, *pipeline_, clock_).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST_F(PipelineTest, QueueRefusesWhileItsOldestRequestHasWaitedTooLong) {
  auto queue = *RequestQueue::Create(
      {.max_batch = 1, .max_queue = 100, .max_delay = absl::Milliseconds(30), .batch_window = {}},
      *pipeline_, clock_);
  Rng rng(8);
  runner_.SetGate(false);  // the model holds the first request
  absl::Mutex mu;
  std::vector<absl::StatusCode> codes;
  int marked_late = 0;  // refusals carrying the late-shed mark (common/shed.h)
  auto record = [&](absl::StatusOr<InferOutput> r) {
    absl::MutexLock lock(&mu);
    codes.push_back(r.status().code());
    marked_late += IsShedLate(r.status());
  };
  queue->Submit(Input(1, Events(rng, 5), Events(rng, 1)), record);  // taken by the worker
  for (int i = 0; i < 1000 && queue->stats().depth != 0; ++i) absl::SleepFor(absl::Milliseconds(1));
  queue->Submit(Input(2, Events(rng, 5), Events(rng, 1)), record);  // admitted: the queue is young
  queue->Submit(Input(3, Events(rng, 5), Events(rng, 1)), record);  // admitted too
  absl::SleepFor(absl::Milliseconds(50));
  queue->Submit(Input(4, Events(rng, 5), Events(rng, 1)), record);  // behind by 50 ms: refused
  runner_.SetGate(true);
  queue->Drain();
  {
    // 2 and 3 had waited 50 ms when their turn came: shed then, not served late.
    absl::MutexLock lock(&mu);
    std::vector<absl::StatusCode> sorted = codes;
    std::sort(sorted.begin(), sorted.end());
    EXPECT_EQ(sorted,
              (std::vector<absl::StatusCode>{
                  absl::StatusCode::kOk, absl::StatusCode::kResourceExhausted,
                  absl::StatusCode::kResourceExhausted, absl::StatusCode::kResourceExhausted}));
    // The two shed at dequeue are marked late (the router does not retry them elsewhere); the
    // one refused at admission is not.
    EXPECT_EQ(marked_late, 2);
  }
  const RequestQueueStats s = queue->stats();
  EXPECT_EQ(s.rejected_delay, 1u);
  EXPECT_EQ(s.shed_late, 2u);
  EXPECT_EQ(s.rejected_overload, 3u);
  EXPECT_EQ(s.batches, 1u);  // only request 1 ran the model
  EXPECT_EQ(
      RequestQueue::Create({.max_delay = absl::ZeroDuration()}, *pipeline_, clock_).status().code(),
      absl::StatusCode::kInvalidArgument);
}

TEST_F(PipelineTest, RejectsAMismatchedSetup) {
  PipelineOptions o;
  o.features = {{.table_id = 5, .rows = 10}};
  EXPECT_EQ(Pipeline::Create(o, *kv_, *emb_, *device_, device_->pool_data(), source_, runner_,
                             nullptr, clock_)
                .status()
                .code(),
            absl::StatusCode::kInvalidArgument);
  o.features = kFeatures;
  o.max_history = 5000;
  EXPECT_EQ(Pipeline::Create(o, *kv_, *emb_, *device_, device_->pool_data(), source_, runner_,
                             nullptr, clock_)
                .status()
                .code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace hlem::serving
