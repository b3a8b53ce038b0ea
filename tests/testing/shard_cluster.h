#pragma once
// A local embedding-shard cluster for tests, benchmarks and the main job: writes the cluster
// config, starts one embedding_shard process per shard on OS-chosen ports, waits until each serves.
// Destroying it kills what is still running.

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/process.h"
#include "embedding_shard/core/shard_config.h"

namespace hlem::testing {

struct ShardClusterOptions {
  std::string binary;       // path of embedding_shard
  std::string work_dir;     // config, ports files and logs go here
  std::string config_yaml;  // the cluster config (servers: is filled in by the cluster)
  absl::Duration start_timeout = absl::Seconds(120);
};

class ShardCluster {
 public:
  static absl::StatusOr<std::unique_ptr<ShardCluster>> Start(const ShardClusterOptions& options);

  const shard::ShardClusterConfig& config() const { return config_; }
  // The config with `servers` set to the running processes' addresses.
  const std::vector<std::string>& addresses() const { return addresses_; }
  std::vector<int> metrics_ports() const { return metrics_ports_; }
  ChildProcess& process(size_t shard) { return processes_[shard]; }
  std::string log_path(size_t shard) const;
  // Kills shard `shard` (SIGKILL) and starts it again on the same gRPC address, as a restarted pod
  // behind the same name; returns once it serves (its log: log_path(shard) + ".restart").
  absl::Status Restart(size_t shard);
  size_t size() const { return processes_.size(); }

 private:
  std::string config_path() const { return options_.work_dir + "/shards.yaml"; }
  std::string ports_path(size_t shard) const;
  // Starts shard `shard`'s process (on `listen` when not empty, else an OS-chosen port).
  absl::StatusOr<ChildProcess> Launch(size_t shard, const std::string& listen,
                                      const std::string& log) const;
  // Waits until shard `shard` serves; returns its gRPC port and records its metrics port. An
  // error names `log`, the process's log.
  absl::StatusOr<int> WaitServing(size_t shard, const std::string& log);

  ShardClusterOptions options_;
  shard::ShardClusterConfig config_;
  std::vector<ChildProcess> processes_;
  std::vector<std::string> addresses_;
  std::vector<int> metrics_ports_;
};

// The directory of the running executable (to find sibling build outputs).
std::string ExecutableDir();

}  // namespace hlem::testing
