// hlem: HLEM's command-line tools (table files, shard reads, serving nodes, router, workload
// traces, load generator, local cluster; later sim, eval). Exit codes: 0 success, 1 the operation
// failed, 2 bad usage or input.
#include <cstdio>
#include <optional>
#include <string>

#include "absl/synchronization/mutex.h"
#include "common/build_info.h"
#include "common/cli.h"
#include "common/logging.h"
#include "tools/commands.h"

namespace hlem::tools {

int Fail(absl::string_view command, absl::string_view what, const absl::Status& st) {
  std::fprintf(stderr, "hlem %s: %s: %s\n", std::string(command).c_str(), std::string(what).c_str(),
               std::string(st.message()).c_str());
  return st.code() == absl::StatusCode::kInvalidArgument || st.code() == absl::StatusCode::kNotFound
             ? 2
             : 1;
}

}  // namespace hlem::tools

int main(int argc, char** argv) {
  CLI::App app{"HLEM command-line tools"};
  app.require_subcommand(1);
  app.set_version_flag("--version", std::string("hlem ") + hlem::BuildCommit());
  hlem::tools::Run run;
  hlem::tools::RegisterTableCommands(app, &run);
  hlem::tools::RegisterShardCommands(app, &run);
  hlem::tools::RegisterNodeCommands(app, &run);
  hlem::tools::RegisterRouterCommands(app, &run);
  hlem::tools::RegisterWorkloadCommands(app, &run);
  hlem::tools::RegisterLoadgenCommands(app, &run);
  hlem::tools::RegisterClusterCommands(app, &run);
  hlem::tools::RegisterSimCommands(app, &run);
  hlem::tools::RegisterTrainCommands(app, &run);
  hlem::tools::RegisterEvalCommands(app, &run);
  if (const std::optional<int> rc = hlem::ParseCommandLine(app, argc, argv)) return *rc;
  if (auto s = hlem::InitLogging({.level = "warn"}); !s.ok()) return 2;
  // Debian's Abseil checks every Mutex acquisition for lock-order cycles (a global graph lookup
  // per lock): 2 % of a paper-scale simulation. The tests keep the check; the tools do not.
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
  return run ? run() : 2;
}
