#pragma once
// Subcommands of the `hlem` CLI. Each Register* adds its subcommand to the app; the callback
// stored in *run is what main() invokes when that subcommand was chosen.

#include <CLI/CLI.hpp>
#include <functional>

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

}  // namespace hlem::tools
