// `hlem train-ppo`: trains the allocator's PPO base policy offline in the digital twin (issue 7,
// ARCHITECTURE §3) and writes its actor, with the observation normaliser, as an hlem-mlp file
// the allocator runs frozen (`hlem sim run --controller ppo --weights`). Each iteration replays
// fresh generated traces of every regime (sim/twin/train.h) through a twin of the local cluster
// with one exploring controller per node until it has --steps decisions, then makes one PPO
// update (allocator_service/core/ppo.h). Single-threaded and deterministic: the same flags on the
// same machine write the same file byte for byte. The file's comment lines record the command,
// the options and the training's last figures.

#include <chrono>
#include <cstdio>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "allocator_service/core/ppo.h"
#include "common/rng.h"
#include "router/core/calibration.h"
#include "sim/twin/train.h"
#include "sim/workload/workload.h"
#include "tools/commands.h"
#include "tools/twin_setup.h"

namespace hlem::tools {
namespace {

struct TrainFlags {
  TwinFiles files;
  std::string workload = "deploy/local/workload.yaml", out, log_csv, hidden = "64,64";
  int iterations = 40;
  uint32_t steps = 1024;
  double episode_s = 180;
  double rate = 0;               // requests/s of the whole twin; 0: the workload's
  double p99_weight = 0;         // sim::TrainingReward's
  bool calibrate_costs = false;  // the router's online cost calibration, as `hlem sim` runs it
  allocator::PpoOptions ppo;
};

int TrainFail(absl::string_view what, const absl::Status& st) {
  return tools::Fail("train-ppo", what, st);
}

// The command that reproduces a run, every option spelled out.
std::string CommandLine(const TrainFlags& f) {
  const allocator::PpoOptions& p = f.ppo;
  return absl::StrFormat(
      "hlem train-ppo --workload %s --rate %g --node-config %s --costs %s --router %s --nodes %d "
      "--emb-sample %d%s%s --p99-weight %g --iterations %d --steps %d --episode-s %g --hidden %s "
      "--gamma %g "
      "--lambda %g --clip %g --lr %g --entropy %g --value-coef %g --max-grad-norm %g --epochs %d "
      "--minibatch %d --seed %d --out %s",
      f.workload, f.rate, f.files.node_config, f.files.costs, f.files.router, f.files.nodes,
      f.files.emb_sample, f.files.history_sketch ? " --history-sketch" : "",
      f.calibrate_costs ? " --calibrate-costs" : "", f.p99_weight, f.iterations, f.steps,
      f.episode_s, f.hidden, p.gamma, p.lambda, p.clip, p.lr, p.entropy, p.value_coef,
      p.max_grad_norm, p.epochs, p.minibatch, p.seed, f.out.empty() ? "-" : f.out);
}

int Train(TrainFlags f) {
  f.ppo.hidden.clear();
  for (absl::string_view w : absl::StrSplit(f.hidden, ',')) {
    uint32_t v = 0;
    if (!absl::SimpleAtoi(w, &v) || v == 0 || v > 1024) {
      return TrainFail("--hidden",
                       absl::InvalidArgumentError(
                           "expected comma-separated layer widths in 1..1024, e.g. 64,64"));
    }
    f.ppo.hidden.push_back(v);
  }
  absl::StatusOr<TwinSetup> setup = LoadTwinSetup(f.files);
  if (!setup.ok()) return TrainFail("setup", setup.status());
  if (f.calibrate_costs) setup->twin.calibration = router::CalibrationOptions{};
  std::ifstream in(f.workload);
  if (!in)
    return TrainFail("--workload", absl::NotFoundError(absl::StrCat("cannot read ", f.workload)));
  const std::string yaml((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  absl::StatusOr<sim::WorkloadConfig> base = sim::ParseWorkloadConfig(yaml);
  if (!base.ok()) return TrainFail("--workload", base.status());
  if (f.rate > 0) base->rate = f.rate;
  absl::StatusOr<std::unique_ptr<allocator::PpoAgent>> made =
      allocator::PpoAgent::Create(allocator::kNumFeatures, allocator::kActions.size(), f.ppo);
  if (!made.ok()) return TrainFail("options", made.status());
  allocator::PpoAgent& agent = **made;
  const sim::TrainingSpread spread{.length = absl::Seconds(f.episode_s)};
  const sim::ControlOptions control{.window = setup->window};

  std::printf("%s\n", CommandLine(f).c_str());
  std::printf("ppo: %s; %zu parameters (actor and critic)\n", f.ppo.Describe().c_str(),
              agent.parameters());
  std::printf("%4s %6s %6s %8s %8s %8s %7s %7s %6s %6s %7s\n", "iter", "traces", "steps", "reward",
              "pi_loss", "v_loss", "entropy", "kl", "clip", "ev", "wall_s");
  std::string log =
      "iteration,traces,steps,mean_reward,policy_loss,value_loss,entropy,approx_kl,"
      "clip_fraction,explained_var,wall_s\n";
  const auto t0 = std::chrono::steady_clock::now();
  uint64_t trace = 0;
  allocator::PpoUpdateStats last;
  for (int it = 0; it < f.iterations; ++it) {
    std::vector<allocator::PpoEpisode> batch;
    size_t steps = 0;
    const uint64_t first = trace;
    while (steps < f.steps) {
      double alpha = 0;
      const sim::WorkloadConfig w = sim::TrainingWorkload(*base, spread, f.ppo.seed, trace, &alpha);
      absl::StatusOr<std::vector<allocator::PpoEpisode>> episodes =
          sim::CollectEpisodes(setup->twin, w, alpha, agent, KeyedHash(f.ppo.seed, trace, 0x616374),
                               control, {}, f.p99_weight);
      if (!episodes.ok()) return TrainFail(absl::StrCat("trace ", trace), episodes.status());
      ++trace;
      for (allocator::PpoEpisode& e : *episodes) {
        steps += e.steps.size();
        batch.push_back(std::move(e));
      }
      if (steps == 0 && trace - first > 3) {
        return TrainFail(
            "--episode-s",
            absl::InvalidArgumentError("three traces gave no decisions: episodes need at least "
                                       "two decision windows"));
      }
    }
    absl::StatusOr<allocator::PpoUpdateStats> stats = agent.Update(batch);
    if (!stats.ok()) return TrainFail("update", stats.status());
    last = *stats;
    const double wall =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::printf("%4d %6llu %6zu %8.4f %8.4f %8.4f %7.4f %7.4f %6.3f %6.3f %7.1f\n", it + 1,
                static_cast<unsigned long long>(trace - first), stats->steps, stats->mean_reward,
                stats->policy_loss, stats->value_loss, stats->entropy, stats->approx_kl,
                stats->clip_fraction, stats->explained_var, wall);
    std::fflush(stdout);
    absl::StrAppendFormat(&log, "%d,%d,%d,%.6f,%.6f,%.6f,%.6f,%.6f,%.6f,%.6f,%.1f\n", it + 1,
                          trace - first, stats->steps, stats->mean_reward, stats->policy_loss,
                          stats->value_loss, stats->entropy, stats->approx_kl, stats->clip_fraction,
                          stats->explained_var, wall);
  }
  absl::StatusOr<allocator::Mlp> actor = agent.ExportActor();
  if (!actor.ok()) return TrainFail("export", actor.status());
  const std::string body = absl::StrCat(
      "# The allocator's PPO base policy (the actor; ARCHITECTURE §3, issue 7), trained in the\n"
      "# digital twin. Reproduce it (same machine, same commit: byte for byte) with\n#   ",
      CommandLine(f), "\n# ppo: ", f.ppo.Describe(),
      absl::StrFormat("\n# trained on %d generated traces of %g s (%d iterations of >= %d "
                      "decisions); last iteration: mean reward %.4f, entropy %.3f\n",
                      trace, f.episode_s, f.iterations, f.steps, last.mean_reward, last.entropy),
      actor->Serialize());
  for (const auto& [path, text] : {std::pair{f.out, body}, std::pair{f.log_csv, log}}) {
    if (path.empty()) continue;
    std::ofstream out(path);
    out << text;
    if (!out) return TrainFail("output", absl::InternalError(absl::StrCat("cannot write ", path)));
  }
  std::printf("wrote %s (%zu actor parameters)\n", f.out.empty() ? "nothing" : f.out.c_str(),
              actor->parameters());
  return 0;
}

}  // namespace

void RegisterTrainCommands(CLI::App& app, Run* run) {
  auto f = std::make_shared<TrainFlags>();
  CLI::App* cmd = app.add_subcommand(
      "train-ppo", "train the allocator's PPO base policy in the digital twin (writes --out)");
  cmd->add_option("--workload", f->workload,
                  "base workload config: each training trace varies its regime, hot ratio and "
                  "rate (deploy/local/workload.yaml)");
  cmd->add_option("--rate", f->rate,
                  "base arrival rate of the whole twin, requests/s (0: the workload's)")
      ->check(CLI::Range(0.0, 1e7));
  cmd->add_option("--node-config", f->files.node_config, "the nodes' config");
  cmd->add_option("--costs", f->files.costs, "cost model file (sim/costs/*.yaml)");
  cmd->add_option("--router", f->files.router, "routing policy");
  cmd->add_option("--nodes", f->files.nodes, "serving nodes per twin")->check(CLI::Range(1u, 256u));
  cmd->add_option("--emb-sample", f->files.emb_sample, "EMB cache tracks 1 in N rows")
      ->check(CLI::Range(1u, 1u << 20));
  cmd->add_flag("--history-sketch", f->files.history_sketch,
                "sketch first visits' histories (needs --emb-sample 2 or more; "
                "docs/simulator.md)");
  cmd->add_flag("--calibrate-costs", f->calibrate_costs,
                "the router calibrates its weights online, as `hlem sim` and `hlem eval` run it "
                "(off by default: the committed ppo-local policy was trained without)");
  cmd->add_option("--p99-weight", f->p99_weight,
                  "reward = ARCHITECTURE §3's - this x P99/SLO: breaks the ties of a saturated "
                  "reward toward the lower P99 (0: §3's alone; docs/allocator.md)")
      ->check(CLI::Range(0.0, 10.0));
  cmd->add_option("--iterations", f->iterations, "PPO updates")->check(CLI::Range(1, 100000));
  cmd->add_option("--steps", f->steps, "decisions (node windows) collected per update")
      ->check(CLI::Range(1u, 1u << 24));
  cmd->add_option("--episode-s", f->episode_s, "length of each generated trace, seconds")
      ->check(CLI::Range(10.0, 86400.0));
  cmd->add_option("--hidden", f->hidden, "hidden layer widths, actor and critic (e.g. 64,64)");
  cmd->add_option("--gamma", f->ppo.gamma, "discount per window")->check(CLI::Range(0.0, 1.0));
  cmd->add_option("--lambda", f->ppo.lambda, "GAE lambda")->check(CLI::Range(0.0, 1.0));
  cmd->add_option("--clip", f->ppo.clip, "surrogate ratio clip")->check(CLI::Range(0.001, 1.0));
  cmd->add_option("--lr", f->ppo.lr, "Adam learning rate")->check(CLI::Range(1e-8, 1.0));
  cmd->add_option("--entropy", f->ppo.entropy, "entropy bonus")->check(CLI::Range(0.0, 1.0));
  cmd->add_option("--value-coef", f->ppo.value_coef, "critic loss weight")
      ->check(CLI::Range(0.0, 100.0));
  cmd->add_option("--max-grad-norm", f->ppo.max_grad_norm, "gradient norm clip per network")
      ->check(CLI::Range(1e-6, 1e6));
  cmd->add_option("--epochs", f->ppo.epochs, "passes over each batch")->check(CLI::Range(1, 1000));
  cmd->add_option("--minibatch", f->ppo.minibatch, "samples per Adam step")
      ->check(CLI::Range(1u, 1u << 20));
  cmd->add_option("--seed", f->ppo.seed, "weights, shuffles, traces and exploration");
  cmd->add_option("--out", f->out, "write the actor (hlem-mlp) here");
  cmd->add_option("--log-csv", f->log_csv, "write one row per iteration here");
  cmd->callback([=] { *run = [=] { return Train(*f); }; });
}

}  // namespace hlem::tools
