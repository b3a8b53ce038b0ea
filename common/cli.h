#pragma once
// Command-line parsing for every HLEM binary: one exit status for bad input. CLI11's own errors
// (an unknown flag, a value out of range, flags that exclude each other) would exit with its codes
// (105–115); ours exit 2 like the binaries' own validation errors, so scripts can tell bad input
// (2) from a failure at run time (1).

#include <optional>

#include "CLI/CLI.hpp"

namespace hlem {

inline constexpr int kExitBadInput = 2;

// Parses argv into `app`. nullopt: go on. Otherwise the process should exit with the value: 0
// after --help (printed), kExitBadInput after a parse error (CLI11's message on stderr).
inline std::optional<int> ParseCommandLine(CLI::App& app, int argc, char** argv) {
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int printed = app.exit(e);  // prints help or the error, as CLI11_PARSE would
    return printed == static_cast<int>(CLI::ExitCodes::Success) ? 0 : kExitBadInput;
  }
  return std::nullopt;
}

}  // namespace hlem
