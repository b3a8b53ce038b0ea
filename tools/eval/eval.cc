#include "tools/eval/eval.h"

#include <fcntl.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <memory>
#include <optional>
#include <regex>
#include <sstream>
#include <string_view>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "common/build_info.h"
#include "common/rng.h"
#include "common/status_macros.h"
#include "sim/workload/trace.h"
#include "tools/eval/experiments.h"

extern char** environ;

namespace hlem::eval {
namespace {

namespace fs = std::filesystem;

// Runs argv[0] (PATH searched) and returns its exit status (-1 when it could not start); its
// stdout into *out when given.
int RunCommand(const std::vector<std::string>& args, std::string* out = nullptr,
               const std::string& err_path = "") {
  std::vector<char*> argv;
  for (const std::string& a : args) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  int fds[2] = {-1, -1};
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  if (out != nullptr) {
    if (pipe(fds) != 0) return -1;
    posix_spawn_file_actions_adddup2(&actions, fds[1], STDOUT_FILENO);
    posix_spawn_file_actions_addclose(&actions, fds[0]);
  } else {
    posix_spawn_file_actions_addopen(&actions, STDOUT_FILENO, "/dev/null", O_WRONLY, 0);
  }
  posix_spawn_file_actions_addopen(&actions, STDERR_FILENO,
                                   err_path.empty() ? "/dev/null" : err_path.c_str(),
                                   O_WRONLY | O_CREAT | O_TRUNC, 0644);
  pid_t pid = 0;
  const int spawned = posix_spawnp(&pid, argv[0], &actions, nullptr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  if (out != nullptr) {
    close(fds[1]);
    if (spawned == 0) {
      std::array<char, 4096> buf;
      ssize_t n;
      while ((n = read(fds[0], buf.data(), buf.size())) > 0) out->append(buf.data(), n);
    }
    close(fds[0]);
  }
  if (spawned != 0) return -1;
  int status = 0;
  if (waitpid(pid, &status, 0) < 0) return -1;
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

std::string Git(const std::string& repo, std::vector<std::string> args) {
  args.insert(args.begin(), {"git", "-C", repo});
  std::string out;
  if (RunCommand(args, &out) != 0) return "unknown";
  out = std::string(absl::StripAsciiWhitespace(out));
  return out.empty() ? "unknown" : out;
}

absl::StatusOr<std::string> ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot read ", path));
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

}  // namespace

absl::Status WriteFileAtomically(const fs::path& path, const std::string& body) {
  std::error_code ec;
  fs::create_directories(path.parent_path(), ec);
  const fs::path tmp = path.string() + ".tmp" + std::to_string(getpid());
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    out << body;
    if (!out) return absl::UnavailableError(absl::StrCat("cannot write ", tmp.string()));
  }
  fs::rename(tmp, path, ec);
  if (ec) return absl::UnavailableError(absl::StrCat("cannot write ", path.string()));
  return absl::OkStatus();
}

absl::StatusOr<Profile> FindProfile(const std::string& name, bool quick) {
  Profile p;
  if (name == "paper") {
    p = {.name = "paper",
         .node_config = "sim/profiles/paper/node.yaml",
         .costs = "sim/costs/a100-published.yaml",
         .workload = "sim/profiles/paper/workload.yaml",
         .nodes = 8,
         .emb_sample = 256,
         .history_sketch = true,
         .rate_per_node = 40,
         .duration_s = 180,
         .warmup_s = 30,
         .search_every = 3,
         // A policy trained in this profile's twin did no better (docs/allocator.md, "A policy
         // trained at paper scale"): the local one stays.
         .policy = "allocator_service/policies/ppo-local.mlp",
         .note =
             "simulated: 8 of the paper's 256 A100-80GB serving nodes at 40 requests/s each; "
             "the device's costs are published figures, not measurements; EMB rows sampled 1 in "
             "256 and first visits' histories sketched (docs/simulator.md)"};
    if (quick) {
      p.duration_s = 20;
      p.warmup_s = 5;
      p.rate_per_node = 10;
    }
  } else if (name == "local") {
    p = {.name = "local",
         .node_config = "deploy/local/node.yaml",
         .costs = "sim/costs/cpu-local-cluster.yaml",
         .workload = "deploy/local/workload.yaml",
         .nodes = 4,
         .emb_sample = 1,
         .rate_per_node = 10,
         .duration_s = 180,
         .warmup_s = 30,
         .policy = "allocator_service/policies/ppo-local.mlp",
         .note = "simulated: the local cluster's 4 CPU serving nodes, costs fitted to its runs"};
    if (quick) {
      p.duration_s = 20;
      p.warmup_s = 5;
    }
  } else {
    return absl::NotFoundError(
        absl::StrCat("--profile: no profile '", name, "' (known: paper, local)"));
  }
  if (quick) p.note += " (quick: short traces, coarse grids)";
  return p;
}

namespace {
// The commit, and the binary's when it was built from another one.
std::string CommitText(const Stamp& s) {
  return s.binary == s.commit ? s.commit : absl::StrCat(s.commit, " (the binary: ", s.binary, ")");
}
}  // namespace

std::string Stamp::Markdown() const {
  return absl::StrFormat(
      "> Profile: %s. Commit %s; seeds %s; device: %s; cost model at commit %s; wall time %.0f "
      "s.\n",
      profile_line, CommitText(*this), seeds, device, costs_commit, wall_s);
}

std::string Stamp::CsvComment() const {
  return absl::StrFormat(
      "# profile: %s\n# commit: %s\n# seeds: %s\n# device: %s\n# cost model commit: %s\n# wall "
      "time: %.0f s\n",
      profile_line, CommitText(*this), seeds, device, costs_commit, wall_s);
}

absl::StatusOr<sim::WorkloadConfig> LoadWorkload(const EvalOptions& options,
                                                 const Profile& profile) {
  ASSIGN_OR_RETURN(const std::string yaml,
                   ReadFile((fs::path(options.repo) / profile.workload).string()));
  absl::StatusOr<sim::WorkloadConfig> parsed = sim::ParseWorkloadConfig(yaml);
  if (!parsed.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat(profile.workload, ": ", parsed.status().message()));
  }
  return parsed;
}

absl::StatusOr<std::string> MakeTrace(const EvalOptions& options, const Profile& profile,
                                      const TraceSpec& spec) {
  ASSIGN_OR_RETURN(sim::WorkloadConfig c, LoadWorkload(options, profile));
  c.seed = spec.seed;
  c.rate = profile.rate_per_node * profile.nodes;
  if (spec.history_scale > 0) c.history_scale = spec.history_scale;
  if (spec.users_scale != 1) {
    c.users = static_cast<uint64_t>(std::llround(static_cast<double>(c.users) * spec.users_scale));
    c.hot_users =
        static_cast<uint64_t>(std::llround(static_cast<double>(c.hot_users) * spec.users_scale));
  }
  // One phase of the regime (ARCHITECTURE §8): steady at 0.2, trend 0.2 → 0.5, bursts to 0.5 of
  // 3–5 windows, one a minute on average so that a 3-minute trace holds some.
  c.phases = {sim::Phase{.regime = spec.regime,
                         .duration = absl::Seconds(profile.duration_s),
                         .hot_ratio = spec.hot_ratio,
                         .hot_ratio_end = 0.5,
                         .burst_ratio = 0.5,
                         .bursts_per_hour = 60,
                         .burst_min_windows = 3,
                         .burst_max_windows = 5}};
  const std::string canonical = sim::WorkloadConfigYaml(c);
  const fs::path path =
      fs::path(options.work_dir) / "traces" /
      absl::StrFormat("%s-%s-seed%d-g%d-%016x.trace", profile.name, sim::RegimeName(spec.regime),
                      spec.seed, sim::kGeneratorVersion, NameHash(canonical));
  if (fs::exists(path)) return path.string();
  ASSIGN_OR_RETURN(std::unique_ptr<sim::WorkloadGenerator> generator,
                   sim::WorkloadGenerator::Create(c));
  std::error_code ec;
  fs::create_directories(path.parent_path(), ec);
  const std::string tmp = path.string() + ".tmp" + std::to_string(getpid());
  ASSIGN_OR_RETURN(const uint64_t written, sim::WriteTrace(*generator, tmp));
  (void)written;
  fs::rename(tmp, path, ec);
  if (ec) return absl::UnavailableError(absl::StrCat("cannot write ", path.string()));
  return path.string();
}

absl::StatusOr<std::string> NodeConfigVariant(
    const EvalOptions& o, const Profile& p, const std::string& suffix,
    const std::function<absl::Status(std::string*)>& edit) {
  const fs::path original = fs::path(o.repo) / p.node_config;
  ASSIGN_OR_RETURN(std::string yaml, ReadFile(original.string()));
  if (absl::Status st = edit(&yaml); !st.ok()) {
    return absl::Status(st.code(), absl::StrCat(original.string(), ": ", st.message()));
  }
  std::smatch shards;
  if (std::regex_search(yaml, shards, std::regex(R"(\n\s+config:\s*([^\s#]+))")) &&
      fs::path(shards[1].str()).is_relative()) {
    yaml.replace(static_cast<size_t>(shards.position(1)), static_cast<size_t>(shards.length(1)),
                 (fs::absolute(original.parent_path()) / shards[1].str()).string());
  }
  const fs::path path =
      fs::path(o.work_dir) / "configs" / absl::StrCat(p.name, "-node-", suffix, ".yaml");
  RETURN_IF_ERROR(WriteFileAtomically(path, yaml));
  return path.string();
}

absl::StatusOr<ModelConfig> NodeConfigWithLayers(const EvalOptions& o, const Profile& p,
                                                 int layers) {
  const fs::path original = fs::path(o.repo) / p.node_config;
  ASSIGN_OR_RETURN(const std::string yaml, ReadFile(original.string()));
  const std::regex layers_line(R"((\n\s+layers:\s*)(\d+))");
  std::smatch m;
  if (!std::regex_search(yaml, m, layers_line)) {
    return absl::InvalidArgumentError(absl::StrCat(original.string(), ": no model layers line"));
  }
  const int own = std::stoi(m[2].str());
  if (layers <= 0 || own == layers) return ModelConfig{original.string(), own};
  ASSIGN_OR_RETURN(const std::string path,
                   NodeConfigVariant(o, p, absl::StrCat(layers, "-layers"), [&](std::string* text) {
                     std::smatch at;
                     std::regex_search(*text, at, layers_line);
                     // (Spliced by position: a "$1" + digits replacement would read as another
                     // group.)
                     text->replace(static_cast<size_t>(at.position(2)),
                                   static_cast<size_t>(at.length(2)), std::to_string(layers));
                     return absl::OkStatus();
                   }));
  return ModelConfig{path, layers};
}

tools::SimSetupOptions SimOptions(const EvalOptions& options, const Profile& profile,
                                  const std::string& trace, double alpha) {
  const fs::path repo(options.repo);
  return {.trace = trace,
          .node_config = (repo / profile.node_config).string(),
          .costs = (repo / profile.costs).string(),
          .nodes = profile.nodes,
          .emb_sample = profile.emb_sample,
          .history_sketch = profile.history_sketch,
          .controller = {.name = "static", .alpha = alpha},
          .warmup_s = profile.warmup_s};
}

std::string FormatNumbers(const std::vector<double>& values) {
  std::string out;
  for (double v : values) absl::StrAppendFormat(&out, "%s%.10g", out.empty() ? "" : ",", v);
  return out;
}

absl::StatusOr<std::vector<double>> ParseNumbers(const std::string& line, size_t count) {
  std::vector<double> out;
  for (absl::string_view part : absl::StrSplit(line, ',')) {
    double v = 0;
    if (!absl::SimpleAtod(part, &v)) break;
    out.push_back(v);
  }
  if (out.size() != count) {
    return absl::InternalError(absl::StrCat("a run's figures do not parse: ", line));
  }
  return out;
}

std::string Figures::Format() const {
  return FormatNumbers({requests, ok, p50_ms, p90_ms, p99_ms, slo, kv_reuse, emb_hit, stale,
                        kv_given_up, emb_given_up, reward, wall_s});
}

absl::StatusOr<Figures> Figures::Parse(const std::string& fields) {
  ASSIGN_OR_RETURN(const std::vector<double> v, ParseNumbers(fields, 13));
  return Figures{.requests = v[0],
                 .ok = v[1],
                 .p50_ms = v[2],
                 .p90_ms = v[3],
                 .p99_ms = v[4],
                 .slo = v[5],
                 .kv_reuse = v[6],
                 .emb_hit = v[7],
                 .stale = v[8],
                 .kv_given_up = v[9],
                 .emb_given_up = v[10],
                 .reward = v[11],
                 .wall_s = v[12]};
}

const std::vector<sim::Regime>& Regimes() {
  static const std::vector<sim::Regime> regimes = {sim::Regime::kSteady, sim::Regime::kTrend,
                                                   sim::Regime::kBurst};
  return regimes;
}

absl::StatusOr<std::vector<std::string>> RegimeTraces(const EvalOptions& o, const Profile& p,
                                                      Stamp& stamp) {
  std::vector<Task> tasks;
  for (sim::Regime regime : Regimes()) {
    for (uint64_t seed : o.seeds) {
      tasks.push_back(
          [&o, &p, regime, seed]() { return MakeTrace(o, p, {.regime = regime, .seed = seed}); });
    }
  }
  ASSIGN_OR_RETURN(std::vector<std::string> traces, RunParallel(tasks, o.jobs, o.work_dir));
  ASSIGN_OR_RETURN(const tools::SimSetup setup,
                   tools::PrepareSim(SimOptions(o, p, traces.front(), 0.5)));
  stamp.device = setup.twin.costs.device;
  return traces;
}

std::vector<double> StaticGrid(bool quick) {
  if (quick) return {0, 0.5, 0.8};
  std::vector<double> grid;
  for (int i = 0; i <= 10; ++i) grid.push_back(i * 0.1);
  return grid;
}

size_t BestByReward(const std::vector<Figures>& f) {
  size_t best = 0;
  for (size_t i = 1; i < f.size(); ++i) {
    if (f[i].reward > f[best].reward + 1e-9 ||
        (f[i].reward > f[best].reward - 1e-9 && f[i].p99_ms < f[best].p99_ms)) {
      best = i;
    }
  }
  return best;
}

absl::StatusOr<Figures> RunFigures(const tools::SimSetupOptions& options, double alpha) {
  ASSIGN_OR_RETURN(const tools::SimSetup setup, tools::PrepareSim(options));
  ASSIGN_OR_RETURN(const tools::SimRunResult r, tools::RunOnce(setup, alpha));
  return FiguresOf(setup, r);
}

Figures FiguresOf(const tools::SimSetup& setup, const tools::SimRunResult& r) {
  const loadgen::Summary& s = r.report.overall;
  const auto requests = static_cast<double>(s.requests);
  return Figures{.requests = requests,
                 .ok = static_cast<double>(s.ok),
                 .p50_ms = s.p50_ms,
                 .p90_ms = s.p90_ms,
                 .p99_ms = s.p99_ms,
                 .slo = s.slo_satisfaction,
                 .kv_reuse = s.kv_reuse,
                 .emb_hit = r.emb_hit_rate,
                 .stale = requests > 0 ? static_cast<double>(s.stale_kv_hits) / requests : 0,
                 .kv_given_up = r.kv_given_up,
                 .emb_given_up = r.emb_given_up,
                 .reward = tools::RunReward(s, setup.slo_ms),
                 .wall_s = r.stats.wall_seconds};
}

Task FiguresTask(const EvalOptions& options, const Stamp& stamp, const tools::SimSetupOptions& run,
                 double alpha) {
  return CachedRun(options, stamp, RunKey(run, alpha),
                   [run, alpha]() -> absl::StatusOr<std::string> {
                     ASSIGN_OR_RETURN(const Figures f, RunFigures(run, alpha));
                     return f.Format();
                   });
}

std::string RunKey(const tools::SimSetupOptions& o, double alpha) {
  auto content = [](const std::string& path) {
    absl::StatusOr<std::string> body = ReadFile(path);
    return body.ok() ? absl::StrFormat("%016x", NameHash(*body)) : std::string("missing");
  };
  const allocator::ControllerSpec& c = o.controller;
  return absl::StrFormat(
      "trace=%s node=%s costs=%s router=%s nodes=%d emb_sample=%d sketch=%d calibrate=%d "
      "controller=%s weights=%s seed=%d bounds=%.4f:%.4f deadband=%.4f slo=%.4f warmup=%.4f "
      "alpha=%.4f",
      fs::path(o.trace).filename().string(), content(o.node_config), content(o.costs), o.router,
      o.nodes, o.emb_sample, o.history_sketch, o.calibrate_costs, c.name,
      c.weights.empty() ? "-" : content(c.weights), c.seed, c.bounds.alpha_min, c.bounds.alpha_max,
      c.deadband, o.slo_ms, o.warmup_s, alpha);
}

absl::StatusOr<std::vector<std::string>> RunExperimentRuns(const EvalOptions& options,
                                                           size_t traces,
                                                           const std::vector<Task>& runs,
                                                           Stamp& stamp) {
  std::fprintf(stderr, "  %zu traces, %zu twin runs, %u at a time\n", traces, runs.size(),
               options.jobs);
  const auto start = std::chrono::steady_clock::now();
  absl::StatusOr<std::vector<std::string>> rows = RunParallel(runs, options.jobs, options.work_dir);
  stamp.wall_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return rows;
}

namespace {

// Whether results may be cached: the tree is clean and the binary was built from its commit.
bool Cacheable(const Stamp& stamp) {
  return stamp.commit != "unknown" && !absl::EndsWith(stamp.commit, "-dirty") &&
         stamp.binary == stamp.commit;
}

// A cached result: a file in `dir` named by the key's hash, its first line the whole key (a hash
// collision shows) and the result after it.
class KeyedFiles {
 public:
  explicit KeyedFiles(fs::path dir) : dir_(std::move(dir)) {}
  std::optional<std::string> Read(const std::string& key) const {
    absl::StatusOr<std::string> body = ReadFile(PathOf(key).string());
    if (!body.ok()) return std::nullopt;
    const size_t nl = body->find('\n');
    if (nl == std::string::npos || std::string_view(*body).substr(0, nl) != key) {
      return std::nullopt;
    }
    return body->substr(nl + 1);
  }
  // Best effort: a result that cannot be written is computed again next time.
  void Write(const std::string& key, const std::string& result) const {
    (void)WriteFileAtomically(PathOf(key), absl::StrCat(key, "\n", result));
  }

