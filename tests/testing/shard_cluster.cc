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

std::string ShardCluster::ports_path(size_t shard) const {
  return absl::StrCat(options_.work_dir, "/shard", shard, ".ports");
}

absl::StatusOr<ChildProcess> ShardCluster::Launch(size_t shard, const std::string& listen,
                                                  const std::string& log) const {
  std::error_code ec;
  std::filesystem::remove(ports_path(shard), ec);  // a stale file would name the old port
  std::vector<std::string> argv = {
      options_.binary,       "--config",     config_path(),    "--shard-index",
      std::to_string(shard), "--ports-file", ports_path(shard)};
  if (!listen.empty()) argv.insert(argv.end(), {"--listen", listen});
  return ChildProcess::Start(argv, log);
}

absl::StatusOr<int> ShardCluster::WaitServing(size_t shard, const std::string& log) {
  auto port = WaitForPort(ports_path(shard), "grpc", options_.start_timeout, &processes_[shard]);
  if (!port.ok()) {
    return absl::Status(
        port.status().code(),
        absl::StrCat("shard ", shard, ": ", port.status().message(), " (log ", log, ")"));
  }
  auto metrics = WaitForPort(ports_path(shard), "metrics", absl::Seconds(1));
  metrics_ports_[shard] = metrics.ok() ? *metrics : 0;
  return *port;
}

absl::StatusOr<std::unique_ptr<ShardCluster>> ShardCluster::Start(
    const ShardClusterOptions& options) {
  auto cluster = std::make_unique<ShardCluster>();
  cluster->options_ = options;
  std::error_code ec;
  std::filesystem::create_directories(options.work_dir, ec);
  {
    std::ofstream out(cluster->config_path());
    out << options.config_yaml;
  }
  auto node = ParseYaml(options.config_yaml);
  if (!node.ok()) return node.status();
  auto config = shard::ParseShardClusterConfig(*node);
  if (!config.ok()) return config.status();
  cluster->config_ = *config;
  const uint32_t n = config->map.num_shards;
  for (uint32_t s = 0; s < n; ++s) {
    auto process = cluster->Launch(s, "", cluster->log_path(s));
    if (!process.ok()) return process.status();
    cluster->processes_.push_back(std::move(*process));
  }
  cluster->metrics_ports_.resize(n);
  for (uint32_t s = 0; s < n; ++s) {
    auto port = cluster->WaitServing(s, cluster->log_path(s));
    if (!port.ok()) return port.status();
    cluster->addresses_.push_back(absl::StrCat("127.0.0.1:", *port));
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
  const std::string log = log_path(shard) + ".restart";
  auto process = Launch(shard, addresses_[shard], log);
  if (!process.ok()) return process.status();
  processes_[shard] = std::move(*process);
  return WaitServing(shard, log).status();
}

}  // namespace hlem::testing
