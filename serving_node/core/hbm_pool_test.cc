#include "serving_node/core/hbm_pool.h"

#include <random>
#include <set>
#include <vector>

#include "gtest/gtest.h"

namespace hlem::serving {
namespace {

TEST(HbmPoolTest, RejectsBadOptions) {
  EXPECT_FALSE(HbmPool::Create({.pool_bytes = 1 << 20, .page_bytes = 0}).ok());
  EXPECT_FALSE(HbmPool::Create({.pool_bytes = 1 << 20, .page_bytes = 1000}).ok());
  auto none = HbmPool::Create({.pool_bytes = 100, .page_bytes = 4096});
  ASSERT_FALSE(none.ok());
  EXPECT_NE(std::string(none.status().message()).find("pool.bytes"), std::string::npos);
}

TEST(HbmPoolTest, AllocatesEveryPageOnceThenRunsOut) {
  auto pool = *HbmPool::Create({.pool_bytes = 10 * 4096 + 100, .page_bytes = 4096});
  EXPECT_EQ(pool->num_pages(), 10u);
  std::set<PageId> got;
  for (int i = 0; i < 10; ++i) {
    auto p = pool->AllocPage(i % 2 ? PageOwner::kKv : PageOwner::kEmb);
    ASSERT_TRUE(p.ok());
    EXPECT_TRUE(got.insert(*p).second);
  }
  EXPECT_EQ(pool->AllocPage(PageOwner::kKv).status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(pool->pages_owned(PageOwner::kKv), 5u);
  EXPECT_EQ(pool->pages_owned(PageOwner::kEmb), 5u);
  EXPECT_EQ(pool->free_pages(), 0u);
  EXPECT_TRUE(pool->CheckInvariants().ok());
  EXPECT_EQ(pool->PageOffset(3), 3u * 4096);
}

TEST(HbmPoolTest, RandomAllocFreeTransferKeepsInvariants) {
  auto pool = *HbmPool::Create({.pool_bytes = 257 * 256, .page_bytes = 256});
  std::mt19937_64 rng(7);
  std::vector<PageId> kv, emb;
  for (int step = 0; step < 20000; ++step) {
    switch (rng() % 5) {
      case 0:
      case 1: {
        PageOwner o = rng() % 2 ? PageOwner::kKv : PageOwner::kEmb;
        auto p = pool->AllocPage(o);
        if (p.ok()) (o == PageOwner::kKv ? kv : emb).push_back(*p);
        break;
      }
      case 2:
      case 3: {
        auto& v = rng() % 2 ? kv : emb;
        if (v.empty()) break;
        size_t i = rng() % v.size();
        pool->FreePage(v[i]);
        v[i] = v.back();
        v.pop_back();
        break;
      }
      case 4: {
        bool to_emb = rng() % 2;
        auto& from = to_emb ? kv : emb;
        if (from.empty()) break;
        PageId p = from.back();
        from.pop_back();
        pool->Transfer(p, to_emb ? PageOwner::kKv : PageOwner::kEmb,
                       to_emb ? PageOwner::kEmb : PageOwner::kKv);
        (to_emb ? emb : kv).push_back(p);
        break;
      }
    }
    if (step % 997 == 0) {
      ASSERT_TRUE(pool->CheckInvariants().ok()) << step;
    }
  }
  EXPECT_EQ(pool->pages_owned(PageOwner::kKv), kv.size());
  EXPECT_EQ(pool->pages_owned(PageOwner::kEmb), emb.size());
  for (PageId p : kv) EXPECT_EQ(pool->owner(p), PageOwner::kKv);
  EXPECT_TRUE(pool->CheckInvariants().ok());
}

TEST(HbmPoolDeathTest, DoubleFreeIsABug) {
  auto pool = *HbmPool::Create({.pool_bytes = 4 * 4096, .page_bytes = 4096});
  PageId p = *pool->AllocPage(PageOwner::kKv);
  pool->FreePage(p);
  EXPECT_DEATH(pool->FreePage(p), "");
}

}  // namespace
}  // namespace hlem::serving
