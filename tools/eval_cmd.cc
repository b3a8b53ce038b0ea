// `hlem eval <experiment|all>`: the evaluation's experiments in the digital twin
// (tools/eval/eval.h), each writing <out>/<experiment>.{csv,md,png}.

#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "tools/commands.h"
#include "tools/eval/eval.h"

namespace hlem::tools {

void RegisterEvalCommands(CLI::App& app, Run* run) {
  auto experiment = std::make_shared<std::string>();
  auto options = std::make_shared<eval::EvalOptions>();
  std::vector<std::string> names = {"all"};
  for (const eval::Experiment& e : eval::Experiments()) names.push_back(e.name);
  std::string help = "run an experiment of the evaluation in the digital twin:";
  for (const eval::Experiment& e : eval::Experiments()) {
    absl::StrAppend(&help, "\n  ", e.name, ": ", e.summary);
  }
  CLI::App* cmd = app.add_subcommand("eval", help);
  cmd->add_option("experiment", *experiment, absl::StrCat(absl::StrJoin(names, ", ")))
      ->required()
      ->check(CLI::IsMember(names));
  cmd->add_option("--profile", options->profile, "paper or local (simulated; tools/eval/eval.cc)")
      ->check(CLI::IsMember({"paper", "local"}));
  cmd->add_option("--out", options->out_dir, "results folder (docs/results)");
  cmd->add_option("--work", options->work_dir, "traces and scratch files, reused (out/eval)");
  // Without --seeds each experiment runs with its own (eval::SeedsFor); the help lists them.
  std::string own_seeds;
  for (const eval::Experiment& e : eval::Experiments()) {
    if (e.seeds == std::vector<uint64_t>{eval::kDefaultSeed}) continue;
    absl::StrAppend(&own_seeds, e.name, ": ", absl::StrJoin(e.seeds, ","), "; ");
  }
  cmd->add_option("--seeds", options->seeds,
                  absl::StrCat("workload seeds, one trace per regime each, for every experiment "
                               "chosen (when not given: ",
                               own_seeds, "the others and --quick: ", eval::kDefaultSeed, ")"))
      ->delimiter(',');
  cmd->add_option("--layers", options->layers, "HSTU depths of e2e (3,6)")
      ->delimiter(',')
      ->check(CLI::Range(1, 64));
  cmd->add_option("--controllers", options->controllers,
                  "controllers of the controllers experiment (all of the registry)")
      ->delimiter(',');
  cmd->add_option("--sizes", options->sizes,
                  "serving-node counts of the scale experiment (paper: 16,32,64,128,256)")
      ->delimiter(',')
      ->check(CLI::Range(1u, 4096u));
  cmd->add_option("--coefficients", options->coefficients,
                  "cost coefficients of the sensitivity experiment (all)")
      ->delimiter(',');
  cmd->add_option("--jobs", options->jobs, "twin runs at a time (processes)")
      ->check(CLI::Range(1u, 256u));
  cmd->add_flag("--quick", options->quick, "short traces and coarse grids (a smoke run)");
  cmd->add_option("--repo", options->repo,
                  "the checkout the configs are read from and the commit is stamped from (.)");
  cmd->callback([=] {
    *run = [=] {
      const absl::Status st = eval::RunExperiment(*experiment, *options);
      return st.ok() ? 0 : Fail("eval", *experiment, st);
    };
  });
}

}  // namespace hlem::tools
