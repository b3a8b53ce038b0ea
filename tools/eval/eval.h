#pragma once
// `hlem eval`: the experiments of the evaluation (issue 8; ARCHITECTURE §8), run in the digital
// twin and written to an output folder (docs/results/ by default) as a CSV, a Markdown table and
// a PNG plot each, every file stamped with the commit, seeds, profile, device, cost-model file and
// wall time. The twin runs of an experiment are independent: they run in child processes, `jobs`
// at a time (fork; the twin is single-threaded and deterministic, so the results do not depend on
// the number of jobs).

#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "sim/workload/workload.h"
#include "tools/sim_runner.h"

namespace hlem::eval {

// Where and how an experiment runs in the twin.
struct Profile {
  std::string name;             // "paper", "local"
  std::string node_config;      // the nodes' YAML
  std::string costs;            // sim/costs/*.yaml
  std::string workload;         // the workload YAML (rates, histories; phases are the experiment's)
  uint32_t nodes = 4;           // serving nodes simulated
  uint32_t emb_sample = 1;      // --emb-sample
  bool history_sketch = false;  // --history-sketch (first visits from sketches; needs emb_sample)
  double rate_per_node = 10;    // requests/s per node
  double duration_s = 180;      // per trace (one regime)
  double warmup_s = 30;         // left out of the figures
  uint32_t search_every = 1;    // tracked runs search α* every this many windows (its cost)
  // The committed PPO policy the SmartAllocator runs with (relative to the repository;
  // allocator_service/policies/README.md).
  std::string policy;
  std::string note;  // one line on what the profile stands for, printed with results
};

// The built-in profiles: `paper` (sim/profiles/paper, published A100 costs; 8 of the 256 nodes at
// a realistic load, docs/results/README.md) and `local` (deploy/local, the fitted CPU costs).
// `quick` shortens the traces and the grids (smoke runs, CI). NOT_FOUND names the known ones.
absl::StatusOr<Profile> FindProfile(const std::string& name, bool quick);

struct EvalOptions {
  std::string profile = "paper";
  std::string out_dir = "docs/results";
  std::string work_dir = "out/eval";  // traces and per-run files (reused when present)
  // Workload seeds, one trace per regime each. Empty: each experiment's own (`Experiment::seeds`;
  // kDefaultSeed alone in a quick run).
  std::vector<uint64_t> seeds;
  uint32_t jobs = 2;
  std::vector<int> layers = {3, 6};       // the model depths of experiment 1 (quick: the profile's)
  std::vector<std::string> controllers;   // experiment 4's (empty: every one of the registry)
  std::vector<uint32_t> sizes;            // experiment 7's node counts (empty: the profile's)
  std::vector<std::string> coefficients;  // sensitivity's cost coefficients (empty: every one)
  bool quick = false;
  std::string repo = ".";  // for the commit stamp (git); the configs' paths are relative to it
};

// What every output file says about how it was made.
struct Stamp {
  std::string commit;        // git describe of `repo` (+dirty), or "unknown"
  std::string binary;        // the commit this binary was built from (common/build_info.h)
  std::string costs_commit;  // the last commit that changed the cost-model file
  std::string device;        // the cost model's device line
  std::string profile_line;  // profile, nodes, load, note
  std::string seeds;
  double wall_s = 0;
  std::string Markdown() const;    // a short block for the top of a results page
  std::string CsvComment() const;  // "# ..." lines for the top of a CSV
};

// The profile's workload config (its YAML under `repo`).
absl::StatusOr<sim::WorkloadConfig> LoadWorkload(const EvalOptions& options,
                                                 const Profile& profile);

// A trace of one regime, generated once into work_dir/traces/ (the file name holds every
// parameter, so a cached one is reused only when it is the same workload).
struct TraceSpec {
  sim::Regime regime = sim::Regime::kSteady;
  uint64_t seed = 101;
  double history_scale = 0;  // 0: the profile's
  double hot_ratio = 0.2;    // steady's, and where trend starts
  double users_scale = 1;    // users and hot users × this (weak scaling: with the nodes)
};
absl::StatusOr<std::string> MakeTrace(const EvalOptions& options, const Profile& profile,
                                      const TraceSpec& spec);

// Steady, Trend and Burst: the regimes of every experiment.
const std::vector<sim::Regime>& Regimes();
// The traces of each regime and seed (regime-major: traces[r · seeds + k]), made in parallel; the
// cost model's device into the stamp.
absl::StatusOr<std::vector<std::string>> RegimeTraces(const EvalOptions& options,
                                                      const Profile& profile, Stamp& stamp);

// The profile's node config with `layers` HSTU layers: the file itself when it has them (or
// layers <= 0), else a copy under work_dir/configs with the model's layer count changed and its
// shard file's path made absolute.
struct ModelConfig {
  std::string path;
  int layers = 0;
};
absl::StatusOr<ModelConfig> NodeConfigWithLayers(const EvalOptions& options, const Profile& profile,
                                                 int layers);

// A copy of the profile's node config under work_dir/configs (<profile>-node-<suffix>.yaml),
// changed by `edit` (errors are prefixed with the file's name), its shard file's path made
// absolute.
absl::StatusOr<std::string> NodeConfigVariant(
    const EvalOptions& options, const Profile& profile, const std::string& suffix,
    const std::function<absl::Status(std::string*)>& edit);

// The options of one twin run of the profile over `trace` at a static α.
tools::SimSetupOptions SimOptions(const EvalOptions& options, const Profile& profile,
                                  const std::string& trace, double alpha);

// A task's figures travel as one line of comma-separated numbers (%.10g).
std::string FormatNumbers(const std::vector<double>& values);
// INTERNAL unless the line holds exactly `count` numbers.
absl::StatusOr<std::vector<double>> ParseNumbers(const std::string& line, size_t count);

// The figures of one twin run: over the requests after the warm-up (latencies of OK answers).
struct Figures {
  double requests = 0, ok = 0, p50_ms = 0, p90_ms = 0, p99_ms = 0;
  double slo = 0;                            // SLO satisfaction (failures miss it)
  double kv_reuse = 0;                       // cached ÷ history tokens
  double emb_hit = 0;                        // EMB rows hit ÷ looked up
  double stale = 0;                          // stale KV hits ÷ requests
  double kv_given_up = 0, emb_given_up = 0;  // tools::SimRunResult's
  double reward = 0;                         // ARCHITECTURE §3, over the whole run
  double wall_s = 0;
  static constexpr char kCsvColumns[] =
      "requests,ok,p50_ms,p90_ms,p99_ms,slo_satisfaction,kv_reuse,emb_hit_rate,stale_kv_hit_rate,"
      "kv_given_up,emb_given_up,reward,wall_s";
  std::string Format() const;  // the CSV fields, in kCsvColumns' order
  static absl::StatusOr<Figures> Parse(const std::string& fields);
};

// The static αs the oracle static α is chosen from: 0, 0.1, …, 1 (quick: 0, 0.5, 0.8).
std::vector<double> StaticGrid(bool quick);

// Index of the best figures by reward, ties by P99 (the first of equal ones); 0 when empty.
size_t BestByReward(const std::vector<Figures>& figures);

// Runs the twin over the options' trace at α (tools::PrepareSim, tools::RunOnce).
absl::StatusOr<Figures> RunFigures(const tools::SimSetupOptions& options, double alpha);
// The figures of a finished run.
Figures FiguresOf(const tools::SimSetup& setup, const tools::SimRunResult& run);

// A key for a twin run of these options at α: every input that decides its figures (the trace
// file's name holds its generator config's hash; the configs' and weights' contents are hashed).
std::string RunKey(const tools::SimSetupOptions& options, double alpha);

// Runs `tasks` in child processes, `jobs` at a time; returns each task's output in task order.
// A task that fails (non-OK status, a crash, a signal) fails the whole call with its index and
// message, after the tasks in flight have finished.
using Task = std::function<absl::StatusOr<std::string>()>;
absl::StatusOr<std::vector<std::string>> RunParallel(const std::vector<Task>& tasks, uint32_t jobs,
                                                     const std::string& work_dir);

// An experiment's twin runs (RunParallel), announced on stderr, their wall time into the stamp.
absl::StatusOr<std::vector<std::string>> RunExperimentRuns(const EvalOptions& options,
                                                           size_t traces,
                                                           const std::vector<Task>& runs,
                                                           Stamp& stamp);

// `run`, cached under work_dir/runs/ by `key` and the commit: the twin is deterministic, so the
// same code, inputs and options give the same figures (an experiment reuses another's runs).
// Nothing is cached when the commit is unknown, the tree has changes or the binary was built
// from another commit (the code may differ).
Task CachedRun(const EvalOptions& options, const Stamp& stamp, const std::string& key, Task run);
// Where CachedRun caches (a clean tree and the binary built from its commit), a sim::SearchCache
// of α*_t searches under work_dir/searches/ — a file per search, named by the key's hash, its
// first line the whole key — and the key of the twin's inputs for `run` (the commit and RunKey
// without the controller: controllers that apply the same αs share their searches); else a
// null cache.
std::pair<std::shared_ptr<sim::SearchCache>, std::string> SearchCacheFor(
    const EvalOptions& options, const Stamp& stamp, const tools::SimSetupOptions& run,
    double alpha);
// RunFigures as a cached task (its output: Figures::Format()).
Task FiguresTask(const EvalOptions& options, const Stamp& stamp, const tools::SimSetupOptions& run,
                 double alpha);

// Renders `script` (gnuplot, reading data files it names) into `png` with gnuplot-nox
// (scripts/install-deps.sh installs it); FAILED_PRECONDITION when gnuplot is not installed.
absl::Status Plot(const std::string& script, const std::string& png, const std::string& work_dir);

// Writes out_dir/<name>.csv and <name>.md, then <name>.png: a clustered bar chart of `table`
// (gnuplot data: a header row of the bars' titles after one for the label column, then a row per
// cluster: its label and a value per bar), saved under work_dir/plots; the y axis starts at 0
// unless !from_zero (values of either sign).
absl::Status WriteBarChartResults(const EvalOptions& options, const std::string& name,
                                  const std::string& csv, const std::string& md,
                                  const std::string& table, size_t bars, const std::string& title,
                                  const std::string& ylabel, bool from_zero = true);

// Writes `body` to `path` through a temporary file and a rename (creating the folder).
absl::Status WriteFileAtomically(const std::filesystem::path& path, const std::string& body);

// Writes `body` to out_dir/name (creating the folder).
absl::Status WriteOutput(const EvalOptions& options, const std::string& name,
                         const std::string& body);

// One experiment: its files are out_dir/<name>.{csv,md,png}.
// The seed of an experiment that names none, and of every quick run.
inline constexpr uint64_t kDefaultSeed = 101;

struct Experiment {
  std::string name;
  std::string summary;
  std::function<absl::Status(const EvalOptions&, const Profile&, Stamp&)> run;
  // The seeds its page is made with when --seeds is not given: the issue asks five for the
  // end-to-end experiment; the tracked ones (tracking, controllers) and sensitivity cost ×5 a seed.
  std::vector<uint64_t> seeds = {kDefaultSeed};
};
const std::vector<Experiment>& Experiments();

// The seeds `e` runs with: --seeds when given, else kDefaultSeed in a quick run, else e.seeds.
std::vector<uint64_t> SeedsFor(const Experiment& e, const EvalOptions& options);

// Runs the named experiment ("all": each in turn); progress on stderr.
absl::Status RunExperiment(const std::string& name, const EvalOptions& options);

}  // namespace hlem::eval
