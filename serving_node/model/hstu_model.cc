#include "serving_node/model/hstu_model.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "serving_node/model/hstu_weights.h"

namespace hlem::serving {

namespace {

constexpr double kLnEps = 1e-5;

// A token block's per-layer projections.
struct Uvqk {
  at::Tensor u, v, q, k;  // [n, heads·d_v], [n, heads·d_v], [n, heads·d_qk], [n, heads·d_qk]
};

at::Tensor FromSpan(std::span<const float> s, int64_t rows, int64_t cols) {
  // from_blob does not copy: clone so the tensor owns its bytes (inputs are small).
  return at::from_blob(const_cast<float*>(s.data()), {rows, cols}, at::kFloat).clone();
}

}  // namespace

HstuModel::HstuModel(const HstuConfig& config, std::unique_ptr<Weights> weights)
    : config_(config), w_(std::move(weights)) {}
HstuModel::~HstuModel() = default;

const HstuConfig& HstuModel::config() const { return config_; }

absl::StatusOr<std::unique_ptr<HstuModel>> HstuModel::CreateRandom(const HstuConfig& c,
                                                                   uint64_t seed) {
  if (absl::Status st = c.Validate(); !st.ok()) return st;
  at::Generator gen = at::detail::createCPUGenerator(seed);
  auto normal = [&](std::vector<int64_t> shape, double std) {
    return at::normal(0.0, std, shape, gen, at::TensorOptions().dtype(at::kFloat));
  };
  auto w = std::make_unique<Weights>();
  const int64_t D = c.dim, hv = int64_t{c.heads} * c.d_v;
  w->pos = normal({int64_t{c.max_positions} + 1, D}, 0.02);
  for (uint32_t l = 0; l < c.layers; ++l) {
    HstuLayer L;
    L.ln1_w = 1 + normal({D}, 0.05);
    L.ln1_b = normal({D}, 0.05);
    L.w_uvqk = normal({D, c.uvqk_dim()}, 1.0 / std::sqrt(static_cast<double>(D)));
    L.b_uvqk = normal({c.uvqk_dim()}, 0.02);
    L.ln2_w = 1 + normal({hv}, 0.05);
    L.ln2_b = normal({hv}, 0.05);
    L.w_o = normal({hv, D}, 1.0 / std::sqrt(static_cast<double>(hv)));
    w->layers.push_back(std::move(L));
  }
  w->head_w1 = normal({D, c.head_hidden}, 1.0 / std::sqrt(static_cast<double>(D)));
  w->head_b1 = normal({c.head_hidden}, 0.02);
  w->head_w2 =
      normal({c.head_hidden, c.targets}, 1.0 / std::sqrt(static_cast<double>(c.head_hidden)));
  w->head_b2 = normal({c.targets}, 0.02);
  return std::unique_ptr<HstuModel>(new HstuModel(c, std::move(w)));
}

HstuFlatWeights HstuModel::Flatten() const {
  const HstuConfig& c = config_;
  HstuFlatWeights f;
  f.shape = {.layers = c.layers,
             .dim = c.dim,
             .heads = c.heads,
             .d_qk = c.d_qk,
             .d_v = c.d_v,
             .head_hidden = c.head_hidden,
             .targets = c.targets,
             .max_positions = c.max_positions,
             .attn_norm = c.attn_norm};
  auto flat = [](const at::Tensor& t) {
    at::Tensor d = t.detach().to(at::kFloat).contiguous();
    return std::vector<float>(d.data_ptr<float>(), d.data_ptr<float>() + d.numel());
  };
  f.pos = flat(w_->pos);
  for (const HstuLayer& L : w_->layers) {
    f.layers.push_back({.ln1_w = flat(L.ln1_w),
                        .ln1_b = flat(L.ln1_b),
                        .w_uvqk = flat(L.w_uvqk),
                        .b_uvqk = flat(L.b_uvqk),
                        .ln2_w = flat(L.ln2_w),
                        .ln2_b = flat(L.ln2_b),
                        .w_o = flat(L.w_o)});
  }
  f.head_w1 = flat(w_->head_w1);
  f.head_b1 = flat(w_->head_b1);
  f.head_w2 = flat(w_->head_w2);
  f.head_b2 = flat(w_->head_b2);
  return f;
}

namespace {

// x = √D · e + P[pos] for rows of `emb` at positions [first, first + rows), or all at `first`
// when `same_position`.
at::Tensor Inputs(const at::Tensor& emb, const at::Tensor& pos_table, int64_t first,
                  bool same_position, int64_t dim) {
  const int64_t n = emb.size(0);
  at::Tensor pos = same_position ? pos_table.narrow(0, first, 1).expand({n, dim})
                                 : pos_table.narrow(0, first, n);
  return emb * std::sqrt(static_cast<double>(dim)) + pos;
}

Uvqk Project(const HstuLayer& L, const HstuConfig& c, const at::Tensor& x) {
  const int64_t D = c.dim, hv = int64_t{c.heads} * c.d_v, hq = int64_t{c.heads} * c.d_qk;
  at::Tensor xn = at::layer_norm(x, {D}, L.ln1_w, L.ln1_b, kLnEps);
  at::Tensor uvqk = at::silu(at::addmm(L.b_uvqk, xn, L.w_uvqk));
  std::vector<at::Tensor> parts = at::split_with_sizes(uvqk, {hv, hv, hq, hq}, 1);
  return {parts[0], parts[1], parts[2], parts[3]};
}

// A = (SiLU(q·kᵀ / √d_qk) / N ⊙ mask) · v per head; q [n, heads·d_qk], k [m, heads·d_qk],
// v [m, heads·d_v], mask [n, m] of 0/1. Returns [n, heads·d_v].
at::Tensor Attend(const HstuConfig& c, const at::Tensor& q, const at::Tensor& k,
                  const at::Tensor& v, const at::Tensor& mask) {
  const int64_t n = q.size(0), m = k.size(0), H = c.heads;
  at::Tensor qh = q.view({n, H, c.d_qk}).transpose(0, 1);  // [H, n, d_qk]
  at::Tensor kh = k.view({m, H, c.d_qk}).transpose(0, 1);  // [H, m, d_qk]
  at::Tensor vh = v.view({m, H, c.d_v}).transpose(0, 1);   // [H, m, d_v]
  at::Tensor s =
      at::silu(at::bmm(qh, kh.transpose(1, 2)) / std::sqrt(static_cast<double>(c.d_qk))) /
      static_cast<double>(c.attn_norm);
  s = s * mask.unsqueeze(0);
  return at::bmm(s, vh).transpose(0, 1).reshape({n, H * int64_t{c.d_v}});
}

at::Tensor Residual(const HstuLayer& L, const HstuConfig& c, const at::Tensor& x, const Uvqk& p,
                    const at::Tensor& a) {
  const int64_t hv = int64_t{c.heads} * c.d_v;
  at::Tensor an = at::layer_norm(a, {hv}, L.ln2_w, L.ln2_b, kLnEps);
  return x + at::mm(p.u * an, L.w_o);
}

// Linear(D, h) -> SiLU -> Linear(h, T) over the candidates' outputs.
at::Tensor Head(const at::Tensor& w1, const at::Tensor& b1, const at::Tensor& w2,
                const at::Tensor& b2, const at::Tensor& y) {
  return at::addmm(b2, at::silu(at::addmm(b1, y, w1)), w2);
}

absl::Status CopyScores(const at::Tensor& s, std::span<float> scores) {
  at::Tensor c = s.contiguous();
  if (static_cast<size_t>(c.numel()) != scores.size()) {
    return absl::InternalError("score size mismatch");
  }
  std::memcpy(scores.data(), c.data_ptr<float>(), scores.size() * sizeof(float));
  return absl::OkStatus();
}

absl::Status CheckRows(const char* what, std::span<const float> s, uint32_t dim, int64_t* rows) {
  if (s.size() % dim != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": ", s.size(), " floats is not a whole number of rows of ", dim));
  }
  *rows = static_cast<int64_t>(s.size() / dim);
  return absl::OkStatus();
}

}  // namespace

