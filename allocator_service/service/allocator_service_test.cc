#include "allocator_service/service/allocator_service.h"

#include <gtest/gtest.h>

#include <memory>

#include "allocator_service/core/allocator_testing.h"
#include "allocator_service/service/grpc_nodes.h"

namespace hlem::allocator {
namespace {

// The read-only API over an allocator that ran three rounds against two fake nodes.
class AllocatorServiceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    allocator_ = *Allocator::Create({.epoch = 42, .keep_decisions = 4}, nodes_, clock_, [this] {
      seen_.emplace_back();
      return std::make_unique<testing::IndexController>(&seen_.back());
    });
    for (const char* a : {"10.0.0.1:7001", "10.0.0.2:7001"}) {
      nodes_.Add(a);
      allocator_->AddNode({.address = a, .admin_address = std::string(a) + "-admin"});
    }
    for (int k = 1; k <= 3; ++k) {
      clock_.AdvanceTo(absl::UnixEpoch() + absl::Seconds(5 * k) + absl::Milliseconds(1));
      allocator_->RunRound();
    }
  }
  SimClock clock_{absl::UnixEpoch()};
  testing::FakeNodes nodes_{clock_, absl::Seconds(5)};
  std::deque<std::vector<uint64_t>> seen_;
  std::unique_ptr<Allocator> allocator_;
};

TEST_F(AllocatorServiceTest, StatusNamesEveryNodeWithItsAlphaAndLastDecision) {
  AllocatorServiceImpl service(*allocator_, {.controller = "index", .bounds = {0.2, 0.8}});
  hlem::v1::GetStatusResponse status;
  ASSERT_TRUE(service.GetStatus(nullptr, nullptr, &status).ok());
  EXPECT_EQ(status.controller(), "index");
  EXPECT_EQ(status.allocator_epoch(), 42u);
  EXPECT_EQ(status.decisions_total(), 6u);
  EXPECT_DOUBLE_EQ(status.alpha_min(), 0.2);
  ASSERT_EQ(status.nodes_size(), 2);
  for (const hlem::v1::NodeAllocation& n : status.nodes()) {
    EXPECT_TRUE(n.reachable());
    EXPECT_NEAR(n.alpha(), 0.12, 1e-12);  // window 2
    EXPECT_EQ(n.last_decision().window_index(), 2u);
    EXPECT_TRUE(n.last_decision().applied());
    EXPECT_EQ(n.last_decision().reason(), hlem::v1::DECISION_REASON_POLICY);
    EXPECT_EQ(n.last_decision().features_size(), kNumFeatures);
  }
}

TEST_F(AllocatorServiceTest, DecisionsFollowAfterAnIdAndBadRequestsAreRefused) {
  AllocatorServiceImpl service(*allocator_, {.controller = "index"});
  hlem::v1::ListDecisionsRequest req;
  hlem::v1::ListDecisionsResponse resp;
  ASSERT_TRUE(service.ListDecisions(nullptr, &req, &resp).ok());
  EXPECT_EQ(resp.decisions_size(), 4);  // the log keeps 4
  EXPECT_EQ(resp.last_decision_id(), 6u);
  req.set_after_decision_id(1);
  resp.Clear();
  ASSERT_TRUE(service.ListDecisions(nullptr, &req, &resp).ok());
  EXPECT_TRUE(resp.gap());  // ids 1 and 2 were dropped
  EXPECT_EQ(resp.decisions(0).decision_id(), 3u);
  req.set_max_decisions(5000);
  EXPECT_EQ(service.ListDecisions(nullptr, &req, &resp).error_code(),
            grpc::StatusCode::INVALID_ARGUMENT);
  req.set_max_decisions(0);
  req.set_node_id("node-9");
  const grpc::Status unknown = service.ListDecisions(nullptr, &req, &resp);
  EXPECT_EQ(unknown.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(unknown.error_message().find("node-9"), std::string::npos);
}

TEST(GrpcNodesTest, WindowStatsBecomeTheControllersWindow) {
  hlem::v1::WindowStats w;
  w.set_window_index(7);
  w.set_requests(120);
  w.set_alpha_target(0.4);
  w.set_alpha_effective(0.35);
  w.set_p99_seconds(0.03);
  w.set_slo_seconds(0.025);
  const WindowState s = FromProto(w);
  EXPECT_EQ(s.index, 7u);
  EXPECT_EQ(s.requests, 120u);
  EXPECT_DOUBLE_EQ(s.alpha, 0.35);      // the α in force, not the target
  EXPECT_DOUBLE_EQ(s.p99_norm_cap, 4);  // unset: the default cap
}

}  // namespace
}  // namespace hlem::allocator
