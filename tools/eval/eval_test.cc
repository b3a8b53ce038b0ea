#include "tools/eval/eval.h"

#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "allocator_service/core/controller.h"
#include "allocator_service/core/mlp.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tools/eval/experiments.h"
#include "tools/twin_setup.h"

namespace hlem::eval {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;

std::string Read(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

class EvalTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::path(::testing::TempDir()) / ("hlem_eval_" + std::to_string(getpid()));
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  // A smoke run: the local profile's quick traces, one seed, into the test's folder.
  EvalOptions QuickLocal() const {
    return {.profile = "local",
            .out_dir = (dir_ / "results").string(),
            .work_dir = (dir_ / "work").string(),
            .seeds = {7},
            .jobs = 2,
            .quick = true,
            .repo = HLEM_SOURCE_DIR};
  }
  // Runs the experiment; its plot is a PNG where gnuplot is installed, else the run says so.
  void RunAndPlot(const std::string& name, const EvalOptions& o) const {
    const absl::Status st = RunExperiment(name, o);
    if (std::system("gnuplot --version > /dev/null 2>&1") == 0) {
      ASSERT_TRUE(st.ok()) << name << ": " << st;
      EXPECT_EQ(Read(dir_ / "results" / (name + ".png")).substr(1, 3), "PNG");
    } else {
      EXPECT_EQ(st.code(), absl::StatusCode::kFailedPrecondition);
    }
  }
  fs::path dir_;
};

TEST_F(EvalTest, RunParallelKeepsTaskOrderAndReportsFailures) {
  std::vector<Task> tasks;
  for (int i = 0; i < 7; ++i) {
    tasks.push_back([i]() -> absl::StatusOr<std::string> { return std::to_string(i * i); });
  }
  auto out = RunParallel(tasks, 3, dir_.string());
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_THAT(*out, ::testing::ElementsAre("0", "1", "4", "9", "16", "25", "36"));

  tasks[4] = []() -> absl::StatusOr<std::string> { return absl::InternalError("no room"); };
  auto failed = RunParallel(tasks, 2, dir_.string());
  EXPECT_THAT(std::string(failed.status().message()), HasSubstr("run 4"));
  EXPECT_THAT(std::string(failed.status().message()), HasSubstr("no room"));

  tasks[4] = []() -> absl::StatusOr<std::string> { std::abort(); };
  EXPECT_THAT(std::string(RunParallel(tasks, 2, dir_.string()).status().message()),
              HasSubstr("died"));
  EXPECT_EQ(RunParallel(tasks, 0, dir_.string()).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST_F(EvalTest, CachedRunsAreReusedOnlyForTheSameKeyAndACleanCommit) {
  const EvalOptions o{.work_dir = dir_.string()};
  int calls = 0;
  const Task count = [&calls]() -> absl::StatusOr<std::string> { return std::to_string(++calls); };
  const Stamp clean{.commit = "abc1234", .binary = "abc1234"};
  EXPECT_EQ(*CachedRun(o, clean, "trace=a alpha=0.5", count)(), "1");
  EXPECT_EQ(*CachedRun(o, clean, "trace=a alpha=0.5", count)(), "1");  // from the cache
  EXPECT_EQ(*CachedRun(o, clean, "trace=a alpha=0.6", count)(), "2");  // another run
  EXPECT_EQ(
      *CachedRun(o, Stamp{.commit = "def5678", .binary = "def5678"}, "trace=a alpha=0.5", count)(),
      "3");
  const Stamp dirty{.commit = "abc1234-dirty", .binary = "abc1234-dirty"};  // code may differ
  EXPECT_EQ(*CachedRun(o, dirty, "trace=a alpha=0.5", count)(), "4");
  EXPECT_EQ(*CachedRun(o, dirty, "trace=a alpha=0.5", count)(), "5");
  const Stamp other{.commit = "abc1234", .binary = "0ther00"};  // a binary of another commit
  EXPECT_EQ(*CachedRun(o, other, "trace=a alpha=0.5", count)(), "6");
  EXPECT_EQ(*CachedRun(o, other, "trace=a alpha=0.5", count)(), "7");
  EXPECT_THAT(other.Markdown(), HasSubstr("abc1234 (the binary: 0ther00)"));
  // The key names what decides a run.
  tools::SimSetupOptions run{
      .trace = "/x/paper-steady.trace",
      .node_config = std::string(HLEM_SOURCE_DIR) + "/deploy/local/node.yaml"};
  const std::string key = RunKey(run, 0.5);
  EXPECT_THAT(key, HasSubstr("trace=paper-steady.trace"));
  EXPECT_NE(key, RunKey(run, 0.6));
  run.router = "kv_only";
  EXPECT_NE(key, RunKey(run, 0.5));
}

TEST_F(EvalTest, SearchesAreCachedPerTwinInputsNotPerController) {
  const EvalOptions o{.work_dir = dir_.string()};
  const Stamp clean{.commit = "abc1234", .binary = "abc1234"};
  tools::SimSetupOptions run{
      .trace = "/x/paper-steady.trace",
      .node_config = std::string(HLEM_SOURCE_DIR) + "/deploy/local/node.yaml"};
  run.controller = {.name = "hlem", .weights = "policy.mlp"};
  auto [cache, key] = SearchCacheFor(o, clean, run, 0.5);
  ASSERT_NE(cache, nullptr);
  EXPECT_THAT(key, HasSubstr("commit=abc1234"));
  // Another controller over the same inputs: the same key; other inputs: another.
  tools::SimSetupOptions other_controller = run;
  other_controller.controller = {.name = "static"};
  EXPECT_EQ(SearchCacheFor(o, clean, other_controller, 0.5).second, key);
  EXPECT_NE(SearchCacheFor(o, clean, run, 0.6).second, key);
  EXPECT_NE(SearchCacheFor(o, Stamp{.commit = "def5678", .binary = "def5678"}, run, 0.5).second,
            key);
  // Where the code may differ from the commit nothing is cached.
  EXPECT_EQ(SearchCacheFor(o, Stamp{.commit = "abc1234-dirty", .binary = "abc1234-dirty"}, run, 0.5)
                .first,
            nullptr);
  EXPECT_EQ(SearchCacheFor(o, Stamp{.commit = "abc1234", .binary = "0ther00"}, run, 0.5).first,
            nullptr);

  const sim::WindowOracle found{.window = 3,
                                .alpha_star = 0.62,
                                .reward_star = 0.99,
                                .p99_star_ms = 13.5,
                                .curve = {{0.5, 0.98, 14.0}, {0.62, 0.99, 13.5}}};
  EXPECT_FALSE(cache->Find(key + " t=3").has_value());
  cache->Store(key + " t=3", found);
  // Read back by another cache over the same folder (another process's run).
  auto again = SearchCacheFor(o, clean, other_controller, 0.5).first;
  const std::optional<sim::WindowOracle> back = again->Find(key + " t=3");
  ASSERT_TRUE(back.has_value());
  EXPECT_EQ(back->alpha_star, 0.62);
  EXPECT_EQ(back->p99_star_ms, 13.5);
  ASSERT_EQ(back->curve.size(), 2u);
  EXPECT_EQ(back->curve[0].reward, 0.98);
  EXPECT_FALSE(again->Find(key + " t=4").has_value());
  // A file whose first line is another key (a hash collision) is not this search.
  size_t files = 0;
  for (const auto& f : fs::directory_iterator(dir_ / "searches")) {
    ++files;
    std::ofstream(f.path(), std::ios::trunc) << "another key\n" << sim::FormatWindowOracle(found);
  }
  EXPECT_EQ(files, 1u);
  EXPECT_FALSE(again->Find(key + " t=3").has_value());
  // A file with the key but a damaged search (a run killed mid-write by hand, a full disk) is
  // searched again, then replaced.
  for (const auto& f : fs::directory_iterator(dir_ / "searches")) {
    std::ofstream(f.path(), std::ios::trunc) << key << " t=3\n3 0x1p-1 0 0";
  }
  EXPECT_FALSE(again->Find(key + " t=3").has_value());
  again->Store(key + " t=3", found);
  EXPECT_TRUE(again->Find(key + " t=3").has_value());
}

TEST_F(EvalTest, ADeeperModelIsACopyOfTheNodeConfigThatStillLoads) {
  const EvalOptions o{.work_dir = dir_.string(), .repo = HLEM_SOURCE_DIR};
  const Profile paper = *FindProfile("paper", false);
  const ModelConfig own = *NodeConfigWithLayers(o, paper, 3);
  EXPECT_EQ(own.layers, 3);
  EXPECT_EQ(own.path, std::string(HLEM_SOURCE_DIR) + "/sim/profiles/paper/node.yaml");
  const ModelConfig deep = *NodeConfigWithLayers(o, paper, 6);
  EXPECT_EQ(deep.layers, 6);
  const std::string yaml = Read(deep.path);
  EXPECT_THAT(yaml, HasSubstr("layers: 6"));
  EXPECT_THAT(yaml, HasSubstr(std::string(HLEM_SOURCE_DIR) + "/sim/profiles/paper/shards.yaml"));
  auto setup = tools::LoadTwinSetup(
      {.node_config = deep.path,
       .costs = std::string(HLEM_SOURCE_DIR) + "/sim/costs/a100-published.yaml"});
  ASSERT_TRUE(setup.ok()) << setup.status();
  EXPECT_EQ(setup->twin.node.model.layers, 6);
}

// Each profile's SmartAllocator runs a committed policy shaped for the allocator (its 7 features
// in, one output per action).
TEST_F(EvalTest, EveryProfilesPolicyIsCommittedAndLoads) {
  for (const char* name : {"paper", "local"}) {
    const Profile p = *FindProfile(name, false);
    absl::StatusOr<allocator::Mlp> mlp =
        allocator::Mlp::Load(std::string(HLEM_SOURCE_DIR) + "/" + p.policy);
    ASSERT_TRUE(mlp.ok()) << name << ": " << mlp.status();
    EXPECT_EQ(mlp->inputs(), static_cast<uint32_t>(allocator::kNumFeatures)) << name;
    EXPECT_EQ(mlp->outputs(), allocator::kActions.size()) << name;
  }
}

TEST_F(EvalTest, UnknownNamesAreErrorsThatListTheKnownOnes) {
  EvalOptions o{.profile = "mars", .out_dir = dir_.string(), .repo = HLEM_SOURCE_DIR};
  EXPECT_THAT(std::string(RunExperiment("alpha-sweep", o).message()), HasSubstr("paper, local"));
  o.profile = "local";
  const absl::Status st = RunExperiment("nope", o);
  EXPECT_EQ(st.code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(st.message()), HasSubstr("alpha-sweep"));
}

// `hlem eval all` with no --seeds makes each page with the seeds it is published with.
TEST(SeedsForTest, EachExperimentsOwnUnlessGivenOrQuick) {
  auto find = [](const std::string& name) {
    for (const Experiment& e : Experiments()) {
      if (e.name == name) return e;
    }
    ADD_FAILURE() << "no experiment " << name;
    return Experiment{};
  };
  const std::vector<uint64_t> five = {101, 102, 103, 104, 105}, one = {101};
  EvalOptions o;
  EXPECT_EQ(SeedsFor(find("e2e"), o), five);  // the issue asks five seeds of experiment 1
  EXPECT_EQ(SeedsFor(find("routing"), o), five);
  for (const char* name :
       {"alpha-sweep", "tracking", "controllers", "ablations", "scale", "sensitivity"}) {
    EXPECT_EQ(SeedsFor(find(name), o), one) << name;
  }
  o.quick = true;
  EXPECT_EQ(SeedsFor(find("e2e"), o), one);
  o.seeds = {7, 8};
  EXPECT_EQ(SeedsFor(find("e2e"), o), o.seeds);
  EXPECT_EQ(SeedsFor(find("tracking"), o), o.seeds);
}

// The smoke version of experiment 2: every output produced and well-formed.
TEST(InteriorOptimumTest, InsideTheAlphasThatServeOnly) {
  EXPECT_STREQ(InteriorOptimum(4, 0, 9, 11), "yes");
  EXPECT_STREQ(InteriorOptimum(0, 0, 9, 11), "no (a grid end)");
  EXPECT_STREQ(InteriorOptimum(10, 0, 10, 11), "no (a grid end)");
  // α 1 (index 10) served nothing: 0.9 ends the αs that serve.
  EXPECT_STREQ(InteriorOptimum(9, 0, 9, 11), "no (the end of the αs that serve)");
  EXPECT_STREQ(InteriorOptimum(2, 2, 9, 11), "no (the end of the αs that serve)");
}

TEST_F(EvalTest, AlphaSweepQuickWritesItsCsvTableAndPlot) {
  const EvalOptions o = QuickLocal();
  const absl::Status st = RunExperiment("alpha-sweep", o);
  const bool gnuplot = std::system("gnuplot --version > /dev/null 2>&1") == 0;
  if (!gnuplot) {
    // Everything but the plot is written, and the error says what to install.
    EXPECT_EQ(st.code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_THAT(std::string(st.message()), HasSubstr("gnuplot-nox"));
  } else {
    ASSERT_TRUE(st.ok()) << st;
    const std::string png = Read(dir_ / "results" / "alpha-sweep.png");
    ASSERT_GT(png.size(), 1000u);
    EXPECT_EQ(png.substr(1, 3), "PNG");
  }
  // CSV: the stamp, a header, 3 regimes × 2 history lengths × 3 αs rows of 17 fields.
  const std::string csv = Read(dir_ / "results" / "alpha-sweep.csv");
  EXPECT_THAT(csv, HasSubstr("# commit: "));
  EXPECT_THAT(csv, HasSubstr("# profile: local"));
  int rows = 0;
  for (absl::string_view line : absl::StrSplit(csv, '\n', absl::SkipEmpty())) {
    if (line.front() == '#' || absl::StartsWith(line, "regime,")) continue;
    ++rows;
    const std::vector<std::string> f = absl::StrSplit(line, ',');
    ASSERT_EQ(f.size(), 17u) << line;
    EXPECT_THAT(f[0], ::testing::AnyOf("steady", "trend", "burst"));
    EXPECT_GT(std::stod(f[4]), 0) << "requests";
    EXPECT_EQ(f[4], f[5]) << "every request answered OK: " << line;
    EXPECT_GT(std::stod(f[8]), 0) << "P99";
  }
  EXPECT_EQ(rows, 18);
  // The table: a column per series, a row per α, one bold best per column, the stamp.
  const std::string md = Read(dir_ / "results" / "alpha-sweep.md");
  EXPECT_THAT(md, HasSubstr("Profile: local"));
  EXPECT_THAT(md, HasSubstr("| α | steady long | steady short | trend long | trend short | burst "
                            "long | burst short |"));
  EXPECT_THAT(md, HasSubstr("| 0.50 |"));
  int bold = 0;  // in the α rows
  for (absl::string_view line : absl::StrSplit(md, '\n')) {
    if (!absl::StartsWith(line, "| 0.")) continue;
    for (size_t at = line.find("**"); at != absl::string_view::npos; at = line.find("**", at + 2)) {
      ++bold;
    }
  }
  EXPECT_EQ(bold, 2 * 6);
  // One trace per series, kept for the next run.
  EXPECT_EQ(std::distance(fs::directory_iterator(dir_ / "work" / "traces"), {}), 6);
}

TEST_F(EvalTest, RoutingQuickComparesEveryPolicyPerRegime) {
  const EvalOptions o = QuickLocal();
  ASSERT_NO_FATAL_FAILURE(RunAndPlot("routing", o));
  // 3 regimes × 6 policies, each with its 16 fields; every request answered.
  const std::string csv = Read(dir_ / "results" / "routing.csv");
  int rows = 0;
  std::map<std::string, double> kv_given_up;  // steady, by policy
  for (absl::string_view line : absl::StrSplit(csv, '\n', absl::SkipEmpty())) {
    if (line.front() == '#' || absl::StartsWith(line, "regime,")) continue;
    ++rows;
    const std::vector<std::string> f = absl::StrSplit(line, ',');
    ASSERT_EQ(f.size(), 16u) << line;
    EXPECT_EQ(f[3], f[4]) << "every request answered OK: " << line;
    if (f[0] == "steady") kv_given_up[f[2]] = std::stod(f[12]);
  }
  EXPECT_EQ(rows, 18);
  // KV-only routing never leaves a user's K/V; round-robin does (the figure means something).
  EXPECT_EQ(kv_given_up["kv_only"], 0) << csv;
  EXPECT_GT(kv_given_up["round_robin"], 0) << csv;
  EXPECT_LE(kv_given_up["hlem"], kv_given_up["round_robin"]) << csv;
  const std::string md = Read(dir_ / "results" / "routing.md");
  for (const char* heading :
       {"## steady", "## trend", "## burst", "| hlem (configured weights) |"}) {
    EXPECT_THAT(md, HasSubstr(heading));
  }
}

// Rows of an experiment's CSV: its fields, without the stamp and the header (`header` starts it).
std::vector<std::vector<std::string>> Rows(const std::string& csv, absl::string_view header) {
  std::vector<std::vector<std::string>> rows;
  for (absl::string_view line : absl::StrSplit(csv, '\n', absl::SkipEmpty())) {
    if (line.front() == '#' || absl::StartsWith(line, header)) continue;
    rows.push_back(absl::StrSplit(line, ','));
  }
  return rows;
}

TEST_F(EvalTest, TrackingAndControllersMeasureTheGapToAlphaStar) {
  EvalOptions o = QuickLocal();
  o.controllers = {"hlem", "static", "kv_only", "pid"};  // the rest: `hlem eval controllers`
  for (const char* name : {"tracking", "controllers"}) {
    ASSERT_NO_FATAL_FAILURE(RunAndPlot(name, o));
  }
  // Tracking: a row per window after the warm-up; the gap lies between the distance of the
  // nodes' mean α and of their farthest α to α*.
  std::map<std::string, std::pair<double, int>> hlem_gap;  // by regime: sum, windows
  for (const auto& f : Rows(Read(dir_ / "results" / "tracking.csv"), "regime,")) {
    ASSERT_EQ(f.size(), 15u);
    const double star = std::stod(f[3]), mean = std::stod(f[6]), lo = std::stod(f[7]),
                 hi = std::stod(f[8]), gap = std::stod(f[9]);
    EXPECT_GE(star, 0);
    EXPECT_LE(star, 1);
    EXPECT_GE(std::stod(f[2]), 5) << "a window of the warm-up";
    EXPECT_GE(std::stod(f[4]), std::stod(f[5]) - 1e-3) << "α*'s reward is the best (a tie)";
    EXPECT_GE(gap, std::abs(mean - star) - 1e-9);
    EXPECT_LE(gap, std::max(std::abs(lo - star), std::abs(hi - star)) + 1e-9);
    hlem_gap[f[0]].first += gap;
    hlem_gap[f[0]].second += 1;
  }
  ASSERT_EQ(hlem_gap.size(), 3u);
  const std::string tracking = Read(dir_ / "results" / "tracking.md");
  for (const char* regime : {"| steady |", "| trend |", "| burst |"}) {
    EXPECT_THAT(tracking, HasSubstr(regime));
  }
  // Controllers: every controller made here × 3 regimes; HLEM's gap is the tracking page's (the
  // twin is deterministic), the static α's is |0.5 − α*|, and each decided every window.
  const std::string md = Read(dir_ / "results" / "controllers.md");
  const auto rows = Rows(Read(dir_ / "results" / "controllers.csv"), "controller,");
  std::map<std::string, int> regimes_of;
  for (const auto& f : rows) {
    ASSERT_EQ(f.size(), 22u);
    ++regimes_of[f[0]];
    const double gap = std::stod(f[16]);
    EXPECT_GE(gap, 0);
    EXPECT_LE(gap, 1);
    EXPECT_GT(std::stod(f[19]), 0) << "decisions of " << f[0];
    EXPECT_EQ(f[3], f[4]) << "every request answered OK: " << f[0] << " " << f[1];
    if (f[0] == "hlem") {
      const auto& [sum, n] = hlem_gap[f[1]];
      EXPECT_NEAR(gap, sum / n, 1e-6) << f[1];
    }
  }
  EXPECT_EQ(regimes_of.size(), o.controllers.size());
  for (const std::string& name : o.controllers) {
    EXPECT_EQ(regimes_of[name], 3) << name;
    EXPECT_THAT(md, HasSubstr(absl::StrCat("| `", name, "` |")));
  }
  o.controllers = {"hlem", "nope"};
  EXPECT_THAT(std::string(RunExperiment("controllers", o).message()),
              HasSubstr("--controllers: no controller 'nope'"));
}

TEST_F(EvalTest, AblationsClimbBothLadders) {
  const EvalOptions o = QuickLocal();
  ASSERT_NO_FATAL_FAILURE(RunAndPlot("ablations", o));
  // Per regime: the 3 static αs behind KV-affinity routing, then the 6 controller rungs.
  std::map<std::string, std::map<std::string, std::string>> p99;  // regime → system → P99
  int statics = 0;
  for (const auto& f : Rows(Read(dir_ / "results" / "ablations.csv"), "regime,")) {
    ASSERT_EQ(f.size(), 19u);
    EXPECT_EQ(f[6], f[7]) << "every request answered OK: " << f[0] << " " << f[2];
    if (f[3] == "static") {
      ++statics;
      EXPECT_EQ(f[4], "kv_only");
    } else {
      p99[f[0]][f[2]] = f[10];
    }
  }
  EXPECT_EQ(statics, 9);
  ASSERT_EQ(p99.size(), 3u);
  for (const auto& [regime, systems] : p99) {
    EXPECT_EQ(systems.size(), 6u) << regime;
    // The full SmartAllocator behind HLEM's router closes both ladders: the same run twice.
    EXPECT_EQ(systems.at("+router (HLEM)"), systems.at("PPO+adapter+recovery (HLEM)")) << regime;
  }
  const std::string md = Read(dir_ / "results" / "ablations.md");
  EXPECT_THAT(md, HasSubstr("## System: KV-EMB-Opt → +SmartAllocator → +router"));
  EXPECT_THAT(md, HasSubstr("| PPO-only | `hlem` |"));
}

TEST_F(EvalTest, ScaleGrowsTheLoadWithTheNodes) {
  const EvalOptions o = QuickLocal();
  ASSERT_NO_FATAL_FAILURE(RunAndPlot("scale", o));
  // Quick: 2 and 4 nodes × hot ratios 0.2 and 0.5.
  std::map<std::string, double> offered, requests;  // by nodes, at ratio 0.2
  int rows = 0;
  for (const auto& f : Rows(Read(dir_ / "results" / "scale.csv"), "nodes,")) {
    ASSERT_EQ(f.size(), 22u);
    ++rows;
    EXPECT_EQ(f[3], f[4]) << "every request answered OK";
    const double efficiency = std::stod(f[18]), alpha = std::stod(f[19]);
    EXPECT_GT(efficiency, 0.8) << f[0];
    EXPECT_LT(efficiency, 1.2) << f[0];
    EXPECT_GE(alpha, 0);
    EXPECT_LE(alpha, 1);
    EXPECT_GT(std::stod(f[20]), 0) << "the router's wall time per call";
    if (f[1] == "0.20") {
      offered[f[0]] = std::stod(f[16]);
      requests[f[0]] = std::stod(f[3]);
    }
  }
  EXPECT_EQ(rows, 4);
  EXPECT_DOUBLE_EQ(offered["4"], 2 * offered["2"]);
  EXPECT_GT(requests["4"], 1.5 * requests["2"]);  // twice the nodes, twice the requests
  const std::string md = Read(dir_ / "results" / "scale.md");
  EXPECT_THAT(md, HasSubstr("## Weak scaling"));
  EXPECT_THAT(md, HasSubstr("2, 4 nodes"));  // the stamp names the sizes run
  EXPECT_THAT(md, HasSubstr("| 0.5 |"));
}

TEST_F(EvalTest, SensitivityScalesOneCoefficientAtATime) {
  EvalOptions o = QuickLocal();
  o.coefficients = {"fetch_per_row", "link_bytes_per_second"};
  ASSERT_NO_FATAL_FAILURE(RunAndPlot("sensitivity", o));
  // 5 cost models (the profile's, 2 coefficients × 2 factors) × 3 regimes × (3 αs + HLEM).
  std::map<std::string, int> runs;              // by cost model
  std::map<std::string, std::string> p99_at_0;  // steady, α 0, by cost model
  for (const auto& f : Rows(Read(dir_ / "results" / "sensitivity.csv"), "costs,")) {
    ASSERT_EQ(f.size(), 18u);
    ++runs[f[0]];
    EXPECT_EQ(f[5], f[6]) << "every request answered OK";
    if (f[1] == "steady" && f[3] == "static" && f[4] == "0.00") p99_at_0[f[0]] = f[9];
  }
  ASSERT_EQ(runs.size(), 5u);
  for (const auto& [costs, n] : runs) EXPECT_EQ(n, 12) << costs;
  // α 0 keeps no EMB cache: every row is fetched, so the fetch cost shows in its P99; so does
  // the link (every fetched row is copied).
  EXPECT_NE(p99_at_0["fetch_per_row ×2"], p99_at_0["as in the profile"]);
  EXPECT_NE(p99_at_0["link_bytes_per_second ×0.5"], p99_at_0["as in the profile"]);
  const std::string md = Read(dir_ / "results" / "sensitivity.md");
  for (const char* regime : {"- steady:", "- trend:", "- burst:"}) {
    EXPECT_THAT(md, HasSubstr(regime));
  }
  o.coefficients = {"nope"};
  EXPECT_THAT(std::string(RunExperiment("sensitivity", o).message()),
              HasSubstr("--coefficients: no coefficient 'nope'"));
}

TEST_F(EvalTest, EndToEndQuickSetsEverySystemSideBySide) {
  EvalOptions o = QuickLocal();
  ASSERT_NO_FATAL_FAILURE(RunAndPlot("e2e", o));
  // 3 regimes × (test + training trace) × 3 grid αs, + HLEM on the 3 test traces.
  const std::string csv = Read(dir_ / "results" / "e2e.csv");
  int statics = 0, hlem = 0;
  for (absl::string_view line : absl::StrSplit(csv, '\n', absl::SkipEmpty())) {
    if (line.front() == '#' || absl::StartsWith(line, "layers,")) continue;
    const std::vector<std::string> f = absl::StrSplit(line, ',');
    ASSERT_EQ(f.size(), 19u) << line;
    EXPECT_EQ(f[6], f[7]) << "every request answered OK: " << line;
    (f[4] == "hlem" ? hlem : statics) += 1;
    EXPECT_EQ(f[3], f[2] == "1" ? "train" : "test") << line;
  }
  EXPECT_EQ(statics, 18);
  EXPECT_EQ(hlem, 3);
  const std::string md = Read(dir_ / "results" / "e2e.md");
  EXPECT_THAT(md, HasSubstr("## HSTU 2 layers (deployable static α "));
  for (const char* regime : {"| steady |", "| trend |", "| burst |"}) {
    EXPECT_THAT(md, HasSubstr(regime));
  }
  // The training seed is not a test seed.
  o.seeds = {1};
  EXPECT_THAT(std::string(RunExperiment("e2e", o).message()), HasSubstr("training"));
}

}  // namespace
}  // namespace hlem::eval