absl::Status HstuModel::ForwardReference(std::span<const float> history_emb,
                                         std::span<const float> candidate_emb,
                                         std::span<float> scores) const {
  const HstuConfig& c = config_;
  int64_t H = 0, C = 0;
  if (absl::Status st = CheckRows("history", history_emb, c.dim, &H); !st.ok()) return st;
  if (absl::Status st = CheckRows("candidates", candidate_emb, c.dim, &C); !st.ok()) return st;
  if (C == 0) return absl::InvalidArgumentError("candidates: none");
  if (H > c.max_positions) {
    return absl::OutOfRangeError(
        absl::StrCat("history of ", H, " tokens exceeds max_positions ", c.max_positions));
  }
  if (scores.size() != static_cast<size_t>(C) * c.targets) {
    return absl::InvalidArgumentError("scores: must hold candidates × targets floats");
  }
  at::NoGradGuard no_grad;
  at::Tensor x = at::cat({Inputs(FromSpan(history_emb, H, c.dim), w_->pos, 0, false, c.dim),
                          Inputs(FromSpan(candidate_emb, C, c.dim), w_->pos, H, true, c.dim)});
  // Mask: history causal; a candidate sees all history and itself.
  at::Tensor mask = at::zeros({H + C, H + C}, at::kFloat);
  if (H > 0) mask.narrow(0, 0, H).narrow(1, 0, H).copy_(at::ones({H, H}).tril());
  mask.narrow(0, H, C).narrow(1, 0, H).fill_(1);
  mask.narrow(0, H, C).narrow(1, H, C).copy_(at::eye(C, at::kFloat));
  for (const HstuLayer& L : w_->layers) {
    Uvqk p = Project(L, c, x);
    x = Residual(L, c, x, p, Attend(c, p.q, p.k, p.v, mask));
  }
  return CopyScores(Head(w_->head_w1, w_->head_b1, w_->head_w2, w_->head_b2, x.narrow(0, H, C)),
                    scores);
}

