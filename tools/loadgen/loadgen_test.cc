#include <atomic>
#include <filesystem>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/synchronization/mutex.h"
#include "common/grpc_server.h"
#include "gtest/gtest.h"
#include "hlem/v1/router.grpc.pb.h"
#include "prometheus/text_serializer.h"
#include "sim/workload/trace.h"
#include "sim/workload/workload_testing.h"
#include "tools/loadgen/loadgen_metrics.h"
#include "tools/loadgen/replayer.h"
#include "tools/loadgen/summary.h"

namespace hlem::loadgen {
namespace {

namespace v1 = ::hlem::v1;

// A router that answers after `delay`: UNAVAILABLE for users ≡ 3 (mod 10); a delta request is
// served only when its prefix is the one answered last for that user, and every user ≡ 5 (mod 10)
// has its first delta refused (the node lost the prefix).
class FakeRouter final : public v1::Router::Service {
 public:
  explicit FakeRouter(absl::Duration delay) : delay_(delay) {}
  grpc::Status Recommend(grpc::ServerContext*, const v1::RecommendRequest* req,
                         v1::RecommendResponse* resp) override {
    absl::SleepFor(delay_);
    if (req->user_id() % 10 == 3) return {grpc::StatusCode::UNAVAILABLE, "no node"};
    absl::MutexLock lock(&mu_);
    uint64_t& known = length_[req->user_id()];
    uint64_t total = static_cast<uint64_t>(req->history_size());
    if (req->has_delta() && req->delta().length() > 0) {
      ++deltas_;
      // As a node: served only when its last answer for the user named that prefix (another
      // request of the user may have overtaken this one).
      if (req->delta().length() != known || req->delta().hash() != known * 7) {
        return {grpc::StatusCode::FAILED_PRECONDITION, "not the last prefix"};
      }
      if (req->user_id() % 10 == 5 && refused_.insert(req->user_id()).second) {
        return {grpc::StatusCode::FAILED_PRECONDITION, "prefix not held"};
      }
      total += known;
    }
    for (const v1::Event& e : req->history()) {
      if (e.feature_ids_size() != 2) return {grpc::StatusCode::INVALID_ARGUMENT, "features"};
    }
    known = total;
    resp->mutable_next_prefix()->set_length(static_cast<uint32_t>(total));
    resp->mutable_next_prefix()->set_hash(total * 7);
    resp->set_node_id("fake");
    resp->set_computed_tokens(static_cast<uint32_t>(req->candidates_size()));
    resp->mutable_scores()->Resize(req->candidates_size(), 0.5f);
    return grpc::Status::OK;
  }
  uint64_t deltas() {
    absl::MutexLock lock(&mu_);
    return deltas_;
  }

