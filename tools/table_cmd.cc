// hlem table write|inspect: produce and check HLEM table files.
#include <cstdio>
#include <filesystem>
#include <string>

#include "absl/strings/str_cat.h"
#include "embedding_shard/core/shard_config.h"
#include "embedding_shard/core/table_file.h"
#include "tools/commands.h"

namespace hlem::tools {
namespace {

int WriteTables(const std::string& config_path, const std::string& dir) {
  auto config = shard::LoadShardClusterConfig(config_path);
  if (!config.ok()) {
    std::fprintf(stderr, "hlem table write: %s\n", std::string(config.status().message()).c_str());
    return 2;
  }
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  for (const shard::TableSpec& spec : config->tables) {
    std::string path = absl::StrCat(dir, "/", spec.name, ".hlemtbl");
    auto checksum = shard::WriteTableFile(path, spec, [&](uint64_t row, std::byte* out) {
      shard::GenerateRow(config->content.seed, spec, row, out);
    });
    if (!checksum.ok()) {
      std::fprintf(stderr, "hlem table write: %s\n", checksum.status().ToString().c_str());
      return 1;
    }
    std::printf("%s: table %u '%s' %llu x %u %s, %llu bytes, checksum %016llx\n", path.c_str(),
                spec.id, spec.name.c_str(), static_cast<unsigned long long>(spec.rows), spec.dim,
                std::string(shard::DtypeName(spec.dtype)).c_str(),
                static_cast<unsigned long long>(spec.total_bytes()),
                static_cast<unsigned long long>(*checksum));
  }
  return 0;
}

int Inspect(const std::string& path) {
  uint64_t rows = 0;
  auto header = shard::ReadTableFile(path, [&](uint64_t, const std::byte*) { ++rows; });
  if (!header.ok()) {
    std::fprintf(stderr, "hlem table inspect: %s\n", header.status().ToString().c_str());
    return 1;
  }
  std::printf("%s: table %u '%s' %llu x %u %s, data checksum %016llx verified (%llu rows)\n",
              path.c_str(), header->spec.id, header->spec.name.c_str(),
              static_cast<unsigned long long>(header->spec.rows), header->spec.dim,
              std::string(shard::DtypeName(header->spec.dtype)).c_str(),
              static_cast<unsigned long long>(header->data_checksum),
              static_cast<unsigned long long>(rows));
  return 0;
}

}  // namespace

void RegisterTableCommands(CLI::App& app, Run* run) {
  CLI::App* table = app.add_subcommand("table", "HLEM table files (docs/table_file.md)");
  table->require_subcommand(1);

  auto* write = table->add_subcommand(
      "write", "write every table of a cluster config, with its generated content, as files");
  auto config = std::make_shared<std::string>();
  auto dir = std::make_shared<std::string>();
  write->add_option("--config", *config, "shard cluster config YAML")->required();
  write->add_option("--dir", *dir, "output directory (created)")->required();
  write->callback([=] { *run = [=] { return WriteTables(*config, *dir); }; });

  auto* inspect = table->add_subcommand("inspect", "print a table file's header, verify its data");
  auto path = std::make_shared<std::string>();
  inspect->add_option("file", *path, "table file")->required();
  inspect->callback([=] { *run = [=] { return Inspect(*path); }; });
}

}  // namespace hlem::tools
