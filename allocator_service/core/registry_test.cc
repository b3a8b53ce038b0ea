#include "allocator_service/core/registry.h"

#include <fstream>
#include <string>
#include <vector>

#include "allocator_service/core/mlp_testing.h"
#include "gtest/gtest.h"

namespace hlem::allocator {
namespace {

const std::string kPolicy =
    std::string(HLEM_SOURCE_DIR) + "/allocator_service/policies/ppo-local.mlp";

TEST(RegistryTest, EveryNameMakesItsController) {
  const std::vector<std::pair<std::string, std::string>> expected = {
      {"hlem", "policy+adapter+recovery"},
      {"ppo", "policy"},
      {"ppo+adapter", "policy+adapter"},
      {"ppo+recovery", "policy+recovery"},
      {"static", "static(0.40)"},
      {"kv_only", "static(0.00)"},
      {"recovery", "static(0.40)+recovery"},
      {"pid", "pid"},
      {"bo", "bo"},
      {"milp", "milp"},
      {"xgboost", "xgboost"}};
  // lstm is a plugin of the full build: allocator_service/lstm/lstm_test.cc covers it.
  ASSERT_EQ(expected.size() + 1, kControllerNames.size());
  const WindowState w{.index = 0,
                      .requests = 100,
                      .hot_user_ratio = 0.3,
                      .kv_hit_rate = 0.4,
                      .emb_hit_rate = 0.6,
                      .alpha = 0.4,
                      .p99_seconds = 0.030,
                      .slo_seconds = 0.025};
  for (const auto& [name, made] : expected) {
    absl::StatusOr<ControllerFactory> make =
        MakeControllerFactory({.name = name, .weights = kPolicy, .alpha = 0.4});
    ASSERT_TRUE(make.ok()) << name << ": " << make.status();
    std::unique_ptr<Controller> a = (*make)(), b = (*make)();  // one per node, independent
    ASSERT_NE(a, nullptr);
    EXPECT_NE(a.get(), b.get());
    EXPECT_EQ(a->name(), made);
    const std::vector<WindowState> h = {w};
    const Decision d = a->Decide(h);
    a->Learn();
    EXPECT_GE(d.alpha, 0.0) << name;
    EXPECT_LE(d.alpha, 1.0) << name;
  }
}

TEST(RegistryTest, BadSpecsNameTheFlag) {
  absl::StatusOr<ControllerFactory> bad = MakeControllerFactory({.name = "gru"});
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("--controller"), std::string::npos);
  bad = MakeControllerFactory({.name = "hlem"});  // no weights
  EXPECT_NE(bad.status().message().find("--weights"), std::string::npos);
  bad = MakeControllerFactory({.name = "ppo", .weights = "/nonexistent/actor.mlp"});
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(bad.status().message().find("--weights"), std::string::npos);
  // An actor of the wrong shape (5 inputs, 3 outputs).
  const std::string path = ::testing::TempDir() + "/wrong_shape.mlp";
  {
    absl::StatusOr<Mlp> m =
        Mlp::Create({.mean = std::vector<float>(5, 0.f), .std = std::vector<float>(5, 1.f)},
                    testing::RandomLayers({{5, 4}, {4, 3}}, 1, 0.5f), Activation::kTanh);
    ASSERT_TRUE(m.ok());
    std::ofstream(path) << m->Serialize();
  }
  bad = MakeControllerFactory({.name = "ppo+adapter", .weights = path});
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("--weights"), std::string::npos);
  bad = MakeControllerFactory({.name = "pid", .bounds = {.alpha_min = 0.8, .alpha_max = 0.2}});
  EXPECT_NE(bad.status().message().find("--alpha-min"), std::string::npos);
  EXPECT_FALSE(MakeControllerFactory({.name = "static", .alpha = 1.5}).ok());
  bad = MakeControllerFactory({.name = "hlem", .weights = kPolicy, .deadband = -0.1});
  EXPECT_NE(bad.status().message().find("--deadband"), std::string::npos) << bad.status();
  // Static controllers need no weights.
  EXPECT_TRUE(MakeControllerFactory({.name = "kv_only"}).ok());
}

}  // namespace
}  // namespace hlem::allocator