 private:
  const absl::Duration delay_;
  absl::Mutex mu_;
  absl::flat_hash_map<uint64_t, uint64_t> length_;
  absl::flat_hash_set<uint64_t> refused_;
  uint64_t deltas_ = 0;
};

class LoadgenTest : public ::testing::Test {
 protected:
  void Serve(absl::Duration delay) {
    router_ = std::make_unique<FakeRouter>(delay);
    GrpcServerOptions o;
    o.listen = "127.0.0.1:0";
    server_ = *GrpcServer::Create(o, {router_.get()});
  }
  std::string Trace(double rate, absl::Duration duration) {
    sim::WorkloadConfig c = sim::testing::TinyWorkload();
    c.users = 2000;
    c.hot_users = 20;
    c.candidates = 3;
    c.rate = rate;
    c.window = absl::Seconds(1);
    c.phases = {{.regime = sim::Regime::kSteady, .duration = duration, .hot_ratio = 0.6}};
    path_ = ::testing::TempDir() + "/hlem_loadgen_" + std::to_string(getpid()) + ".trace";
    auto g = *sim::WorkloadGenerator::Create(c);
    EXPECT_TRUE(sim::WriteTrace(*g, path_).ok());
    return path_;
  }
  void TearDown() override {
    if (!path_.empty()) std::filesystem::remove(path_);
  }
  std::vector<Outcome> Run(ReplayOptions o) {
    o.router = "127.0.0.1:" + std::to_string(server_->port());
    auto reader = *sim::TraceReader::Open(path_);
    std::vector<Outcome> out;
    EXPECT_TRUE(Replay(*reader, o, &out).ok());
    EXPECT_EQ(out.size(), reader->records());
    EXPECT_TRUE(Check(out).ok());
    return out;
  }
  std::unique_ptr<FakeRouter> router_;
  std::unique_ptr<GrpcServer> server_;
  std::string path_;
};

TEST_F(LoadgenTest, EveryRequestGetsOneOutcomeInFullAndDeltaMode) {
  Serve(absl::Milliseconds(1));
  Trace(400, absl::Seconds(2));
  for (bool delta : {false, true}) {
    const std::vector<Outcome> out = Run({.speed = 4, .delta = delta});
    uint64_t ok = 0, unavailable = 0, deltas = 0, resent = 0;
    for (size_t i = 0; i < out.size(); ++i) {
      EXPECT_EQ(out[i].index, i);
      EXPECT_TRUE(out[i].sent);
      if (out[i].user % 10 == 3) {
        EXPECT_EQ(out[i].code, static_cast<int>(absl::StatusCode::kUnavailable));
        ++unavailable;
        continue;
      }
      EXPECT_EQ(out[i].code, 0) << out[i].message;
      ++ok;
      deltas += out[i].delta;
      resent += out[i].resent;
      if (i > 0) {
        EXPECT_GE(out[i].scheduled_ns, out[i - 1].scheduled_ns);
      }
    }
    EXPECT_GT(ok, 500u);
    EXPECT_GT(unavailable, 0u);
    if (delta) {
      EXPECT_GT(deltas, ok / 4) << "returning users go in delta mode";
      EXPECT_GT(resent, 0u);  // refused deltas were resent in full
    } else {
      EXPECT_EQ(deltas, 0u);
    }
    const Report r = Summarize(out, 250'000'000, 50);
    EXPECT_EQ(r.overall.requests, out.size());
    EXPECT_EQ(r.overall.ok, ok);
    EXPECT_EQ(r.overall.codes.at("UNAVAILABLE"), unavailable);
    EXPECT_GE(r.windows.size(), 2u);
  }
}

TEST_F(LoadgenTest, TheInFlightCapRefusesWithoutSending) {
  Serve(absl::Milliseconds(50));
  Trace(200, absl::Seconds(1));
  std::atomic<uint64_t> observed{0};
  const std::vector<Outcome> out =
      Run({.max_in_flight = 2, .on_outcome = [&](const Outcome&) { ++observed; }});
  EXPECT_EQ(observed.load(), out.size()) << "on_outcome sees every outcome once, refused ones too";
  uint64_t refused = 0;
  for (const Outcome& o : out) {
    if (!o.sent) {
      ++refused;
      EXPECT_EQ(o.code, static_cast<int>(absl::StatusCode::kResourceExhausted));
    }
  }
  EXPECT_GT(refused, out.size() / 2);
}

TEST(LoadgenMetricsTest, CountsByRegimeAgreeWithTheSummary) {
  const std::vector<PhaseSpan> phases = {{"steady", 0, 10'000'000'000},
                                         {"burst", 10'000'000'000, 20'000'000'000}};
  std::vector<Outcome> outcomes;
  auto add = [&](uint64_t at_s, double ms, absl::StatusCode code) {
    outcomes.push_back({.index = outcomes.size(),
                        .scheduled_ns = at_s * 1'000'000'000,
                        .latency_ns = static_cast<uint64_t>(ms * 1e6),
                        .code = static_cast<int>(code)});
  };
  add(1, 10, absl::StatusCode::kOk);                // steady, met
  add(2, 50, absl::StatusCode::kOk);                // steady, missed (slow)
  add(11, 20, absl::StatusCode::kOk);               // burst, met (at the SLO)
  add(12, 1, absl::StatusCode::kDeadlineExceeded);  // burst, missed (failed)
  add(25, 1, absl::StatusCode::kOk);                // after the phases
  MetricsRegistry registry;
  LoadgenMetrics metrics(registry, phases, /*slo_ms=*/20);
  for (const Outcome& o : outcomes) metrics.Observe(o);
  const std::string text = prometheus::TextSerializer().Serialize(registry.registry()->Collect());
  for (const char* line : {
           "hlem_loadgen_slo_requests_total{regime=\"steady\",result=\"met\"} 1",
           "hlem_loadgen_slo_requests_total{regime=\"steady\",result=\"missed\"} 1",
           "hlem_loadgen_slo_requests_total{regime=\"burst\",result=\"met\"} 1",
           "hlem_loadgen_slo_requests_total{regime=\"burst\",result=\"missed\"} 1",
           "hlem_loadgen_slo_requests_total{regime=\"none\",result=\"met\"} 1",
           "hlem_loadgen_requests_total{code=\"DEADLINE_EXCEEDED\",regime=\"burst\"} 1",
           "hlem_loadgen_request_duration_seconds_count{regime=\"steady\"} 2",
           "hlem_loadgen_request_duration_seconds_count{regime=\"burst\"} 1",
           "hlem_loadgen_request_duration_seconds_bucket{regime=\"burst\",le=\"0.02\"} 1",
           "hlem_loadgen_phase{regime=\"steady\"} 0",
           "hlem_loadgen_phase{regime=\"burst\"} 1",
       }) {
    EXPECT_NE(text.find(line), std::string::npos) << line << " not in\n" << text;
  }
  // The same SLO test as the summary's.
  const Report report = Summarize(outcomes, 5'000'000'000, 20, 0, phases);
  ASSERT_EQ(report.phases.size(), 2u);
  EXPECT_DOUBLE_EQ(report.phases[0].summary.slo_satisfaction, 0.5);
  EXPECT_DOUBLE_EQ(report.phases[1].summary.slo_satisfaction, 0.5);
}

TEST(SummaryTest, QuantilesSloAndCodes) {
  std::vector<Outcome> out;
  for (int i = 0; i < 100; ++i) {
    out.push_back({.index = static_cast<uint64_t>(i),
                   .scheduled_ns = static_cast<uint64_t>(i) * 10'000'000,  // 1 s in all
                   .sent_ns = static_cast<uint64_t>(i) * 10'000'000,
                   .latency_ns = static_cast<uint64_t>(i + 1) * 1'000'000,  // 1..100 ms
                   .code = 0,
                   .candidates = 10,
                   .cached_prefix_tokens = 30,
                   .computed_tokens = 20});
  }
  out[99].code = static_cast<int>(absl::StatusCode::kDeadlineExceeded);
  const Report r = Summarize(out, 500'000'000, 50);
  EXPECT_EQ(r.overall.requests, 100u);
  EXPECT_EQ(r.overall.ok, 99u);
  EXPECT_DOUBLE_EQ(r.overall.p50_ms, 50);
  EXPECT_DOUBLE_EQ(r.overall.p99_ms, 99);
  EXPECT_DOUBLE_EQ(r.overall.slo_satisfaction, 0.5);  // 1..50 ms of 100 requests
  EXPECT_DOUBLE_EQ(r.overall.kv_reuse, 0.75);         // 30 cached of 30 + 10 new
  EXPECT_EQ(r.overall.codes.at("DEADLINE_EXCEEDED"), 1u);
  ASSERT_EQ(r.windows.size(), 2u);
  EXPECT_EQ(r.windows[0].requests, 50u);
  EXPECT_DOUBLE_EQ(r.windows[0].slo_satisfaction, 1.0);
  EXPECT_NE(OutcomesCsv(out).find("DEADLINE_EXCEEDED"), std::string::npos);
  EXPECT_NE(WindowsCsv(r).find("window,requests"), std::string::npos);
  std::vector<Outcome> missing(1);
  EXPECT_FALSE(Check(missing).ok());
}

// Phases split the requests by scheduled time after the warm-up: the warm-up clips the first
// phase's span, a request at a span's end belongs to the next phase, and each phase's throughput
// is its OK answers per second of its (clipped) span.
TEST(SummaryTest, PhaseSpansFollowTheTracesPhasesAtTheReplaySpeed) {
  const std::vector<sim::Phase> phases = {
      {.regime = sim::Regime::kSteady, .duration = absl::Seconds(10)},
      {.regime = sim::Regime::kTrend, .duration = absl::Seconds(20)},
      {.regime = sim::Regime::kBurst, .duration = absl::Milliseconds(1500)}};
  const std::vector<PhaseSpan> spans = PhaseSpans(phases, 2.0);
  ASSERT_EQ(spans.size(), 3u);
  EXPECT_EQ(spans[0].name, "steady");
  EXPECT_EQ(spans[0].start_ns, 0u);
  EXPECT_EQ(spans[0].end_ns, 5'000'000'000u);
  EXPECT_EQ(spans[1].name, "trend");
  EXPECT_EQ(spans[1].start_ns, 5'000'000'000u);
  EXPECT_EQ(spans[1].end_ns, 15'000'000'000u);
  EXPECT_EQ(spans[2].name, "burst");
  EXPECT_EQ(spans[2].end_ns, 15'750'000'000u);
  EXPECT_TRUE(PhaseSpans({}, 1.0).empty());
}

TEST(SummaryTest, PhasesSplitByScheduledTimeAfterTheWarmUp) {
  std::vector<Outcome> out;
  for (int i = 0; i < 100; ++i) {  // one request every 10 ms, 1 s in all
    out.push_back({.index = static_cast<uint64_t>(i),
                   .scheduled_ns = static_cast<uint64_t>(i) * 10'000'000,
                   .sent_ns = static_cast<uint64_t>(i) * 10'000'000,
                   .latency_ns = static_cast<uint64_t>(i < 50 ? 5 : 80) * 1'000'000,
                   .code = 0});
  }
  out[70].code = static_cast<int>(absl::StatusCode::kUnavailable);
  const Report r = Summarize(out, 500'000'000, 50, 200'000'000,
                             {{"steady", 0, 500'000'000}, {"burst", 500'000'000, 1'000'000'000}});
  ASSERT_EQ(r.phases.size(), 2u);
  const Summary& steady = r.phases[0].summary;
  const Summary& burst = r.phases[1].summary;
  EXPECT_EQ(r.phases[0].span.start_ns, 200'000'000u);  // clipped by the warm-up
  EXPECT_EQ(steady.requests, 30u);                     // 200..490 ms
  EXPECT_DOUBLE_EQ(steady.p99_ms, 5);
  EXPECT_DOUBLE_EQ(steady.slo_satisfaction, 1.0);
  EXPECT_DOUBLE_EQ(steady.throughput, 30 / 0.3);
  EXPECT_EQ(burst.requests, 50u);  // 500..990 ms
  EXPECT_EQ(burst.ok, 49u);
  EXPECT_DOUBLE_EQ(burst.p50_ms, 80);
  EXPECT_DOUBLE_EQ(burst.slo_satisfaction, 0.0);
  EXPECT_DOUBLE_EQ(burst.throughput, 49 / 0.5);
  EXPECT_EQ(steady.requests + burst.requests, r.overall.requests);
  const std::string csv = PhasesCsv(r);
  EXPECT_NE(csv.find("steady,0.200,0.500,30,30,"), std::string::npos) << csv;
  EXPECT_NE(csv.find("burst,0.500,1.000,50,49,"), std::string::npos) << csv;
  EXPECT_NE(FormatReport(r, 50).find("burst"), std::string::npos);
}

}  // namespace
}  // namespace hlem::loadgen
