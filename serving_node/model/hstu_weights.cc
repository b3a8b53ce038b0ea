#include "serving_node/model/hstu_weights.h"

#include <torch/csrc/jit/serialization/pickle.h>

#include <fstream>
#include <iterator>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace hlem::serving {
namespace {

std::string Shape(const at::Tensor& t) {
  return absl::StrCat("[", absl::StrJoin(t.sizes(), ", "), "]");
}

}  // namespace

std::vector<std::pair<std::string, at::Tensor>> HstuStateDict(const HstuConfig& c,
                                                              const HstuModel::Weights& w) {
  std::vector<std::pair<std::string, at::Tensor>> d;
  d.emplace_back("pos.weight", w.pos);
  for (uint32_t l = 0; l < c.layers; ++l) {
    const HstuLayer& L = w.layers[l];
    const std::string p = absl::StrCat("layers.", l, ".");
    d.emplace_back(p + "ln1.weight", L.ln1_w);
    d.emplace_back(p + "ln1.bias", L.ln1_b);
    d.emplace_back(p + "uvqk.weight", L.w_uvqk.t());
    d.emplace_back(p + "uvqk.bias", L.b_uvqk);
    d.emplace_back(p + "ln2.weight", L.ln2_w);
    d.emplace_back(p + "ln2.bias", L.ln2_b);
    d.emplace_back(p + "o.weight", L.w_o.t());
  }
  d.emplace_back("head.0.weight", w.head_w1.t());
  d.emplace_back("head.0.bias", w.head_b1);
  d.emplace_back("head.2.weight", w.head_w2.t());
  d.emplace_back("head.2.bias", w.head_b2);
  return d;
}

absl::Status HstuModel::Save(const std::string& path) const {
  c10::impl::GenericDict dict(c10::StringType::get(), c10::TensorType::get());
  for (auto& [name, t] : HstuStateDict(config_, *w_)) dict.insert(name, t.contiguous());
  std::vector<char> bytes;
  try {
    bytes = torch::jit::pickle_save(dict);
  } catch (const std::exception& e) {
    return absl::InternalError(absl::StrCat("model weights: cannot serialise: ", e.what()));
  }
  std::ofstream f(path, std::ios::binary);
  f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  if (!f) return absl::PermissionDeniedError(absl::StrCat("model weights: cannot write ", path));
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<HstuModel>> HstuModel::Load(const HstuConfig& config,
                                                           const std::string& path) {
  if (absl::Status st = config.Validate(); !st.ok()) return st;
  std::ifstream f(path, std::ios::binary);
  if (!f) return absl::NotFoundError(absl::StrCat("model weights: cannot open ", path));
  std::vector<char> bytes((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  c10::IValue value;
  try {
    value = torch::jit::pickle_load(bytes);
  } catch (const std::exception& e) {
    return absl::InvalidArgumentError(
        absl::StrCat("model weights ", path, ": not a torch.save file: ", e.what()));
  }
  if (!value.isGenericDict()) {
    return absl::InvalidArgumentError(
        absl::StrCat("model weights ", path, ": expected a state dict, found ", value.tagKind()));
  }
  absl::flat_hash_map<std::string, at::Tensor> found;
  for (const auto& entry : value.toGenericDict()) {
    if (!entry.key().isString() || !entry.value().isTensor()) {
      return absl::InvalidArgumentError(
          absl::StrCat("model weights ", path, ": every entry must map a name to a tensor"));
    }
    found[entry.key().toStringRef()] = entry.value().toTensor();
  }
  // The expected names and shapes: those of a model of this config.
  auto shape_of = CreateRandom(config, 0);
  if (!shape_of.ok()) return shape_of.status();
  auto w = std::make_unique<Weights>(*(*shape_of)->w_);
  std::vector<std::pair<std::string, at::Tensor>> expected = HstuStateDict(config, *w);
  absl::flat_hash_map<std::string, at::Tensor> loaded;
  for (const auto& [name, like] : expected) {
    auto it = found.find(name);
    if (it == found.end()) {
      return absl::InvalidArgumentError(
          absl::StrCat("model weights ", path, ": missing tensor '", name, "' ", Shape(like)));
    }
    if (it->second.sizes() != like.sizes()) {
      return absl::InvalidArgumentError(absl::StrCat("model weights ", path, ": tensor '", name,
                                                     "' has shape ", Shape(it->second),
                                                     ", the config needs ", Shape(like)));
    }
    if (!it->second.is_floating_point()) {
      return absl::InvalidArgumentError(
          absl::StrCat("model weights ", path, ": tensor '", name, "' is not floating point"));
    }
    at::Tensor t = it->second.to(at::kFloat).contiguous();
    if (!at::isfinite(t).all().item<bool>()) {
      return absl::InvalidArgumentError(absl::StrCat("model weights ", path, ": tensor '", name,
                                                     "' holds NaN or infinite values"));
    }
    loaded[name] = std::move(t);
    found.erase(it);
  }
  if (!found.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("model weights ", path, ": unexpected tensor '", found.begin()->first, "'"));
  }
  w->pos = loaded["pos.weight"];
  for (uint32_t l = 0; l < config.layers; ++l) {
    HstuLayer& L = w->layers[l];
    const std::string p = absl::StrCat("layers.", l, ".");
    L.ln1_w = loaded[p + "ln1.weight"];
    L.ln1_b = loaded[p + "ln1.bias"];
    L.w_uvqk = loaded[p + "uvqk.weight"].t().contiguous();
    L.b_uvqk = loaded[p + "uvqk.bias"];
    L.ln2_w = loaded[p + "ln2.weight"];
    L.ln2_b = loaded[p + "ln2.bias"];
    L.w_o = loaded[p + "o.weight"].t().contiguous();
  }
  w->head_w1 = loaded["head.0.weight"].t().contiguous();
  w->head_b1 = loaded["head.0.bias"];
  w->head_w2 = loaded["head.2.weight"].t().contiguous();
  w->head_b2 = loaded["head.2.bias"];
  return std::unique_ptr<HstuModel>(new HstuModel(config, std::move(w)));
}

}  // namespace hlem::serving