absl::Status HstuModel::ForwardCached(const KvPagesView& kv, uint64_t cached_len,
                                      std::span<const float> new_history_emb,
                                      std::span<const float> candidate_emb,
                                      std::span<float> scores) const {
  const ModelStep step{.kv = kv,
                       .cached_len = cached_len,
                       .new_history_emb = new_history_emb,
                       .candidate_emb = candidate_emb,
                       .scores = scores};
  return ForwardBatch(std::span<const ModelStep>(&step, 1));
}

namespace {

// One step's place in the batch: its rows of the packed token matrix (new history first, then
// candidates) and its keys.
struct StepPlan {
  int64_t first_row = 0;
  int64_t n = 0;    // new history tokens
  int64_t C = 0;    // candidates
  int64_t c0 = 0;   // cached tokens
  at::Tensor mask;  // [n + C, c0 + n + C]
};

absl::Status CheckStep(const HstuConfig& c, const ModelStep& s, size_t index, StepPlan* plan) {
  const std::string where = absl::StrCat("step ", index, ": ");
  int64_t n = 0, C = 0;
  if (absl::Status st = CheckRows("new history", s.new_history_emb, c.dim, &n); !st.ok()) {
    return absl::InvalidArgumentError(where + std::string(st.message()));
  }
  if (absl::Status st = CheckRows("candidates", s.candidate_emb, c.dim, &C); !st.ok()) {
    return absl::InvalidArgumentError(where + std::string(st.message()));
  }
  if (C == 0) return absl::InvalidArgumentError(where + "candidates: none");
  const int64_t c0 = static_cast<int64_t>(s.cached_len), total = c0 + n;
  if (total > c.max_positions) {
    return absl::OutOfRangeError(absl::StrCat(where, "history of ", total,
                                              " tokens exceeds max_positions ", c.max_positions));
  }
  if (s.scores.size() != static_cast<size_t>(C) * c.targets) {
    return absl::InvalidArgumentError(where + "scores: must hold candidates × targets floats");
  }
  const KvGeometry& g = s.kv.geometry;
  if (g.layers != c.layers || g.kv_dim != c.kv_dim() || g.dtype_bytes != 4 || g.page_tokens == 0) {
    return absl::InvalidArgumentError(absl::StrCat(where, "kv pages: geometry (layers ", g.layers,
                                                   ", kv_dim ", g.kv_dim, ", dtype ", g.dtype_bytes,
                                                   ") does not match the model (layers ", c.layers,
                                                   ", kv_dim ", c.kv_dim(), ", fp32)"));
  }
  if (s.kv.page_offsets.size() * uint64_t{g.page_tokens} < static_cast<uint64_t>(total) ||
      s.kv.pool == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(where, "kv pages: ", s.kv.page_offsets.size(),
                                                   " pages cannot hold ", total, " tokens"));
  }
  plan->n = n;
  plan->C = C;
  plan->c0 = c0;
  return absl::OkStatus();
}

// Runs fn(view of rows, index of its first row) over one layer's K or V of tokens
// [first, first + count) in the step's pages, a page at a time.
void ForEachPageBlock(const KvPagesView& kv, int64_t kv_dim, uint32_t layer, KvPart part,
                      int64_t first, int64_t count,
                      const std::function<void(at::Tensor, int64_t)>& fn) {
  const KvGeometry& g = kv.geometry;
  const int64_t pt = g.page_tokens;
  for (int64_t t = first; t < first + count;) {
    const int64_t page = t / pt, slot = t % pt, rows = std::min(pt - slot, first + count - t);
    float* base = reinterpret_cast<float*>(
        kv.pool + kv.page_offsets[page] + g.OffsetInPage(layer, part, static_cast<uint32_t>(slot)));
    fn(at::from_blob(base, {rows, kv_dim}, at::kFloat), t - first);
    t += rows;
  }
}

}  // namespace

