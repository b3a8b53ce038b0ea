#include "serving_node/model/hstu_model.h"

#include <torch/csrc/jit/serialization/pickle.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <numeric>
#include <random>
#include <vector>

#include "common/clock.h"
#include "gtest/gtest.h"
#include "serving_node/core/hbm_pool.h"
#include "serving_node/core/kv_cache.h"
#include "serving_node/model/hstu_weights.h"

namespace hlem::serving {
namespace {

HstuConfig SmallConfig() {
  return {.layers = 2,
          .dim = 32,
          .heads = 2,
          .d_qk = 8,
          .d_v = 12,  // K and V of different widths: K is padded in the page
          .head_hidden = 16,
          .targets = 2,
          .attn_norm = 16,
          .max_positions = 512};
}

std::vector<float> RandomRows(std::mt19937_64& rng, size_t rows, uint32_t dim) {
  std::normal_distribution<float> d(0, 0.3f);
  std::vector<float> v(rows * dim);
  for (float& x : v) x = d(rng);
  return v;
}

double MaxRelDiff(const std::vector<float>& a, const std::vector<float>& b) {
  double worst = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    worst = std::max(worst, std::abs(double{a[i]} - b[i]) / std::max(1.0, std::abs(double{b[i]})));
  }
  return worst;
}

// Pages of a host buffer standing in for the pool; the block table is a random permutation, so
// nothing depends on a user's pages being adjacent.
struct HostPages {
  HostPages(const HstuConfig& c, uint32_t page_tokens, uint32_t pages, std::mt19937_64& rng) {
    geometry = {
        .layers = c.layers, .kv_dim = c.kv_dim(), .dtype_bytes = 4, .page_tokens = page_tokens};
    geometry.page_bytes = uint64_t{page_tokens} * geometry.token_bytes();
    bytes.assign(pages * geometry.page_bytes,
                 std::byte{0x7f});  // garbage where nothing was written
    std::vector<uint64_t> order(pages);
    std::iota(order.begin(), order.end(), 0);
    std::shuffle(order.begin(), order.end(), rng);
    for (uint64_t p : order) offsets.push_back(p * geometry.page_bytes);
  }
  KvPagesView View() { return {geometry, bytes.data(), offsets}; }
  KvGeometry geometry;
  std::vector<std::byte> bytes;
  std::vector<uint64_t> offsets;
};

TEST(HstuModelTest, RejectsBadConfigs) {
  HstuConfig c = SmallConfig();
  c.heads = 0;
  EXPECT_EQ(HstuModel::CreateRandom(c, 1).status().code(), absl::StatusCode::kInvalidArgument);
  c = SmallConfig();
  c.attn_norm = 0;
  auto m = HstuModel::CreateRandom(c, 1);
  ASSERT_FALSE(m.ok());
  EXPECT_NE(m.status().message().find("attn_norm"), std::string::npos) << m.status();
  // Within every field's range but about 2.8e11 weights: refused by its size, nothing allocated.
  c = SmallConfig();
  c.dim = 1 << 16;
  c.heads = 1024;
  c.d_qk = 1 << 10;
  m = HstuModel::CreateRandom(c, 1);
  ASSERT_FALSE(m.ok());
  EXPECT_NE(m.status().message().find("exceed the limit"), std::string::npos) << m.status();
}

// ParameterCount is what a model of the config holds, array by array.
TEST(HstuModelTest, ParameterCountIsTheWeightsAModelHolds) {
  for (HstuConfig c : {SmallConfig(), HstuConfig{}}) {
    c.targets = 3;
    auto model = HstuModel::CreateRandom(c, 7);
    ASSERT_TRUE(model.ok()) << model.status();
    HstuFlatWeights w = (*model)->Flatten();
    uint64_t held = 0;
    HstuFlatWeights::ForEachArray(
        w, [&](const std::string&, const std::vector<float>& a, uint64_t) { held += a.size(); });
    EXPECT_EQ(c.ParameterCount(), held);
  }
}

// The correctness contract: for any split of the history into a cached prefix and new tokens and
// any candidate set, the cached path's scores equal a full recompute.
TEST(HstuModelTest, CachedForwardEqualsFullRecompute) {
  const HstuConfig c = SmallConfig();
  auto model = *HstuModel::CreateRandom(c, 42);
  std::mt19937_64 rng(7);
  double worst = 0;
  for (int trial = 0; trial < 120; ++trial) {
    const uint32_t H = rng() % 200, C = 1 + rng() % 12, page_tokens = 1 + rng() % 40;
    const uint32_t c0 = H == 0 ? 0 : rng() % (H + 1);
    const std::vector<float> hist = RandomRows(rng, H, c.dim), cand = RandomRows(rng, C, c.dim);
    std::vector<float> ref(C * c.targets), got(C * c.targets), scratch;
    ASSERT_TRUE(model->ForwardReference(hist, cand, ref).ok());
    HostPages pages(c, page_tokens, (H + page_tokens - 1) / page_tokens + 1, rng);
    // Request 1 caches the prefix (with other candidates); request 2 brings the rest.
    const std::vector<float> other = RandomRows(rng, 1 + rng() % 5, c.dim);
    scratch.resize(other.size() / c.dim * c.targets);
    ASSERT_TRUE(model
                    ->ForwardCached(pages.View(), 0,
                                    std::span<const float>(hist).first(size_t{c0} * c.dim), other,
                                    scratch)
                    .ok());
    ASSERT_TRUE(model
                    ->ForwardCached(pages.View(), c0,
                                    std::span<const float>(hist).subspan(size_t{c0} * c.dim), cand,
                                    got)
                    .ok());
    const double d = MaxRelDiff(got, ref);
    worst = std::max(worst, d);
    ASSERT_LE(d, 1e-4) << "trial " << trial << " H " << H << " cached " << c0 << " C " << C
                       << " page_tokens " << page_tokens;
  }
  std::cout << "worst relative difference over 120 cases: " << worst << "\n";
}

// A batch of requests of different lengths in one pass (packed projections, per-request
// attention) gives every request the scores of its own full recompute.
TEST(HstuModelTest, BatchedForwardEqualsPerRequestRecompute) {
  const HstuConfig c = SmallConfig();
  auto model = *HstuModel::CreateRandom(c, 8);
  std::mt19937_64 rng(21);
  for (int trial = 0; trial < 25; ++trial) {
    const size_t batch = 1 + rng() % 8;
    struct Request {
      std::vector<float> hist, cand, ref, got;
      uint32_t c0 = 0;
      std::unique_ptr<HostPages> pages;
    };
    std::vector<Request> reqs(batch);
    for (Request& r : reqs) {
      const uint32_t H = rng() % 120, C = 1 + rng() % 6;
      r.c0 = H == 0 ? 0 : rng() % (H + 1);
      r.hist = RandomRows(rng, H, c.dim);
      r.cand = RandomRows(rng, C, c.dim);
      r.ref.resize(C * c.targets);
      r.got.resize(C * c.targets);
      ASSERT_TRUE(model->ForwardReference(r.hist, r.cand, r.ref).ok());
      const uint32_t pt = 1 + rng() % 16;
      r.pages = std::make_unique<HostPages>(c, pt, (H + pt - 1) / pt + 1, rng);
      // Cache the prefix with a request of its own.
      std::vector<float> one(c.targets);
      ASSERT_TRUE(model
                      ->ForwardCached(r.pages->View(), 0,
                                      std::span<const float>(r.hist).first(size_t{r.c0} * c.dim),
                                      std::span<const float>(r.cand).first(c.dim), one)
                      .ok());
    }
    std::vector<ModelStep> steps;
    for (Request& r : reqs) {
      steps.push_back(
          {.kv = r.pages->View(),
           .cached_len = r.c0,
           .new_history_emb = std::span<const float>(r.hist).subspan(size_t{r.c0} * c.dim),
           .candidate_emb = r.cand,
           .scores = r.got});
    }
    ASSERT_TRUE(model->ForwardBatch(steps).ok());
    for (size_t i = 0; i < batch; ++i) {
      ASSERT_LE(MaxRelDiff(reqs[i].got, reqs[i].ref), 1e-4) << "trial " << trial << " step " << i;
    }
  }
  // A bad step is named and nothing runs.
  std::vector<float> cand(c.dim), scores(c.targets), bad_scores(c.targets + 1);
  std::mt19937_64 r2(1);
  HostPages pages(c, 4, 4, r2);
  std::vector<ModelStep> steps = {
      {.kv = pages.View(), .candidate_emb = cand, .scores = scores},
      {.kv = pages.View(), .candidate_emb = cand, .scores = bad_scores}};
  absl::Status st = model->ForwardBatch(steps);
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("step 1"), std::string::npos) << st;
}

