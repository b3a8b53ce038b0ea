#include "tests/testing/shard_cluster.h"

#include <signal.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "common/config.h"

namespace hlem::testing {

std::string ExecutableDir() {
  char buf[4096] = {};
  ssize_t n = readlink("/proc/self/exe", buf, sizeof(buf) - 1);
  if (n <= 0) return ".";
  return std::filesystem::path(std::string(buf, n)).parent_path().string();
}

std::string ShardCluster::log_path(size_t shard) const {
  return absl::StrCat(options_.work_dir, "/shard", shard, ".log");
}

absl::StatusOr<std::unique_ptr<ShardCluster>> ShardCluster::Start(
    const ShardClusterOptions& options) {
  auto cluster = std::make_unique<ShardCluster>();
  cluster->options_ = options;
  std::error_code ec;
  std::filesystem::create_directories(options.work_dir, ec);
  std::string config_path = options.work_dir + "/shards.yaml";
  {
    std::ofstream out(config_path);
    out << options.config_yaml;
  }
  auto node = ParseYaml(options.config_yaml);
  if (!node.ok()) return node.status();
  auto config = shard::ParseShardClusterConfig(*node);
  if (!config.ok()) return config.status();
  cluster->config_ = *config;
  const uint32_t n = config->map.num_shards;
  for (uint32_t s = 0; s < n; ++s) {
    std::string ports = absl::StrCat(options.work_dir, "/shard", s, ".ports");
    std::filesystem::remove(ports, ec);
    auto process = ChildProcess::Start({options.binary, "--config", config_path, "--shard-index",
                                        std::to_string(s), "--ports-file", ports},
                                       cluster->log_path(s));
    if (!process.ok()) return process.status();
    cluster->processes_.push_back(std::move(*process));
  }
  for (uint32_t s = 0; s < n; ++s) {
    std::string ports = absl::StrCat(options.work_dir, "/shard", s, ".ports");
    auto port = WaitForPort(ports, "grpc", options.start_timeout, &cluster->processes_[s]);
    if (!port.ok()) {
      return absl::Status(port.status().code(),
                          absl::StrCat("shard ", s, ": ", port.status().message(), " (log ",
                                       cluster->log_path(s), ")"));
    }
    cluster->addresses_.push_back(absl::StrCat("127.0.0.1:", *port));
    auto metrics = WaitForPort(ports, "metrics", absl::Seconds(1));
    cluster->metrics_ports_.push_back(metrics.ok() ? *metrics : 0);
  }
  cluster->config_.servers = cluster->addresses_;
  return cluster;
}

absl::Status ShardCluster::Restart(size_t shard) {
  if (shard >= processes_.size()) return absl::InvalidArgumentError("no such shard");
  processes_[shard].Signal(SIGKILL);
  if (absl::StatusOr<int> st = processes_[shard].Wait(absl::Seconds(10)); !st.ok()) {
    return st.status();
  }
  const std::string ports = absl::StrCat(options_.work_dir, "/shard", shard, ".ports");
  std::error_code ec;
  std::filesystem::remove(ports, ec);
  auto process = ChildProcess::Start(
      {options_.binary, "--config", options_.work_dir + "/shards.yaml", "--shard-index",
       std::to_string(shard), "--ports-file", ports, "--listen", addresses_[shard]},
      log_path(shard) + ".restart");
  if (!process.ok()) return process.status();
  processes_[shard] = std::move(*process);
  auto port = WaitForPort(ports, "grpc", options_.start_timeout, &processes_[shard]);
  if (!port.ok()) return port.status();
  auto metrics = WaitForPort(ports, "metrics", absl::Seconds(1));
  metrics_ports_[shard] = metrics.ok() ? *metrics : 0;
  return absl::OkStatus();
}

}  // namespace hlem::testing
