#include "tests/testing/node_process.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/grpc_server.h"

namespace hlem::testing {

std::string NodeProcess::address() const { return absl::StrCat("127.0.0.1:", port); }

absl::StatusOr<NodeProcess> StartNode(const std::string& binary, const std::string& dir,
                                      const std::string& config, const std::string& name,
                                      const std::vector<std::string>& shard_servers,
                                      const std::string& listen) {
  const std::string ports = absl::StrCat(dir, "/", name, ".ports");
  auto process = ChildProcess::Start(
      {binary, "--config", config, "--node-id", name, "--ports-file", ports, "--shard-servers",
       absl::StrJoin(shard_servers, ","), "--listen", listen},
      absl::StrCat(dir, "/", name, ".log"));
  if (!process.ok()) return process.status();
  NodeProcess n{std::move(*process)};
  auto port = WaitForPort(ports, "grpc", absl::Seconds(120), &n.process);
  if (!port.ok()) return port.status();
  auto admin = WaitForPort(ports, "admin", absl::Seconds(5), &n.process);
  if (!admin.ok()) return admin.status();
  auto metrics = WaitForPort(ports, "metrics", absl::Seconds(5), &n.process);
  if (!metrics.ok()) return metrics.status();
  n.port = *port;
  n.admin_port = *admin;
  n.metrics_port = *metrics;
  n.stub = hlem::v1::ServingNode::NewStub(MakeChannel(n.address()));
  n.admin =
      hlem::v1::ServingNodeAdmin::NewStub(MakeChannel(absl::StrCat("127.0.0.1:", n.admin_port)));
  return n;
}

int UnusedPort() {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return 0;
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(addr);
  int port = 0;
  if (bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0 &&
      getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0) {
    port = ntohs(addr.sin_port);
  }
  close(fd);
  return port;
}

std::string ScrapeMetrics(int port) {
  const std::string cmd = absl::StrCat("exec 3<>/dev/tcp/127.0.0.1/", port,
                                       "; printf 'GET /metrics HTTP/1.0\\r\\n\\r\\n' >&3; cat <&3");
  std::string body;
  FILE* p = popen(absl::StrCat("bash -c \"", cmd, "\"").c_str(), "r");
  if (p == nullptr) return body;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof(buf), p)) > 0) body.append(buf, n);
  pclose(p);
  return body;
}

absl::StatusOr<std::unique_ptr<ShardCluster>> StartShardsForNodes(const std::string& shard_binary,
                                                                  const std::string& dir,
                                                                  const std::string& shards_yaml,
                                                                  const std::string& node_yaml) {
  ShardClusterOptions options;
  options.binary = shard_binary;
  options.work_dir = dir;
  options.config_yaml = shards_yaml;
  auto cluster = ShardCluster::Start(options);
  if (!cluster.ok()) return cluster.status();
  std::ofstream(dir + "/node.yaml") << node_yaml;
  return cluster;
}

}  // namespace hlem::testing