// A user served three times as its history grows, with pages from a real KvCache: every answer
// equals a cold full recompute.
TEST(HstuModelTest, ReturningUserThroughTheKvCache) {
  const HstuConfig c = SmallConfig();
  auto model = *HstuModel::CreateRandom(c, 3);
  SimClock clock;
  constexpr uint64_t kPageBytes = 16 << 10;
  auto pool = *HbmPool::Create({.pool_bytes = 64 * kPageBytes, .page_bytes = kPageBytes});
  auto kv = *KvCache::Create({.layers = c.layers, .kv_dim = c.kv_dim(), .dtype_bytes = 4}, *pool,
                             nullptr, clock);
  std::vector<std::byte> arena(pool->num_pages() * kPageBytes);
  std::mt19937_64 rng(9);
  std::vector<uint64_t> tokens;  // the user's history events (ids), for the prefix hash
  std::vector<float> hist;
  for (int request = 0; request < 3; ++request) {
    const uint32_t grow = 40 + 30 * request;
    for (uint32_t i = 0; i < grow; ++i) tokens.push_back(rng());
    const std::vector<float> more = RandomRows(rng, grow, c.dim);
    hist.insert(hist.end(), more.begin(), more.end());
    const std::vector<float> cand = RandomRows(rng, 5, c.dim);

    KvLookupResult cached = kv->Lookup(11, tokens);
    ASSERT_EQ(cached.prefix.len, tokens.size() - grow) << "request " << request;
    auto append =
        kv->Append(11, cached.prefix, std::span<const uint64_t>(tokens).subspan(cached.prefix.len));
    ASSERT_TRUE(append.ok()) << append.status();
    // The block table: the prefix's pages, then the pages the append reserved.
    std::vector<uint64_t> offsets;
    for (PageId p : cached.pages) offsets.push_back(pool->PageOffset(p));
    for (const KvSlotRun& run : append->runs) {
      if (offsets.empty() || offsets.back() != pool->PageOffset(run.page)) {
        offsets.push_back(pool->PageOffset(run.page));
      }
    }
    KvPagesView view{kv->layout(), arena.data(), offsets};
    std::vector<float> got(5 * c.targets), ref(5 * c.targets);
    ASSERT_TRUE(model
                    ->ForwardCached(view, cached.prefix.len,
                                    std::span<const float>(hist).subspan(cached.prefix.len * c.dim),
                                    cand, got)
                    .ok());
    ASSERT_TRUE(kv->CommitAppend(11, append->prefix).ok());
    ASSERT_TRUE(model->ForwardReference(hist, cand, ref).ok());
    EXPECT_LE(MaxRelDiff(got, ref), 1e-4) << "request " << request;
  }
}

