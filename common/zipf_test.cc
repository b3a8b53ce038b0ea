#include "common/zipf.h"

#include <cmath>
#include <vector>

#include "common/rng.h"
#include "gtest/gtest.h"

namespace hlem {
namespace {

// Empirical frequencies match 1/(k+1)^s / H(n, s) within a few standard errors.
void CheckFrequencies(uint64_t n, double s) {
  ZipfSampler zipf(n, s);
  Rng rng(123);
  const int draws = 400000;
  std::vector<int> count(n, 0);
  for (int i = 0; i < draws; ++i) {
    uint64_t k = zipf(rng);
    ASSERT_LT(k, n);
    ++count[k];
  }
  double norm = 0;
  for (uint64_t k = 0; k < n; ++k) norm += std::pow(k + 1.0, -s);
  for (uint64_t k = 0; k < std::min<uint64_t>(n, 20); ++k) {
    double p = std::pow(k + 1.0, -s) / norm;
    double sd = std::sqrt(draws * p * (1 - p));
    EXPECT_NEAR(count[k], draws * p, 5 * sd + 1) << "n=" << n << " s=" << s << " k=" << k;
  }
}

TEST(ZipfTest, MatchesTheDistribution) {
  CheckFrequencies(10, 1.0);
  CheckFrequencies(1000, 0.8);
  CheckFrequencies(1000, 1.2);
  CheckFrequencies(50, 0.0);
}

TEST(ZipfTest, HugeDomainsNeedNoMemory) {
  ZipfSampler zipf(uint64_t{1} << 40, 1.05);
  Rng rng(1);
  uint64_t max = 0;
  for (int i = 0; i < 10000; ++i) max = std::max(max, zipf(rng));
  EXPECT_LT(max, uint64_t{1} << 40);
  EXPECT_GT(max, 1000u);
  EXPECT_EQ(ZipfSampler(1, 1.0)(rng), 0u);
}

}  // namespace
}  // namespace hlem