absl::Status HstuModel::ForwardBatch(std::span<const ModelStep> steps) const {
  const HstuConfig& c = config_;
  std::vector<StepPlan> plans(steps.size());
  int64_t rows = 0;
  for (size_t i = 0; i < steps.size(); ++i) {
    if (absl::Status st = CheckStep(c, steps[i], i, &plans[i]); !st.ok()) return st;
    plans[i].first_row = rows;
    rows += plans[i].n + plans[i].C;
  }
  if (steps.empty()) return absl::OkStatus();
  at::NoGradGuard no_grad;
  const int64_t kvd = c.kv_dim(), hq = int64_t{c.heads} * c.d_qk, hv = int64_t{c.heads} * c.d_v;

  // The packed token matrix and the rows of the candidates, in step order.
  std::vector<at::Tensor> inputs;
  std::vector<int64_t> candidate_rows;
  for (size_t i = 0; i < steps.size(); ++i) {
    const ModelStep& s = steps[i];
    StepPlan& p = plans[i];
    const int64_t total = p.c0 + p.n;
    if (p.n > 0) {
      inputs.push_back(
          Inputs(FromSpan(s.new_history_emb, p.n, c.dim), w_->pos, p.c0, false, c.dim));
    }
    inputs.push_back(Inputs(FromSpan(s.candidate_emb, p.C, c.dim), w_->pos, total, true, c.dim));
    for (int64_t r = 0; r < p.C; ++r) candidate_rows.push_back(p.first_row + p.n + r);
    // Keys: cached history [0, c0), new history [c0, total), candidates. New token i (global
    // c0 + i) sees history keys j <= c0 + i; candidate r sees all history and itself.
    p.mask = at::zeros({p.n + p.C, total + p.C}, at::kFloat);
    if (p.n > 0) {
      p.mask.narrow(0, 0, p.n).narrow(1, 0, p.c0).fill_(1);
      p.mask.narrow(0, 0, p.n).narrow(1, p.c0, p.n).copy_(at::ones({p.n, p.n}).tril());
    }
    p.mask.narrow(0, p.n, p.C).narrow(1, 0, total).fill_(1);
    p.mask.narrow(0, p.n, p.C).narrow(1, total, p.C).copy_(at::eye(p.C, at::kFloat));
  }
  at::Tensor x = at::cat(inputs);

  for (uint32_t l = 0; l < c.layers; ++l) {
    const HstuLayer& L = w_->layers[l];
    Uvqk proj = Project(L, c, x);  // every token of the batch in one product
    std::vector<at::Tensor> attended;
    for (size_t i = 0; i < steps.size(); ++i) {
      const StepPlan& p = plans[i];
      const KvPagesView& kv = steps[i].kv;
      const int64_t len = p.n + p.C;
      at::Tensor q = proj.q.narrow(0, p.first_row, len);
      at::Tensor k = proj.k.narrow(0, p.first_row, len);
      at::Tensor v = proj.v.narrow(0, p.first_row, len);
      // The new tokens' K/V into their slots (padded to kv_dim).
      auto write = [&](KvPart part, const at::Tensor& src) {
        const int64_t width = src.size(1);
        ForEachPageBlock(kv, kvd, l, part, p.c0, p.n, [&](at::Tensor block, int64_t at_row) {
          block.narrow(1, 0, width).copy_(src.narrow(0, at_row, block.size(0)));
          if (width < kvd) block.narrow(1, width, kvd - width).zero_();
        });
      };
      auto read = [&](KvPart part, int64_t width) {
        at::Tensor out = at::empty({p.c0, width}, at::kFloat);
        ForEachPageBlock(kv, kvd, l, part, 0, p.c0, [&](at::Tensor block, int64_t at_row) {
          out.narrow(0, at_row, block.size(0)).copy_(block.narrow(1, 0, width));
        });
        return out;
      };
      if (p.n > 0) {
        write(KvPart::kKey, k.narrow(0, 0, p.n));
        write(KvPart::kValue, v.narrow(0, 0, p.n));
      }
      at::Tensor keys = at::cat({read(KvPart::kKey, hq), k});
      at::Tensor values = at::cat({read(KvPart::kValue, hv), v});
      attended.push_back(Attend(c, q, keys, values, p.mask));
    }
    x = Residual(L, c, x, proj, at::cat(attended));
  }

  at::Tensor cand = x.index_select(0, at::tensor(candidate_rows, at::kLong));
  at::Tensor all_scores =
      Head(w_->head_w1, w_->head_b1, w_->head_w2, w_->head_b2, cand).contiguous();
  int64_t at_row = 0;
  for (size_t i = 0; i < steps.size(); ++i) {
    absl::Status st = CopyScores(all_scores.narrow(0, at_row, plans[i].C), steps[i].scores);
    if (!st.ok()) return st;
    at_row += plans[i].C;
  }
  return absl::OkStatus();
}

}  // namespace hlem::serving