std::string TempPath(const std::string& name) {
  return (std::filesystem::temp_directory_path() /
          (name + "." + std::to_string(::getpid()) + ".pt"))
      .string();
}

TEST(HstuModelTest, WeightsRoundTripThroughAStateDictFile) {
  const HstuConfig c = SmallConfig();
  auto model = *HstuModel::CreateRandom(c, 5);
  const std::string path = TempPath("hstu_roundtrip");
  ASSERT_TRUE(model->Save(path).ok());
  auto loaded = HstuModel::Load(c, path);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  std::mt19937_64 rng(2);
  const std::vector<float> hist = RandomRows(rng, 30, c.dim), cand = RandomRows(rng, 4, c.dim);
  std::vector<float> a(4 * c.targets), b(4 * c.targets);
  ASSERT_TRUE(model->ForwardReference(hist, cand, a).ok());
  ASSERT_TRUE((*loaded)->ForwardReference(hist, cand, b).ok());
  EXPECT_EQ(a, b);
  // Another seed gives other scores: the file, not the seed, made them equal.
  auto other = *HstuModel::CreateRandom(c, 6);
  ASSERT_TRUE(other->ForwardReference(hist, cand, b).ok());
  EXPECT_NE(a, b);
  std::filesystem::remove(path);
}

TEST(HstuModelTest, WeightFileMismatchesNameTheTensor) {
  const HstuConfig c = SmallConfig();
  auto expect_error = [&](const HstuConfig& saved_as, const std::string& needle) {
    const std::string path = TempPath("hstu_mismatch");
    ASSERT_TRUE((*HstuModel::CreateRandom(saved_as, 1))->Save(path).ok());
    auto loaded = HstuModel::Load(c, path);
    ASSERT_FALSE(loaded.ok());
    EXPECT_EQ(loaded.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(loaded.status().message().find(needle), std::string::npos) << loaded.status();
    std::filesystem::remove(path);
  };
  HstuConfig fewer = c;
  fewer.layers = 1;
  expect_error(fewer, "missing tensor 'layers.1.ln1.weight'");
  HstuConfig more = c;
  more.layers = 3;
  expect_error(more, "unexpected tensor 'layers.2.");
  HstuConfig narrower = c;
  narrower.dim = 16;
  expect_error(narrower, "tensor 'pos.weight' has shape [513, 16]");
  EXPECT_EQ(HstuModel::Load(c, "/nonexistent/hstu.pt").status().code(),
            absl::StatusCode::kNotFound);
  const std::string garbage = TempPath("hstu_garbage");
  std::ofstream(garbage) << "not a torch file";
  EXPECT_EQ(HstuModel::Load(c, garbage).status().code(), absl::StatusCode::kInvalidArgument);
  std::filesystem::remove(garbage);
}

// A state dict whose names and shapes fit but whose values cannot be used.
TEST(HstuModelTest, NonFiniteOrIntegerWeightsAreRefused) {
  const HstuConfig c = SmallConfig();
  const std::string path = TempPath("hstu_poisoned");
  auto rewrite = [&](const std::string& name, const at::Tensor& value) {
    ASSERT_TRUE((*HstuModel::CreateRandom(c, 1))->Save(path).ok());
    std::ifstream in(path, std::ios::binary);
    std::vector<char> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    c10::impl::GenericDict dict = torch::jit::pickle_load(bytes).toGenericDict();
    const at::Tensor like = dict.at(name).toTensor();
    dict.insert_or_assign(name, value.expand(like.sizes()).contiguous());
    bytes = torch::jit::pickle_save(dict);
    std::ofstream(path, std::ios::binary)
        .write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  };
  auto expect_refused = [&](const std::string& needle) {
    auto loaded = HstuModel::Load(c, path);
    ASSERT_FALSE(loaded.ok());
    EXPECT_EQ(loaded.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(loaded.status().message().find(needle), std::string::npos) << loaded.status();
  };
  rewrite("head.2.bias", at::full({1}, NAN));
  expect_refused("tensor 'head.2.bias' holds NaN or infinite values");
  rewrite("layers.0.o.weight", at::full({1}, INFINITY));
  expect_refused("tensor 'layers.0.o.weight' holds NaN or infinite values");
  rewrite("pos.weight", at::zeros({1}, at::kLong));
  expect_refused("tensor 'pos.weight' is not floating point");
  std::filesystem::remove(path);
}

TEST(HstuModelTest, BadInputsAreErrors) {
  const HstuConfig c = SmallConfig();
  auto model = *HstuModel::CreateRandom(c, 1);
  std::vector<float> hist(10 * c.dim), cand(2 * c.dim), scores(2 * c.targets);
  std::vector<float> ragged(c.dim + 3);
  EXPECT_EQ(model->ForwardReference(ragged, cand, scores).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(model->ForwardReference(hist, {}, {}).code(), absl::StatusCode::kInvalidArgument);
  std::vector<float> few_scores(1);
  EXPECT_EQ(model->ForwardReference(hist, cand, few_scores).code(),
            absl::StatusCode::kInvalidArgument);
  std::vector<float> too_long((c.max_positions + 1) * c.dim);
  EXPECT_EQ(model->ForwardReference(too_long, cand, scores).code(), absl::StatusCode::kOutOfRange);
  std::mt19937_64 rng(1);
  HostPages pages(c, 4, 2, rng);  // 8 tokens
  EXPECT_EQ(model->ForwardCached(pages.View(), 0, hist, cand, scores).code(),
            absl::StatusCode::kInvalidArgument);  // 10 tokens do not fit
  KvPagesView wrong = pages.View();
  wrong.geometry.kv_dim += 1;
  EXPECT_EQ(model->ForwardCached(wrong, 0, std::span<const float>(hist).first(c.dim), cand, scores)
                .code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(HstuConfigTest, ReferenceForwardFlopsCountsTheDenseProducts) {
  // D 4, 1 head of d_qk 2 and d_v 3 (uvqk_dim 10), head 5 → 1 target, 2 layers; 3 + 1 tokens.
  const HstuConfig c{.layers = 2, .dim = 4, .heads = 1, .d_qk = 2, .d_v = 3, .head_hidden = 5};
  const double n = 4;
  const double layer = 2 * n * 4 * 10 + 2 * n * 3 * 4 + 2 * n * n * (2 + 3);
  EXPECT_DOUBLE_EQ(ReferenceForwardFlops(c, 3, 1), 2 * layer + 2 * 1 * (4 * 5 + 5 * 1));
  // Attention grows with the square of the tokens.
  EXPECT_GT(ReferenceForwardFlops(c, 1000, 0), 3.9 * ReferenceForwardFlops(c, 500, 0));
}

// HstuFlatWeights and the HSTU fixture (serving_node/core/hstu_flat.h): the flat weights give
// the runner's scores through the plain C++ forward (so the layout the CUDA runner uploads is the
// runner's), a fixture reads back as written, and damaged files are refused with the part named.
TEST(HstuFlatTest, TheFlatForwardGivesTheTorchRunnersScores) {
  const HstuConfig c = SmallConfig();
  auto model = HstuModel::CreateRandom(c, 7);
  ASSERT_TRUE(model.ok());
  const HstuFlatWeights w = (*model)->Flatten();
  ASSERT_EQ(w.Error(), "");
  EXPECT_EQ(w.shape.kv_dim(), c.kv_dim());
  EXPECT_EQ(w.shape.uvqk(), c.uvqk_dim());
  std::mt19937_64 rng(3);
  for (uint32_t H : {0u, 1u, 9u, 40u}) {
    for (uint32_t C : {1u, 5u}) {
      const std::vector<float> hist = RandomRows(rng, H, c.dim), cand = RandomRows(rng, C, c.dim);
      std::vector<float> want(C * c.targets), got(C * c.targets, -1);
      ASSERT_TRUE((*model)->ForwardReference(hist, cand, want).ok());
      HstuForwardHost(w, hist.data(), H, cand.data(), C, got.data());
      EXPECT_LT(MaxRelDiff(got, want), 1e-4) << "history " << H << ", candidates " << C;
    }
  }
}

TEST(HstuFlatTest, SwappedWeightsChangeTheScores) {
  // The check above can fail: U and V swapped in the layout (a plausible upload bug) is caught.
  auto model = HstuModel::CreateRandom(SmallConfig(), 7);
  ASSERT_TRUE(model.ok());
  HstuFlatWeights w = (*model)->Flatten();
  std::mt19937_64 rng(4);
  const std::vector<float> hist = RandomRows(rng, 10, 32), cand = RandomRows(rng, 3, 32);
  std::vector<float> want(6), got(6);
  ASSERT_TRUE((*model)->ForwardReference(hist, cand, want).ok());
  auto& b = w.layers[0].b_uvqk;
  std::swap_ranges(b.begin(), b.begin() + 24, b.begin() + 24);  // U and V biases (hv = 24)
  HstuForwardHost(w, hist.data(), 10, cand.data(), 3, got.data());
  EXPECT_GT(MaxRelDiff(got, want), 1e-3);
}

class HstuFixtureFileTest : public ::testing::Test {
 protected:
  void SetUp() override {
    path_ = (std::filesystem::path(::testing::TempDir()) /
             ("hstu_fixture_" + std::to_string(::getpid()) + ".bin"))
                .string();
    auto model = HstuModel::CreateRandom(SmallConfig(), 11);
    ASSERT_TRUE(model.ok());
    fixture_.weights = (*model)->Flatten();
    fixture_.seed = 11;
    std::mt19937_64 rng(5);
    for (uint32_t H : {0u, 20u}) {
      HstuFixtureCase c{.history = H, .candidates = 4};
      c.history_emb = RandomRows(rng, H, 32);
      c.candidate_emb = RandomRows(rng, 4, 32);
      c.scores.resize(8);
      ASSERT_TRUE((*model)->ForwardReference(c.history_emb, c.candidate_emb, c.scores).ok());
      fixture_.cases.push_back(c);
    }
    ASSERT_EQ(WriteHstuFixture(path_, fixture_), "");
  }
  void TearDown() override { std::filesystem::remove(path_); }

  std::string Bytes() {
    std::ifstream in(path_, std::ios::binary);
    return {std::istreambuf_iterator<char>(in), {}};
  }
  void Overwrite(const std::string& bytes) {
    std::ofstream(path_, std::ios::binary | std::ios::trunc) << bytes;
  }

  std::string path_;
  HstuFixture fixture_;
};

TEST_F(HstuFixtureFileTest, ReadsBackWhatWasWritten) {
  HstuFixture back;
  ASSERT_EQ(ReadHstuFixture(path_, &back), "");
  EXPECT_EQ(back.seed, 11u);
  EXPECT_EQ(back.weights.shape.attn_norm, 16.0f);
  EXPECT_EQ(back.weights.pos, fixture_.weights.pos);
  EXPECT_EQ(back.weights.layers[1].w_o, fixture_.weights.layers[1].w_o);
  EXPECT_EQ(back.weights.head_b2, fixture_.weights.head_b2);
  ASSERT_EQ(back.cases.size(), 2u);
  EXPECT_EQ(back.cases[1].history, 20u);
  EXPECT_EQ(back.cases[1].history_emb, fixture_.cases[1].history_emb);
  EXPECT_EQ(back.cases[1].scores, fixture_.cases[1].scores);
  // And the scores it carries are the flat forward's.
  std::vector<float> got(8);
  const HstuFixtureCase& c = back.cases[1];
  HstuForwardHost(back.weights, c.history_emb.data(), c.history, c.candidate_emb.data(),
                  c.candidates, got.data());
  EXPECT_LT(MaxRelDiff(got, c.scores), 1e-4);
}

TEST_F(HstuFixtureFileTest, DamagedFilesAreRefusedWithThePartNamed) {
  const std::string good = Bytes();
  HstuFixture back;
  Overwrite(good.substr(0, good.size() - 3));
  EXPECT_NE(ReadHstuFixture(path_, &back).find("truncated"), std::string::npos);
  Overwrite(good + "x");
  EXPECT_NE(ReadHstuFixture(path_, &back).find("after the last case"), std::string::npos);
  std::string bad = good;
  bad[0] = 'X';
  Overwrite(bad);
  EXPECT_NE(ReadHstuFixture(path_, &back).find("magic"), std::string::npos);
  bad = good;
  const uint32_t huge_dim = 1u << 30;  // dim is the third u32 after the magic
  std::memcpy(&bad[8 + 8], &huge_dim, 4);
  Overwrite(bad);
  EXPECT_NE(ReadHstuFixture(path_, &back).find("dim must be"), std::string::npos);
  bad = good;
  const uint64_t count = 12345;  // the pos array's count, after the 56-byte header
  std::memcpy(&bad[56], &count, 8);
  Overwrite(bad);
  EXPECT_NE(ReadHstuFixture(path_, &back).find("pos: 12345 values"), std::string::npos);
  bad = good;
  const float nan = std::nanf("");
  std::memcpy(&bad[64], &nan, 4);  // the first pos value
  Overwrite(bad);
  EXPECT_NE(ReadHstuFixture(path_, &back).find("NaN"), std::string::npos);
  EXPECT_NE(ReadHstuFixture(path_ + ".missing", &back).find("cannot open"), std::string::npos);
}

}  // namespace
}  // namespace hlem::serving
