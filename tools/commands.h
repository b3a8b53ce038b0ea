#pragma once
// Subcommands of the `hlem` CLI. Each Register* adds its subcommand to the app; the callback
// stored in *run is what main() invokes when that subcommand was chosen.

#include <CLI/CLI.hpp>
#include <functional>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace hlem::tools {

using Run = std::function<int()>;
void RegisterTableCommands(CLI::App& app, Run* run);
void RegisterShardCommands(CLI::App& app, Run* run);
void RegisterNodeCommands(CLI::App& app, Run* run);
void RegisterRouterCommands(CLI::App& app, Run* run);
void RegisterWorkloadCommands(CLI::App& app, Run* run);
void RegisterLoadgenCommands(CLI::App& app, Run* run);
void RegisterClusterCommands(CLI::App& app, Run* run);
void RegisterSimCommands(CLI::App& app, Run* run);
void RegisterTrainCommands(CLI::App& app, Run* run);
void RegisterEvalCommands(CLI::App& app, Run* run);

// Prints "hlem <command>: <what>: <message>" to stderr; returns the exit code: 2 for bad input
// (INVALID_ARGUMENT, NOT_FOUND), 1 when the operation failed.
int Fail(absl::string_view command, absl::string_view what, const absl::Status& st);

}  // namespace hlem::tools
