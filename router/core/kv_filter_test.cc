#include "router/core/kv_filter.h"

#include "common/rng.h"
#include "gtest/gtest.h"

namespace hlem::router {
namespace {

TEST(KvFilterTest, HoldsWhatWasInsertedAndLittleElse) {
  KvFilter f(6000);
  EXPECT_LE(f.bytes(), 24u << 10);  // the paper's KV-residency budget per node
  Rng rng(1);
  std::vector<uint64_t> users;
  for (int i = 0; i < 6000; ++i) {
    users.push_back(rng());
    ASSERT_TRUE(f.Insert(users.back())) << i;
  }
  EXPECT_EQ(f.size(), 6000u);
  for (uint64_t u : users) ASSERT_TRUE(f.Contains(u));
  // False positives: about 8 / 65536 of non-members.
  int fp = 0;
  for (int i = 0; i < 200000; ++i) fp += f.Contains(rng());
  EXPECT_LT(fp, 200000 * 5e-4) << fp;
  // Erase half: the rest stays, the erased are gone (up to false positives).
  for (size_t i = 0; i < users.size(); i += 2) ASSERT_TRUE(f.Erase(users[i]));
  EXPECT_EQ(f.size(), 3000u);
  int still = 0;
  for (size_t i = 0; i < users.size(); ++i) {
    if (i % 2 == 1) {
      ASSERT_TRUE(f.Contains(users[i]));
    } else {
      still += f.Contains(users[i]);
    }
  }
  EXPECT_LE(still, 3);
  // A set: inserting a present user does not grow it.
  EXPECT_TRUE(f.Insert(users[1]));
  EXPECT_EQ(f.size(), 3000u);
  f.Clear();
  EXPECT_EQ(f.size(), 0u);
  EXPECT_FALSE(f.Contains(users[1]));
}

TEST(KvFilterTest, AFullFilterRefusesWithoutLosingAnything) {
  KvFilter f(100);
  Rng rng(2);
  std::vector<uint64_t> users;
  while (true) {
    const uint64_t u = rng();
    if (!f.Insert(u)) break;
    users.push_back(u);
    ASSERT_LT(users.size(), f.capacity() + 1);
  }
  EXPECT_GE(users.size(), f.capacity() * 85 / 100);  // cuckoo filters fill to ~95 %
  for (uint64_t u : users) ASSERT_TRUE(f.Contains(u));
  EXPECT_EQ(f.size(), users.size());
}

}  // namespace
}  // namespace hlem::router
