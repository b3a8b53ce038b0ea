#include "allocator_service/core/registry.h"

#include <algorithm>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace hlem::allocator {

bool UsesPolicy(std::string_view name) { return name == "hlem" || name.starts_with("ppo"); }

absl::StatusOr<ControllerFactory> MakeControllerFactory(const ControllerSpec& spec) {
  if (std::find(kControllerNames.begin(), kControllerNames.end(), spec.name) ==
      kControllerNames.end()) {
    std::string names;
    for (std::string_view n : kControllerNames) {
      absl::StrAppend(&names, names.empty() ? "" : ", ", std::string(n));
    }
    return absl::InvalidArgumentError(
        absl::StrCat("--controller: unknown controller '", spec.name, "' (one of ", names, ")"));
  }
  if (!spec.bounds.Valid()) {
    return absl::InvalidArgumentError("--alpha-min/--alpha-max: 0 <= alpha_min <= alpha_max <= 1");
  }
  if (!(spec.alpha >= 0 && spec.alpha <= 1)) {
    return absl::InvalidArgumentError("--alpha: must be in [0, 1]");
  }
  std::shared_ptr<const Mlp> actor;
  if (UsesPolicy(spec.name)) {
    if (spec.weights.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("--weights: the ", spec.name, " controller needs the PPO actor"));
    }
    absl::StatusOr<Mlp> loaded = LoadActor(spec.weights);
    if (!loaded.ok()) {
      return absl::Status(loaded.status().code(),
                          absl::StrCat("--weights: ", loaded.status().message()));
    }
    actor = std::make_shared<const Mlp>(std::move(*loaded));
  }
  const std::string name = spec.name;
  const Bounds bounds = spec.bounds;
  const double alpha = spec.alpha;
  const uint64_t seed = spec.seed;
  const AdapterOptions adapter{.seed = seed, .bounds = bounds};
  const RecoveryOptions recovery{.bounds = bounds};
  // Every part was checked above: the makers below cannot fail.
  return ControllerFactory([=]() -> std::unique_ptr<Controller> {
    const auto policy = [&] { return *MakePolicy(*actor, bounds); };
    if (name == "hlem") return *MakeRecovery(*MakeAdapter(policy(), adapter), recovery);
    if (name == "ppo") return policy();
    if (name == "ppo+adapter") return *MakeAdapter(policy(), adapter);
    if (name == "ppo+recovery") return *MakeRecovery(policy(), recovery);
    if (name == "kv_only") return MakeStatic(0);
    if (name == "recovery") return *MakeRecovery(MakeStatic(alpha), recovery);
    if (name == "pid") return *MakePid({.bounds = bounds});
    if (name == "bo") return *MakeBayesOpt({.bounds = bounds});
    if (name == "milp") return *MakeMilp({.bounds = bounds});
    if (name == "xgboost") return *MakeXgbLatency({.seed = seed, .bounds = bounds});
    return MakeStatic(alpha);
  });
}

}  // namespace hlem::allocator
