#include "common/membership.h"

#include <set>
#include <string>
#include <utility>
#include <vector>

#include "gtest/gtest.h"

namespace hlem {
namespace {

class FakeResolver final : public AddressResolver {
 public:
  absl::StatusOr<std::vector<std::string>> Resolve() override {
    if (!error.ok()) return error;
    return addresses;
  }
  std::string target() const override { return "fake"; }
  std::vector<std::string> addresses;
  absl::Status error;
};

class FakeProbe final : public HealthProbe {
 public:
  absl::Status Check(const std::string& address, absl::Duration) override {
    return down.count(address) > 0 ? absl::UnavailableError("down") : absl::OkStatus();
  }
  std::set<std::string> down;
};

using Changes = std::vector<std::pair<std::string, bool>>;

class MembershipTest : public ::testing::Test {
 protected:
  void Build(MembershipOptions o) {
    membership_ = *Membership::Create(o, resolver_, probe_, [this](const std::string& a, bool j) {
      changes_.emplace_back(a, j);
      return refuse_.count(a) == 0;
    });
  }
  Changes Poll() {
    changes_.clear();
    membership_->Poll();
    return changes_;
  }
  FakeResolver resolver_;
  FakeProbe probe_;
  std::unique_ptr<Membership> membership_;
  Changes changes_;
  std::set<std::string> refuse_;
};

TEST_F(MembershipTest, JoinsHealthyPeersAndDropsUnhealthyOrVanishedOnes) {
  Build({.healthy_to_join = 1, .unhealthy_to_leave = 2});
  resolver_.addresses = {"a:1", "b:1", "c:1"};
  probe_.down = {"c:1"};
  EXPECT_EQ(Poll(), (Changes{{"a:1", true}, {"b:1", true}}));
  EXPECT_EQ(membership_->Members(), (std::vector<std::string>{"a:1", "b:1"}));

  // c comes up; b fails once (still a member), then twice (leaves).
  probe_.down = {"b:1"};
  EXPECT_EQ(Poll(), (Changes{{"c:1", true}}));
  EXPECT_EQ(Poll(), (Changes{{"b:1", false}}));
  probe_.down.clear();
  EXPECT_EQ(Poll(), (Changes{{"b:1", true}}));

  // A DNS failure changes nothing; a name the resolution drops leaves at once.
  resolver_.error = absl::UnavailableError("dns down");
  EXPECT_EQ(Poll(), Changes{});
  EXPECT_EQ(membership_->Members().size(), 3u);
  resolver_.error = absl::OkStatus();
  resolver_.addresses = {"a:1", "c:1", "d:1"};
  EXPECT_EQ(Poll(), (Changes{{"b:1", false}, {"d:1", true}}));

  const MembershipStats s = membership_->stats();
  EXPECT_EQ(s.polls, 6u);
  EXPECT_EQ(s.resolve_failures, 1u);
  EXPECT_EQ(s.joins, 5u);
  EXPECT_EQ(s.leaves, 2u);
  EXPECT_EQ(s.probe_failures, 3u);
}

TEST_F(MembershipTest, JoinNeedsConsecutiveHealthyProbes) {
  Build({.healthy_to_join = 2, .unhealthy_to_leave = 1});
  resolver_.addresses = {"a:1"};
  EXPECT_EQ(Poll(), Changes{});
  probe_.down = {"a:1"};
  EXPECT_EQ(Poll(), Changes{});  // the streak restarts
  probe_.down.clear();
  EXPECT_EQ(Poll(), Changes{});
  EXPECT_EQ(Poll(), (Changes{{"a:1", true}}));
  probe_.down = {"a:1"};
  EXPECT_EQ(Poll(), (Changes{{"a:1", false}}));
}

TEST_F(MembershipTest, ARefusedJoinIsRetriedOnTheNextPoll) {
  Build({});
  resolver_.addresses = {"a:1"};
  refuse_ = {"a:1"};
  EXPECT_EQ(Poll(), (Changes{{"a:1", true}}));
  EXPECT_TRUE(membership_->Members().empty());
  refuse_.clear();
  EXPECT_EQ(Poll(), (Changes{{"a:1", true}}));
  EXPECT_EQ(membership_->Members(), std::vector<std::string>{"a:1"});
  EXPECT_EQ(membership_->stats().joins_refused, 1u);
  EXPECT_EQ(membership_->stats().joins, 1u);
}

TEST_F(MembershipTest, StartPollsOnItsOwnThread) {
  Build({.interval = absl::Milliseconds(5)});
  resolver_.addresses = {"a:1"};
  membership_->Start();
  for (int i = 0; i < 400 && membership_->Members().empty(); ++i) {
    absl::SleepFor(absl::Milliseconds(5));
  }
  membership_->Stop();
  EXPECT_EQ(membership_->Members(), std::vector<std::string>{"a:1"});
}

// Dead peers (a probe that waits out its timeout) are probed at once, not one after the other:
// six peers, four dead (200 ms each) — a poll took 800 ms, now about one timeout.
TEST(MembershipParallelTest, DeadPeersAreProbedAtOnce) {
  class SlowProbe final : public HealthProbe {
   public:
    absl::Status Check(const std::string& address, absl::Duration timeout) override {
      if (address.rfind("dead", 0) != 0) return absl::OkStatus();
      absl::SleepFor(timeout);
      return absl::DeadlineExceededError("no answer");
    }
  };
  FakeResolver resolver;
  resolver.addresses = {"dead-1:1", "live-1:1", "dead-2:1", "dead-3:1", "live-2:1", "dead-4:1"};
  SlowProbe probe;
  Changes changes;
  auto membership = Membership::Create({.probe_timeout = absl::Milliseconds(200)}, resolver, probe,
                                       [&](const std::string& a, bool joined) {
                                         changes.emplace_back(a, joined);
                                         return true;
                                       });
  ASSERT_TRUE(membership.ok()) << membership.status();
  const absl::Time start = absl::Now();
  (*membership)->Poll();
  const absl::Duration took = absl::Now() - start;
  EXPECT_LT(took, absl::Milliseconds(600));
  EXPECT_EQ(changes, (Changes{{"live-1:1", true}, {"live-2:1", true}}));  // in address order
}

TEST(MembershipOptionsTest, RejectsBadOptions) {
  FakeResolver r;
  FakeProbe p;
  auto none = [](const std::string&, bool) { return true; };
  EXPECT_FALSE(Membership::Create({.interval = absl::ZeroDuration()}, r, p, none).ok());
  EXPECT_FALSE(Membership::Create({.probe_timeout = absl::ZeroDuration()}, r, p, none).ok());
  EXPECT_FALSE(Membership::Create({.healthy_to_join = 0}, r, p, none).ok());
  EXPECT_FALSE(Membership::Create({.unhealthy_to_leave = 0}, r, p, none).ok());
}

TEST(ResolverTest, StaticListsAndDnsNames) {
  auto list = MakeResolver("a:1, b:2");
  ASSERT_TRUE(list.ok()) << list.status();
  EXPECT_EQ(*(*list)->Resolve(), (std::vector<std::string>{"a:1", "b:2"}));
  EXPECT_EQ(MakeResolver("").status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(MakeResolver("a:1,nohost").status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(MakeResolver("dns:///localhost").status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(MakeResolver("dns:///localhost:0").status().code(), absl::StatusCode::kInvalidArgument);

  // localhost resolves from /etc/hosts: 127.0.0.1 and perhaps ::1.
  auto dns = MakeResolver("dns:///localhost:7200");
  ASSERT_TRUE(dns.ok()) << dns.status();
  EXPECT_EQ((*dns)->target(), "localhost:7200");
  absl::StatusOr<std::vector<std::string>> addresses = (*dns)->Resolve();
  ASSERT_TRUE(addresses.ok()) << addresses.status();
  EXPECT_NE(std::find(addresses->begin(), addresses->end(), "127.0.0.1:7200"), addresses->end());
  for (const std::string& a : *addresses) {
    EXPECT_TRUE(a == "127.0.0.1:7200" || a == "[::1]:7200") << a;
  }
}

}  // namespace
}  // namespace hlem
