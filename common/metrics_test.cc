#include "common/metrics.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cmath>
#include <string>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "prometheus/counter.h"

namespace hlem {
namespace {

std::string Msg(const absl::Status& s) { return std::string(s.message()); }

using ::testing::ElementsAre;
using ::testing::HasSubstr;

// GET http://127.0.0.1:port/path with a plain socket; returns the whole response.
std::string HttpGet(int port, const std::string& path) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return "";
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  inet_pton(AF_INET, "127.0.0.1", &addr.sin_addr);
  std::string response;
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0) {
    std::string request =
        absl::StrCat("GET ", path, " HTTP/1.0\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n");
    if (write(fd, request.data(), request.size()) == static_cast<ssize_t>(request.size())) {
      char buf[4096];
      for (ssize_t n; (n = read(fd, buf, sizeof(buf))) > 0;) response.append(buf, n);
    }
  }
  close(fd);
  return response;
}

TEST(MetricsExposerTest, ServesCountersOnAChosenPort) {
  MetricsRegistry registry;
  auto& family = prometheus::BuildCounter()
                     .Name("hlem_test_requests_total")
                     .Help("Requests seen by the test.")
                     .Register(*registry.registry());
  family.Add({{"outcome", "ok"}}).Increment(3);
  auto exposer = MetricsExposer::Create("127.0.0.1:0", registry);
  ASSERT_TRUE(exposer.ok()) << exposer.status();
  ASSERT_GT((*exposer)->port(), 0);
  std::string response = HttpGet((*exposer)->port(), "/metrics");
  EXPECT_THAT(response, HasSubstr("200 OK"));
  EXPECT_THAT(response, HasSubstr("# TYPE hlem_test_requests_total counter"));
  EXPECT_THAT(response, HasSubstr("hlem_test_requests_total{outcome=\"ok\"} 3"));
}

TEST(MetricsExposerTest, BusyPortIsUnavailable) {
  MetricsRegistry registry;
  auto first = MetricsExposer::Create("127.0.0.1:0", registry);
  ASSERT_TRUE(first.ok()) << first.status();
  std::string address = absl::StrCat("127.0.0.1:", (*first)->port());
  auto second = MetricsExposer::Create(address, registry);
  ASSERT_FALSE(second.ok());
  EXPECT_EQ(second.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(Msg(second.status()), HasSubstr(address));
}

TEST(BucketsTest, LatencyBucketsContainTheSloExactly) {
  auto edges = LatencyBuckets(0.03);
  EXPECT_EQ(edges.front(), 1e-5);
  EXPECT_EQ(edges.back(), 10.0);
  EXPECT_TRUE(std::is_sorted(edges.begin(), edges.end()));
  EXPECT_EQ(std::count(edges.begin(), edges.end(), 0.03), 1);
  EXPECT_EQ(edges.size(), 20u);  // 19 standard edges + the SLO

  auto same = LatencyBuckets(0.05);  // already an edge: not duplicated
  EXPECT_EQ(same.size(), 19u);
  EXPECT_EQ(std::count(same.begin(), same.end(), 0.05), 1);
  EXPECT_TRUE(std::adjacent_find(same.begin(), same.end()) == same.end());

  EXPECT_EQ(LatencyBuckets(0).size(), 19u);
  EXPECT_EQ(LatencyBuckets(NAN).size(), 19u);
  EXPECT_EQ(LatencyBuckets(30).back(), 30.0);
}

TEST(BucketsTest, ExponentialBuckets) {
  EXPECT_THAT(ExponentialBuckets(1, 2, 4), ElementsAre(1, 2, 4, 8));
  EXPECT_TRUE(ExponentialBuckets(0, 2, 4).empty());
  EXPECT_TRUE(ExponentialBuckets(1, 1, 4).empty());
  EXPECT_TRUE(ExponentialBuckets(1, 2, 0).empty());
}

}  // namespace
}  // namespace hlem
