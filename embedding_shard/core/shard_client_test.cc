#include "embedding_shard/core/shard_client.h"

#include <cstring>
#include <functional>
#include <vector>

#include "common/clock.h"
#include "embedding_shard/core/shard_store.h"
#include "gtest/gtest.h"

namespace hlem::shard {
namespace {

// Serves reads from real ShardStores; servers can be made to fail or hang.
class FakeTransport final : public ShardTransport {
 public:
  enum class Mode { kUp, kRefuse, kHang };
  explicit FakeTransport(std::vector<std::unique_ptr<ShardStore>> stores)
      : stores_(std::move(stores)), mode_(stores_.size(), Mode::kUp), map_(stores_[0]->map()) {}
  std::string name() const override { return "fake"; }
  uint32_t num_servers() const override { return static_cast<uint32_t>(stores_.size()); }
  absl::StatusOr<std::unique_ptr<Pending>> Start(uint32_t server, const TableSpec& spec,
                                                 const ReadBatch& batch, absl::Time) override {
    auto rows = batch.rows;
    auto dst = batch.dst;
    for (size_t i = 0; i < rows.size(); ++i) {
      if (batch.slots[i] != map_.SlotOfRow(spec, rows[i])) return absl::InternalError("bad slot");
    }
    ++starts;
    max_rows_seen = std::max(max_rows_seen, rows.size());
    if (mode_[server] == Mode::kRefuse) return absl::UnavailableError("connection refused");
    auto p = std::make_unique<FakePending>();
    p->server = server;
    if (mode_[server] == Mode::kUp) {
      std::vector<std::byte> out(rows.size() * spec.row_bytes());
      p->status = stores_[server]->Gather(spec.id, rows, out);
      if (p->status.ok()) {
        for (size_t i = 0; i < rows.size(); ++i) {
          std::memcpy(dst[i], out.data() + i * spec.row_bytes(), spec.row_bytes());
        }
      }
    }
    return p;
  }
  absl::Status Finish(Pending& pending, absl::Time) override {
    auto& p = static_cast<FakePending&>(pending);
    if (on_finish) {
      if (absl::Status st = on_finish(p.server); !st.ok()) return st;
    }
    if (mode_[p.server] == Mode::kHang) return absl::DeadlineExceededError("no answer");
    return p.status;
  }
  absl::Status Probe(uint32_t server, absl::Time) override {
    ++probes;
    return mode_[server] == Mode::kUp ? absl::OkStatus() : absl::UnavailableError("down");
  }
  absl::Status Reconnect(uint32_t) override {
    ++reconnects;
    return fail_reconnect ? absl::UnavailableError("warm-up timed out") : absl::OkStatus();
  }
  void Set(uint32_t server, Mode mode) { mode_[server] = mode; }

  int starts = 0, probes = 0, reconnects = 0;
  bool fail_reconnect = false;
  // Runs first in Finish; a status other than OK is then Finish's.
  std::function<absl::Status(uint32_t server)> on_finish;
  size_t max_rows_seen = 0;

 private:
  struct FakePending : Pending {
    uint32_t server = 0;
    absl::Status status;
  };
  std::vector<std::unique_ptr<ShardStore>> stores_;
  std::vector<Mode> mode_;
  ShardMap map_;
};

class CountingObserver final : public ShardClientObserver {
 public:
  void OnFetch(size_t rows, size_t bytes, absl::Duration, absl::StatusCode code) override {
    ++fetches;
    if (code == absl::StatusCode::kOk) {
      this->rows += rows;
      this->bytes += bytes;
    } else {
      ++errors;
    }
  }
  void OnFailover() override { ++failovers; }
  void OnServerHealth(uint32_t server, bool healthy) override {
    health.push_back({server, healthy});
  }
  int fetches = 0, errors = 0, failovers = 0;
  size_t rows = 0, bytes = 0;
  std::vector<std::pair<uint32_t, bool>> health;
};

class ShardClientTest : public ::testing::Test {
 protected:
  void Build(uint32_t replicas, absl::Duration probe_interval = absl::ZeroDuration()) {
    ShardStoreOptions o;
    o.tables = {TableSpec{.id = 1, .name = "item", .rows = 5000, .dim = 6, .dtype = Dtype::kFp32}};
    o.map = {.num_shards = 3, .partitioning = Partitioning::kHash, .replicas = replicas};
    o.content.seed = 3;
    o.max_batch_rows = 64;
    std::vector<std::unique_ptr<ShardStore>> stores;
    for (uint32_t s = 0; s < 3; ++s) {
      o.server_index = s;
      stores.push_back(*ShardStore::Create(o, heap_));
    }
    auto transport = std::make_unique<FakeTransport>(std::move(stores));
    fake_ = transport.get();
    observer_ = std::make_shared<CountingObserver>();
    ShardClientOptions c{.tables = o.tables,
                         .map = o.map,
                         .max_batch_rows = 64,
                         .probe_interval = probe_interval,
                         .observer = observer_};
    client_ = *ShardClient::Create(c, std::move(transport), clock_);
    spec_ = o.tables[0];
    seed_ = o.content.seed;
  }

