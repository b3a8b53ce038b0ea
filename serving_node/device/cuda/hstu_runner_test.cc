// The CUDA runner's step checks (hstu_runner.h), which need no GPU: a step the runner would
// misread is refused with the field named, as the libtorch runner refuses it.

#include "serving_node/device/cuda/hstu_runner.h"

#include <vector>

#include "gtest/gtest.h"

namespace hlem::cuda {
namespace {

class CudaHstuStepTest : public ::testing::Test {
 protected:
  void SetUp() override {
    shape_.layers = 2;
    shape_.dim = 8;
    shape_.heads = 2;
    shape_.d_qk = 4;
    shape_.d_v = 6;
    shape_.head_hidden = 4;
    shape_.targets = 1;
    shape_.max_positions = 100;
    step_.geometry.layers = 2;
    step_.geometry.kv_dim = shape_.kv_dim();
    step_.geometry.dtype_bytes = 4;
    step_.geometry.page_tokens = 4;
    step_.geometry.page_bytes = 4 * step_.geometry.token_bytes();
    step_.pool = reinterpret_cast<std::byte*>(pool_.data());
    step_.page_offsets = pages_.data();
    step_.pages = pages_.size();
    step_.cached = 5;
    step_.fresh = 3;
    step_.candidates = 2;
    step_.new_history_emb = emb_.data();
    step_.candidate_emb = emb_.data();
    step_.scores = scores_.data();
  }
  std::string Error() const { return CudaHstuStepError(shape_, step_); }

  serving::HstuFlatShape shape_;
  CudaHstuStep step_;
  std::vector<float> pool_ = std::vector<float>(1), emb_ = std::vector<float>(24),
                     scores_ = std::vector<float>(2);
  std::vector<uint64_t> pages_ = {0, 0};  // 8 tokens
};

TEST_F(CudaHstuStepTest, AWellFormedStepPasses) {
  EXPECT_EQ(Error(), "");
  step_.fresh = 0;
  step_.new_history_emb = nullptr;  // nothing new: no buffer needed
  EXPECT_EQ(Error(), "");
}

TEST_F(CudaHstuStepTest, EachBadFieldIsNamed) {
  auto refused = [&](auto&& mutate, const std::string& want) {
    CudaHstuStep saved = step_;
    mutate();
    EXPECT_NE(Error().find(want), std::string::npos)
        << "want '" << want << "', got '" << Error() << "'";
    step_ = saved;
  };
  refused([&] { step_.candidates = 0; }, "candidates: none");
  refused([&] { step_.cached = 98; }, "exceeds max_positions 100");
  refused([&] { step_.geometry.kv_dim = 8; },
          "kv_dim 8, dtype 4) does not match the model (layers 2, kv_dim 12");
  refused([&] { step_.geometry.dtype_bytes = 2; }, "dtype 2");
  refused([&] { step_.geometry.layers = 3; }, "layers 3");
  refused([&] { step_.geometry.page_bytes = 8; }, "does not match");
  refused([&] { step_.fresh = 4; }, "2 pages cannot hold 9 tokens");
  refused([&] { step_.pool = nullptr; }, "pages cannot hold");
  refused([&] { step_.page_offsets = nullptr; }, "pages cannot hold");
  refused([&] { step_.new_history_emb = nullptr; }, "no buffer");
  refused([&] { step_.scores = nullptr; }, "no buffer");
  EXPECT_EQ(Error(), "");  // every mutation was undone
}

}  // namespace
}  // namespace hlem::cuda