 private:
  fs::path PathOf(const std::string& key) const {
    return dir_ / absl::StrFormat("%016x.txt", NameHash(key));
  }
  fs::path dir_;
};

class FileSearchCache : public sim::SearchCache {
 public:
  explicit FileSearchCache(fs::path dir) : files_(std::move(dir)) {}
  std::optional<sim::WindowOracle> Find(const std::string& key) override {
    const std::optional<std::string> text = files_.Read(key);
    if (!text.has_value()) return std::nullopt;
    absl::StatusOr<sim::WindowOracle> w = sim::ParseWindowOracle(*text);
    return w.ok() ? std::optional<sim::WindowOracle>(*std::move(w)) : std::nullopt;
  }
  void Store(const std::string& key, const sim::WindowOracle& found) override {
    files_.Write(key, sim::FormatWindowOracle(found));
  }

 private:
  KeyedFiles files_;
};

}  // namespace

Task CachedRun(const EvalOptions& options, const Stamp& stamp, const std::string& key, Task run) {
  if (!Cacheable(stamp)) return run;
  const std::string full = absl::StrCat("commit=", stamp.commit, " ", key);
  const KeyedFiles files(fs::path(options.work_dir) / "runs");
  return [files, full, run]() -> absl::StatusOr<std::string> {
    if (std::optional<std::string> cached = files.Read(full)) return *std::move(cached);
    ASSIGN_OR_RETURN(const std::string out, run());
    files.Write(full, out);
    return out;
  };
}

std::pair<std::shared_ptr<sim::SearchCache>, std::string> SearchCacheFor(
    const EvalOptions& options, const Stamp& stamp, const tools::SimSetupOptions& run,
    double alpha) {
  if (!Cacheable(stamp)) return {nullptr, ""};
  tools::SimSetupOptions inputs = run;
  inputs.controller = {};
  return {std::make_shared<FileSearchCache>(fs::path(options.work_dir) / "searches"),
          absl::StrCat("commit=", stamp.commit, " ", RunKey(inputs, alpha))};
}

absl::StatusOr<std::vector<std::string>> RunParallel(const std::vector<Task>& tasks, uint32_t jobs,
                                                     const std::string& work_dir) {
  if (jobs == 0) return absl::InvalidArgumentError("--jobs: must be >= 1");
  const fs::path dir = fs::path(work_dir) / "tasks";
  std::error_code ec;
  fs::create_directories(dir, ec);
  const pid_t parent = getpid();  // the children name their files after it too
  auto file_of = [&](size_t i) {
    return (dir / absl::StrCat("task-", parent, "-", i, ".out")).string();
  };
  std::map<pid_t, size_t> running;
  std::vector<std::string> outputs(tasks.size());
  absl::Status first_error;
  size_t next = 0, done = 0;
  const bool progress = isatty(STDERR_FILENO) == 1;
  auto finish_one = [&]() {
    int status = 0;
    const pid_t pid = waitpid(-1, &status, 0);
    if (pid < 0) {  // no child left to wait for (SIGCHLD ignored?): the runs are lost
      if (first_error.ok()) first_error = absl::InternalError("waitpid failed: runs lost");
      done += running.size();
      running.clear();
      return;
    }
    auto it = running.find(pid);
    if (it == running.end()) return;
    const size_t i = it->second;
    running.erase(it);
    absl::StatusOr<std::string> body = ReadFile(file_of(i));
    fs::remove(file_of(i), ec);
    absl::Status st;
    if (!WIFEXITED(status)) {
      st = absl::InternalError(absl::StrCat("run ", i, " died (signal ", WTERMSIG(status), ")"));
    } else if (!body.ok()) {
      st = absl::InternalError(absl::StrCat("run ", i, " left no output"));
    } else if (WEXITSTATUS(status) != 0) {
      st = absl::InternalError(absl::StrCat("run ", i, ": ", *body));
    } else {
      outputs[i] = std::move(*body);
    }
    if (!st.ok() && first_error.ok()) first_error = st;
    ++done;
    if (progress) {
      std::fprintf(stderr, "\r  %zu/%zu done%s", done, tasks.size(),
                   done == tasks.size() ? "\n" : "");
    }
  };
  while (next < tasks.size() || !running.empty()) {
    if (next < tasks.size() && running.size() < jobs && first_error.ok()) {
      std::fflush(nullptr);  // a child must not flush the parent's buffered output again
      const pid_t pid = fork();
      if (pid < 0) {
        first_error = absl::InternalError("fork failed");
        continue;
      }
      if (pid == 0) {
        absl::StatusOr<std::string> out = tasks[next]();
        const bool ok = out.ok() && WriteFileAtomically(file_of(next), *out).ok();
        if (!out.ok()) (void)WriteFileAtomically(file_of(next), out.status().ToString());
        std::fflush(nullptr);
        _exit(ok ? 0 : 1);
      }
      running[pid] = next++;
      continue;
    }
    if (running.empty()) break;  // an error stopped new tasks and the last one finished
    finish_one();
  }
  if (!first_error.ok()) return first_error;
  return outputs;
}

absl::Status Plot(const std::string& script, const std::string& png, const std::string& work_dir) {
  if (RunCommand({"gnuplot", "--version"}) != 0) {
    return absl::FailedPreconditionError(
        "gnuplot is not installed (Debian: gnuplot-nox; scripts/install-deps.sh installs it)");
  }
  const fs::path gp = fs::path(work_dir) / "plots" / (fs::path(png).stem().string() + ".gp");
  RETURN_IF_ERROR(WriteFileAtomically(
      gp, absl::StrCat("set terminal pngcairo noenhanced size 1000,600 font ',11'\nset output '",
                       png, "'\n", script)));
  std::error_code ec;
  fs::create_directories(fs::path(png).parent_path(), ec);
  const std::string log = fs::path(gp).replace_extension(".log").string();
  if (const int rc = RunCommand({"gnuplot", gp.string()}, nullptr, log); rc != 0) {
    std::ifstream in(log);
    std::string err((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    if (err.size() > 600) err = "…" + err.substr(err.size() - 600);
    return absl::InternalError(
        absl::StrCat("gnuplot ", gp.string(), " failed (exit ", rc, "): ", err));
  }
  return absl::OkStatus();
}

absl::Status WriteOutput(const EvalOptions& options, const std::string& name,
                         const std::string& body) {
  return WriteFileAtomically(fs::path(options.out_dir) / name, body);
}

const std::vector<Experiment>& Experiments() {
  const std::vector<uint64_t> five_seeds = {101, 102, 103, 104, 105};
  static const std::vector<Experiment>* experiments = new std::vector<Experiment>{
      {.name = "e2e",
       .summary = "KV-Opt, the oracle and deployable static α and HLEM per regime and HSTU "
                  "depth (--layers; experiment 1)",
       .run = EndToEnd,
       .seeds = five_seeds},
      {.name = "alpha-sweep",
       .summary = "P99 against a static α per regime, long and short histories (experiment 2)",
       .run = AlphaSweep},
      {.name = "tracking",
       .summary = "the SmartAllocator's α against α*_t over time per regime (experiment 3)",
       .run = Tracking},
      {.name = "controllers",
       .summary = "every controller's gap to α*_t, P99, SLO satisfaction and decision time "
                  "(experiment 4)",
       .run = Controllers},
      {.name = "ablations",
       .summary = "KV-EMB-Opt → +SmartAllocator → +router; PPO-only → +adapter → +recovery "
                  "(experiment 5)",
       .run = Ablations},
      {.name = "routing",
       .summary = "KV-only, EMB-only, joint (calibrated, configured), least-loaded and "
                  "round-robin routing at one static α (experiment 6)",
       .run = Routing,
       .seeds = five_seeds},
      {.name = "scale",
       .summary = "weak scaling of throughput with the nodes (--sizes) and the α chosen against "
                  "hot-user ratio × cluster size (experiment 7)",
       .run = Scale},
      {.name = "sensitivity",
       .summary = "HLEM against the oracle static α with each cost coefficient at ×0.5 and ×2 "
                  "(--coefficients)",
       .run = Sensitivity},
  };
  return *experiments;
}

absl::Status WriteBarChartResults(const EvalOptions& options, const std::string& name,
                                  const std::string& csv, const std::string& md,
                                  const std::string& table, size_t bars, const std::string& title,
                                  const std::string& ylabel, bool from_zero) {
  const fs::path data = fs::path(options.work_dir) / "plots" / absl::StrCat(name, ".dat");
  RETURN_IF_ERROR(WriteFileAtomically(data, table));
  RETURN_IF_ERROR(WriteOutput(options, absl::StrCat(name, ".csv"), csv));
  RETURN_IF_ERROR(WriteOutput(options, absl::StrCat(name, ".md"), md));
  const std::string script = absl::StrFormat(
      "set title '%s'\nset ylabel '%s'\nset style data histograms\nset style histogram "
      "clustered gap 1\nset style fill solid 0.8 border -1\nset grid ytics\nset key outside "
      "right\nset xtics rotate by -30\n%splot for [i=2:%d] '%s' using i:xtic(1) title "
      "columnheader(i)\n",
      title, ylabel, from_zero ? "set yrange [0:*]\n" : "", bars + 1, data.string());
  return Plot(script, (fs::path(options.out_dir) / absl::StrCat(name, ".png")).string(),
              options.work_dir);
}

std::vector<uint64_t> SeedsFor(const Experiment& e, const EvalOptions& options) {
  if (!options.seeds.empty()) return options.seeds;
  if (options.quick) return {kDefaultSeed};
  return e.seeds;
}

absl::Status RunExperiment(const std::string& name, const EvalOptions& all_options) {
  ASSIGN_OR_RETURN(const Profile profile, FindProfile(all_options.profile, all_options.quick));
  std::vector<const Experiment*> chosen;
  std::vector<std::string> known;
  for (const Experiment& e : Experiments()) {
    known.push_back(e.name);
    if (name == "all" || e.name == name) chosen.push_back(&e);
  }
  if (chosen.empty()) {
    return absl::NotFoundError(
        absl::StrCat("no experiment '", name, "' (known: all, ", absl::StrJoin(known, ", "), ")"));
  }
  for (const Experiment* e : chosen) {
    EvalOptions options = all_options;
    options.seeds = SeedsFor(*e, all_options);
    Stamp stamp;
    stamp.commit = Git(options.repo, {"describe", "--always", "--dirty"});
    stamp.binary = BuildCommit();
    stamp.costs_commit = Git(options.repo, {"log", "-1", "--format=%h", "--", profile.costs});
    stamp.seeds = absl::StrJoin(options.seeds, ", ");
    stamp.profile_line = absl::StrFormat(
        "%s (%s; %d nodes, %.0f requests/s per node, %.0f s "
        "traces, the first %.0f s left out)",
        profile.name, profile.note, profile.nodes, profile.rate_per_node, profile.duration_s,
        profile.warmup_s);
    std::fprintf(stderr, "hlem eval %s: %s\n", e->name.c_str(), e->summary.c_str());
    const auto start = std::chrono::steady_clock::now();
    RETURN_IF_ERROR(e->run(options, profile, stamp));
    std::fprintf(stderr, "hlem eval %s: done in %.0f s; %s/%s.{csv,md,png}\n", e->name.c_str(),
                 std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(),
                 options.out_dir.c_str(), e->name.c_str());
  }
  return absl::OkStatus();
}

}  // namespace hlem::eval