  // Fetches `n` rows and checks every byte against the generator.
  absl::Status FetchAndCheck(size_t n) {
    std::vector<uint64_t> rows(n);
    for (size_t i = 0; i < n; ++i) rows[i] = (i * 7919) % spec_.rows;
    std::vector<std::byte> out(n * spec_.row_bytes());
    absl::Status s = client_->Fetch(1, rows, out, clock_.Now() + absl::Seconds(1));
    if (!s.ok()) return s;
    std::vector<std::byte> expected(spec_.row_bytes());
    for (size_t i = 0; i < n; ++i) {
      GenerateRow(seed_, spec_, rows[i], expected.data());
      if (std::memcmp(out.data() + i * spec_.row_bytes(), expected.data(), spec_.row_bytes())) {
        return absl::InternalError("wrong bytes");
      }
    }
    return absl::OkStatus();
  }

  SimClock clock_;
  HeapAllocator heap_;
  FakeTransport* fake_ = nullptr;
  std::shared_ptr<CountingObserver> observer_;
  std::unique_ptr<ShardClient> client_;
  TableSpec spec_;
  uint64_t seed_ = 0;
};

TEST_F(ShardClientTest, FetchesAcrossServersInChunks) {
  Build(1);
  ASSERT_TRUE(FetchAndCheck(1000).ok());
  EXPECT_LE(fake_->max_rows_seen, 64u);
  EXPECT_GE(fake_->starts, 1000 / 64);
}

TEST_F(ShardClientTest, FailsOverToReplica) {
  Build(2);
  fake_->Set(0, FakeTransport::Mode::kRefuse);
  ASSERT_TRUE(FetchAndCheck(500).ok());
  EXPECT_FALSE(client_->IsHealthy(0));
  EXPECT_EQ(client_->counters().failovers, 1u);
  // Now known down: the next fetch goes straight to replicas.
  int starts = fake_->starts;
  ASSERT_TRUE(FetchAndCheck(10).ok());
  EXPECT_EQ(client_->counters().failovers, 1u);
  EXPECT_GT(fake_->starts, starts);
}

TEST_F(ShardClientTest, ObserverSeesFetchesFailoversAndHealth) {
  Build(2);
  ASSERT_TRUE(FetchAndCheck(100).ok());
  EXPECT_EQ(observer_->fetches, 1);
  EXPECT_EQ(observer_->rows, 100u);
  EXPECT_EQ(observer_->bytes, 100 * spec_.row_bytes());
  fake_->Set(1, FakeTransport::Mode::kRefuse);
  ASSERT_TRUE(FetchAndCheck(100).ok());
  EXPECT_EQ(observer_->failovers, 1);
  ASSERT_EQ(observer_->health.size(), 1u);
  EXPECT_EQ(observer_->health[0], std::make_pair(1u, false));
  std::vector<uint64_t> bad = {5000};
  std::vector<std::byte> out(spec_.row_bytes());
  EXPECT_FALSE(client_->Fetch(1, bad, out, clock_.Now() + absl::Seconds(1)).ok());
  EXPECT_EQ(observer_->errors, 1);
  fake_->Set(1, FakeTransport::Mode::kUp);
  client_->ProbeAll();
  ASSERT_EQ(observer_->health.size(), 2u);
  EXPECT_EQ(observer_->health[1], std::make_pair(1u, true));
}

// A server that answers its probe but cannot reconnect is retried after 0.5 s, 1 s, 2 s, ...,
// not every probe round (a reconnect can hold the transport for seconds); a success resets it.
TEST_F(ShardClientTest, FailedReconnectsBackOff) {
  Build(2);
  fake_->Set(1, FakeTransport::Mode::kRefuse);
  ASSERT_TRUE(FetchAndCheck(100).ok());  // fails over, marks server 1 down
  ASSERT_FALSE(client_->IsHealthy(1));
  fake_->Set(1, FakeTransport::Mode::kUp);
  fake_->fail_reconnect = true;
  auto round = [&](absl::Duration after) {
    clock_.AdvanceBy(after);
    client_->ProbeAll();
    return fake_->reconnects;
  };
  EXPECT_EQ(round(absl::ZeroDuration()), 1);
  EXPECT_EQ(round(absl::ZeroDuration()), 1);
  EXPECT_EQ(round(absl::Milliseconds(499)), 1);
  EXPECT_EQ(round(absl::Milliseconds(1)), 2);    // 0.5 s after the first failure
  EXPECT_EQ(round(absl::Milliseconds(500)), 2);  // now 1 s
  EXPECT_EQ(round(absl::Milliseconds(500)), 3);
  EXPECT_EQ(round(absl::Seconds(1)), 3);  // now 2 s
  fake_->fail_reconnect = false;
  EXPECT_EQ(round(absl::Seconds(1)), 4);
  EXPECT_TRUE(client_->IsHealthy(1));
  // Down again later: the wait starts over.
  fake_->Set(1, FakeTransport::Mode::kRefuse);
  ASSERT_TRUE(FetchAndCheck(100).ok());
  fake_->Set(1, FakeTransport::Mode::kUp);
  fake_->fail_reconnect = true;
  EXPECT_EQ(round(absl::ZeroDuration()), 5);
  EXPECT_EQ(round(absl::Milliseconds(500)), 6);
}

// A read out on a server when it failed, was marked down by another fetch and was reconnected by
// the prober fails (the reconnect closed its endpoint); that failure is from before the server
// came back, so it fails over without marking the server down again (which would close the new
// connection, fail the reads out on it, and so on).
TEST_F(ShardClientTest, AFailureFromBeforeAReconnectDoesNotMarkTheServerDownAgain) {
  Build(2);
  bool once = true;
  fake_->on_finish = [&](uint32_t server) -> absl::Status {
    if (server != 1 || !once) return absl::OkStatus();
    once = false;
    fake_->Set(1, FakeTransport::Mode::kRefuse);
    EXPECT_TRUE(FetchAndCheck(100).ok());  // another fetch: fails over, marks server 1 down
    EXPECT_FALSE(client_->IsHealthy(1));
    fake_->Set(1, FakeTransport::Mode::kUp);
    client_->ProbeAll();  // the prober reconnects it
    EXPECT_TRUE(client_->IsHealthy(1));
    return absl::UnavailableError("shard 1: its endpoint was closed before the answer");
  };
  ASSERT_TRUE(FetchAndCheck(100).ok());  // fails over to the replicas
  EXPECT_FALSE(once);
  EXPECT_TRUE(client_->IsHealthy(1));
  EXPECT_EQ(fake_->reconnects, 1);
  EXPECT_EQ(client_->counters().server_failures, 1u);
}

TEST_F(ShardClientTest, HungServerFailsOverToo) {
  Build(2);
  fake_->Set(2, FakeTransport::Mode::kHang);
  ASSERT_TRUE(FetchAndCheck(500).ok());
  EXPECT_FALSE(client_->IsHealthy(2));
}

TEST_F(ShardClientTest, NoReplicaMeansUnavailable) {
  Build(1);
  fake_->Set(1, FakeTransport::Mode::kRefuse);
  absl::Status s = FetchAndCheck(500);
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable);
  EXPECT_NE(s.message().find("no live replica"), std::string_view::npos) << s;
}

TEST_F(ShardClientTest, BadRequestsAreRejectedWithoutTraffic) {
  Build(1);
  std::vector<uint64_t> rows = {1, 5000};
  std::vector<std::byte> out(2 * spec_.row_bytes());
  absl::Time deadline = clock_.Now() + absl::Seconds(1);
  EXPECT_EQ(client_->Fetch(1, rows, out, deadline).code(), absl::StatusCode::kOutOfRange);
  EXPECT_EQ(client_->Fetch(2, rows, out, deadline).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(client_->Fetch(1, {}, {}, deadline).code(), absl::StatusCode::kInvalidArgument);
  std::vector<std::byte> small(3);
  EXPECT_EQ(client_->Fetch(1, rows, small, deadline).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(fake_->starts, 0);
  std::vector<uint64_t> one = {1};
  std::vector<std::byte> one_out(spec_.row_bytes());
  EXPECT_EQ(client_->Fetch(1, one, one_out, clock_.Now()).code(),
            absl::StatusCode::kDeadlineExceeded);
}

TEST_F(ShardClientTest, ProbesMarkDownAndBringBack) {
  Build(2, absl::Milliseconds(500));
  fake_->Set(1, FakeTransport::Mode::kRefuse);
  clock_.AdvanceBy(absl::Milliseconds(500));
  EXPECT_FALSE(client_->IsHealthy(1));
  EXPECT_EQ(client_->counters().server_failures, 1u);
  fake_->Set(1, FakeTransport::Mode::kUp);
  clock_.AdvanceBy(absl::Milliseconds(500));
  EXPECT_TRUE(client_->IsHealthy(1));
  EXPECT_EQ(fake_->reconnects, 1);
  EXPECT_GE(fake_->probes, 6);
}

}  // namespace
}  // namespace hlem::shard
