#include "allocator_service/core/registry.h"

#include <dlfcn.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "allocator_service/lstm/lstm_controller.h"
#include "common/status_macros.h"

namespace hlem::allocator {

namespace {

// Whether `name` runs the PPO base policy (and so needs weights).
bool UsesPolicy(std::string_view name) { return name == "hlem" || name.starts_with("ppo"); }

using MakeLstmFn = Controller* (*)(const LstmOptions*, std::string*);

// The lstm plugin's factory, loaded once (never unloaded: its controllers live on).
absl::StatusOr<MakeLstmFn> LoadLstmPlugin() {
  static const absl::StatusOr<MakeLstmFn> loaded = []() -> absl::StatusOr<MakeLstmFn> {
    std::vector<std::string> dirs;
    if (const char* env = std::getenv("HLEM_PLUGIN_DIR"); env != nullptr && *env != 0) {
      dirs.push_back(env);
    }
    dirs.push_back(HLEM_PLUGIN_DIR);
    std::error_code ec;
    const std::filesystem::path exe = std::filesystem::read_symlink("/proc/self/exe", ec);
    if (!ec) dirs.push_back((exe.parent_path().parent_path() / "lib" / "hlem").string());
    std::string tried;
    for (const std::string& dir : dirs) {
      const std::string path = dir + "/libhlem_lstm.so";
      if (!std::filesystem::exists(path, ec)) {
        absl::StrAppend(&tried, tried.empty() ? "" : ", ", path);
        continue;
      }
      void* h = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
      if (h == nullptr) {
        return absl::FailedPreconditionError(
            absl::StrCat("--controller lstm: cannot load ", path, ": ", dlerror()));
      }
      const auto version =
          reinterpret_cast<const char* (*)()>(dlsym(h, "hlem_lstm_plugin_version"));
      const auto make = reinterpret_cast<MakeLstmFn>(dlsym(h, "hlem_make_lstm_controller"));
      if (version == nullptr || make == nullptr ||
          std::string(version()) != HLEM_LSTM_PLUGIN_VERSION) {
        return absl::FailedPreconditionError(absl::StrCat("--controller lstm: ", path, " is not a ",
                                                          HLEM_LSTM_PLUGIN_VERSION, " plugin"));
      }
      return make;
    }
    return absl::FailedPreconditionError(absl::StrCat(
        "--controller lstm: the plugin libhlem_lstm.so was not found (tried ", tried,
        "; it is built with the full build, not the core-only one; HLEM_PLUGIN_DIR names its "
        "directory)"));
  }();
  return loaded;
}

}  // namespace

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
  if (!(spec.deadband >= 0 && spec.deadband <= 1)) {
    return absl::InvalidArgumentError("--deadband: must be in [0, 1]");
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
  MakeLstmFn make_lstm = nullptr;
  const LstmOptions lstm{.seed = spec.seed, .bounds = spec.bounds};
  if (spec.name == "lstm") {
    ASSIGN_OR_RETURN(make_lstm, LoadLstmPlugin());
    std::string error;
    if (std::unique_ptr<Controller> probe(make_lstm(&lstm, &error)); probe == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat("--controller lstm: ", error));
    }
  }
  const uint64_t seed = spec.seed;
  const AdapterOptions adapter{.deadband = spec.deadband, .seed = seed, .bounds = bounds};
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
    if (name == "lstm") {
      std::string error;
      return *MakeRecovery(std::unique_ptr<Controller>(make_lstm(&lstm, &error)), recovery);
    }
    return MakeStatic(alpha);
  });
}

}  // namespace hlem::allocator
