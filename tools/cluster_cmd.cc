// `hlem cluster up|down|status`: the `local` profile on loopback (ARCHITECTURE §9; issue 6): the
// embedding shards of a shard config, N serving nodes of a node config and the router, on
// OS-chosen ports, each a daemon in its own session with its log in the run directory.
//
//   up      starts shards, then nodes (with the shards' addresses), then the router (with the
//           nodes'), then, with --allocator, the allocator (with the nodes'), waiting for each
//           one's ports file; on any failure stops everything it started and prints the failing
//           process's log tail. Writes <run-dir>/cluster.state, a line per process as soon as
//           it is started, so `down` also stops a cluster whose `up` was interrupted (Ctrl-C).
//   status  each process: alive, and serving (gRPC health check); exit 1 unless all are.
//   down    SIGTERM allocator, router, nodes, shards in that order (each drains), SIGKILL after
//           the timeout; only processes whose command line is still the one started (a reused
//           pid is left alone); removes the state file.
//
// cluster.state: one line per process, "<role> <name> <pid> <grpc port> <binary> <log>".

#include <signal.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "allocator_service/core/registry.h"
#include "common/grpc_health_probe.h"
#include "common/grpc_security.h"
#include "common/process.h"
#include "embedding_shard/core/shard_config.h"
#include "tools/commands.h"

namespace hlem::tools {
namespace {

struct ClusterFlags {
  std::string shards_config = "deploy/local/shards.yaml";
  std::string node_config = "deploy/local/node.yaml";
  std::string run_dir = "out/cluster";
  std::string bin_dir;  // default: the build tree this hlem binary belongs to
  uint32_t nodes = 4;
  double timeout_s = 180;
  double down_timeout_s = 30;
  std::vector<std::string> router_args;
  std::string allocator = "none";  // or the allocator's --controller
  std::vector<std::string> allocator_args;
  std::string security_dir;  // "" = plaintext, no tokens
};

// --security-dir: mutual TLS on every gRPC channel and the admin and frontend tokens, from the
// files scripts/make-certs.sh writes (Kubernetes TLS Secret names).
struct SecurityFiles {
  std::string ca, cert, key, admin_token, frontend_token;
  std::vector<std::string> TlsArgs() const {
    return {"--tls", "mtls", "--tls-ca", ca, "--tls-cert", cert, "--tls-key", key};
  }
  TlsConfig Tls() const {
    return {.mode = TlsMode::kMutual, .cert_file = cert, .key_file = key, .ca_file = ca};
  }
};

absl::StatusOr<SecurityFiles> SecurityIn(const std::string& dir) {
  std::error_code ec;
  const std::string abs = std::filesystem::absolute(dir, ec).string();
  SecurityFiles files{.ca = abs + "/ca.crt",
                      .cert = abs + "/tls.crt",
                      .key = abs + "/tls.key",
                      .admin_token = abs + "/admin.token",
                      .frontend_token = abs + "/frontend.token"};
  if (auto s = files.Tls().Validate(); !s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(dir, ": ", s.message()));
  }
  for (const std::string& token : {files.admin_token, files.frontend_token}) {
    if (auto t = TokenFile::Open(token); !t.ok()) return t.status();
  }
  return files;
}

// The security dir a cluster was started with ("" when none).
std::string SecurityPath(const std::string& run_dir) { return run_dir + "/security.dir"; }

struct Member {
  std::string role, name;
  pid_t pid = 0;
  int port = 0;
  std::string binary, log;
  int metrics_port = 0;  // 0: none
};

// Replaces `path` whole (a reader never sees half a file): written to path.tmp, then renamed.
bool ReplaceFile(const std::string& path, const std::string& body) {
  const std::string tmp = path + ".tmp";
  std::ofstream out(tmp);
  out << body;
  out.close();
  return out.good() && std::rename(tmp.c_str(), path.c_str()) == 0;
}

// Prometheus file-based service discovery (deploy/observability/prometheus/prometheus-local.yml
// reads it): every process's /metrics with the labels the Kubernetes scrape config gives its pods.
bool WritePrometheusTargets(const std::string& path, const std::vector<Member>& members) {
  std::vector<std::string> groups;
  for (const Member& m : members) {
    if (m.metrics_port == 0) continue;
    const std::string component = m.role == "shard"  ? "embedding-shard"
                                  : m.role == "node" ? "serving-node"
                                                     : m.role;
    groups.push_back(absl::StrCat("  {\"targets\": [\"127.0.0.1:", m.metrics_port,
                                  "\"], \"labels\": {\"component\": \"", component,
                                  "\", \"pod\": \"", m.name, "\"}}"));
  }
  return ReplaceFile(path, absl::StrCat("[\n", absl::StrJoin(groups, ",\n"), "\n]\n"));
}

std::string StatePath(const std::string& run_dir) { return run_dir + "/cluster.state"; }

// The build tree of this binary: <build>/tools/hlem -> <build>.
std::string DefaultBinDir() {
  std::error_code ec;
  const std::filesystem::path self = std::filesystem::read_symlink("/proc/self/exe", ec);
  if (ec) return "build";
  return self.parent_path().parent_path().string();
}

// The first word of /proc/pid/cmdline ("" when the process is gone).
std::string CommandOf(pid_t pid) {
  std::ifstream in(absl::StrCat("/proc/", pid, "/cmdline"));
  std::string argv0;
  std::getline(in, argv0, '\0');
  return argv0;
}

bool Alive(const Member& m) { return m.pid > 0 && CommandOf(m.pid) == m.binary; }

absl::StatusOr<std::vector<Member>> ReadState(const std::string& run_dir) {
  std::ifstream in(StatePath(run_dir));
  if (!in) {
    return absl::NotFoundError(absl::StrCat("no cluster in ", run_dir, " (no cluster.state)"));
  }
  std::vector<Member> out;
  std::string line;
  while (std::getline(in, line)) {
    std::istringstream s(line);
    Member m;
    if (s >> m.role >> m.name >> m.pid >> m.port >> m.binary >> m.log) out.push_back(m);
  }
  return out;
}

std::string Tail(const std::string& path, size_t lines) {
  std::ifstream in(path);
  std::vector<std::string> all;
  std::string line;
  while (std::getline(in, line)) all.push_back(line);
  const size_t from = all.size() > lines ? all.size() - lines : 0;
  std::string out;
  for (size_t i = from; i < all.size(); ++i) absl::StrAppend(&out, "    ", all[i], "\n");
  return out;
}

int Up(const ClusterFlags& f) {
  std::filesystem::create_directories(f.run_dir);
  if (auto state = ReadState(f.run_dir); state.ok()) {
    for (const Member& m : *state) {
      if (Alive(m)) {
        std::fprintf(stderr,
                     "hlem cluster up: a cluster is already up in %s (%s pid %d); run `hlem "
                     "cluster down --run-dir %s` first\n",
                     f.run_dir.c_str(), m.name.c_str(), m.pid, f.run_dir.c_str());
        return 1;
      }
    }
    std::filesystem::remove(StatePath(f.run_dir));  // stale
  }
  auto shards = shard::LoadShardClusterConfig(f.shards_config);
  if (!shards.ok()) {
    std::fprintf(stderr, "hlem cluster up: --shards-config: %s\n",
                 std::string(shards.status().message()).c_str());
    return 2;
  }
  if (f.nodes == 0) {
    std::fprintf(stderr, "hlem cluster up: --nodes: must be >= 1\n");
    return 2;
  }
  std::optional<SecurityFiles> security;
  if (!f.security_dir.empty()) {
    auto files = SecurityIn(f.security_dir);
    if (!files.ok()) {
      std::fprintf(stderr, "hlem cluster up: --security-dir: %s\n",
                   std::string(files.status().message()).c_str());
      return 2;
    }
    security = *files;
  }
  const std::string bin = f.bin_dir.empty() ? DefaultBinDir() : f.bin_dir;
  const std::string shard_bin = bin + "/embedding_shard/embedding_shard";
  const std::string node_bin = bin + "/serving_node/serving_node";
  const std::string router_bin = bin + "/router/router";
  const std::string allocator_bin = bin + "/allocator_service/allocator";
  for (const std::string& b : {shard_bin, node_bin, router_bin, allocator_bin}) {
    if ((b != allocator_bin || f.allocator != "none") && access(b.c_str(), X_OK) != 0) {
      std::fprintf(stderr, "hlem cluster up: %s is missing (build it, or pass --bin-dir)\n",
                   b.c_str());
      return 2;
    }
  }
  const absl::Duration timeout = absl::Seconds(f.timeout_s);
  std::vector<ChildProcess> started;
  std::vector<Member> members;
  // cluster.state lists every process from the moment it is started (port 0 until it serves), so
  // `cluster down` stops them also when this command is interrupted half way (Ctrl-C: the
  // children run in their own sessions and do not see it).
  auto write_state = [&]() -> bool {
    std::string body;
    for (const Member& m : members) {
      absl::StrAppend(&body, m.role, " ", m.name, " ", m.pid, " ", m.port, " ", m.binary, " ",
                      m.log, "\n");
    }
    return ReplaceFile(StatePath(f.run_dir), body);
  };
  auto stop_all = [&] {
    for (auto it = started.rbegin(); it != started.rend(); ++it) it->Stop(absl::Seconds(10));
    std::filesystem::remove(StatePath(f.run_dir));
  };
  // Starts one process and waits for its serving port; false (after stopping everything started)
  // on failure.
  auto start = [&](const std::string& role, const std::string& name, const std::string& binary,
                   std::vector<std::string> args) -> bool {
    const std::string ports = absl::StrCat(f.run_dir, "/", name, ".ports");
    const std::string log = absl::StrCat(f.run_dir, "/", name, ".log");
    std::filesystem::remove(ports);
    args.insert(args.begin(), binary);
    args.insert(args.end(), {"--ports-file", ports});
    if (security) {
      const std::vector<std::string> tls = security->TlsArgs();
      args.insert(args.end(), tls.begin(), tls.end());
      if (role != "shard") args.insert(args.end(), {"--admin-token-file", security->admin_token});
      if (role == "router") {
        args.insert(args.end(), {"--frontend-token-file", security->frontend_token});
      }
    }
    auto child = ChildProcess::Start(args, log, {.die_with_parent = false, .new_session = true});
    absl::StatusOr<int> port = child.ok() ? absl::StatusOr<int>(absl::UnknownError(""))
                                          : absl::StatusOr<int>(child.status());
    if (child.ok()) {
      started.push_back(std::move(*child));
      members.push_back({role, name, started.back().pid(), 0, binary, log});
      port = write_state() ? WaitForPort(ports, "grpc", timeout, &started.back())
                           : absl::StatusOr<int>(absl::UnavailableError(
                                 absl::StrCat("cannot write ", StatePath(f.run_dir))));
    }
    if (!port.ok()) {
      std::fprintf(stderr, "hlem cluster up: %s did not start: %s\n  %s:\n%s", name.c_str(),
                   std::string(port.status().message()).c_str(), log.c_str(),
                   Tail(log, 15).c_str());
      stop_all();
      return false;
    }
    members.back().port = *port;
    // Written with the grpc port: present now. 0 when the process serves no metrics.
    members.back().metrics_port = WaitForPort(ports, "metrics", absl::Seconds(1)).value_or(0);
    std::printf("  %-7s %-8s 127.0.0.1:%-6d pid %-7d log %s\n", role.c_str(), name.c_str(), *port,
                started.back().pid(), log.c_str());
    return true;
  };
  const absl::Time t0 = absl::Now();
  std::printf("starting the local cluster in %s (binaries from %s)\n", f.run_dir.c_str(),
              bin.c_str());
  std::vector<std::string> shard_addresses, node_addresses;
  for (uint32_t i = 0; i < shards->map.num_shards; ++i) {
    if (!start("shard", absl::StrCat("shard", i), shard_bin,
               {"--config", f.shards_config, "--shard-index", std::to_string(i)})) {
      return 1;
    }
    shard_addresses.push_back(absl::StrCat("127.0.0.1:", members.back().port));
  }
  for (uint32_t i = 0; i < f.nodes; ++i) {
    if (!start("node", absl::StrCat("node-", i), node_bin,
               {"--config", f.node_config, "--node-id", absl::StrCat("node-", i), "--shard-servers",
                absl::StrJoin(shard_addresses, ",")})) {
      return 1;
    }
    node_addresses.push_back(absl::StrCat("127.0.0.1:", members.back().port));
  }
  std::vector<std::string> router_args = {"--nodes", absl::StrJoin(node_addresses, ",")};
  router_args.insert(router_args.end(), f.router_args.begin(), f.router_args.end());
  if (!start("router", "router", router_bin, router_args)) return 1;
  const int router_port = members.back().port;
  if (f.allocator != "none") {
    std::vector<std::string> args = {"--nodes", absl::StrJoin(node_addresses, ","), "--controller",
                                     f.allocator};
    args.insert(args.end(), f.allocator_args.begin(), f.allocator_args.end());
    if (!start("allocator", "allocator", allocator_bin, args)) return 1;
  }

  std::filesystem::remove(SecurityPath(f.run_dir));
  if (security) {  // absolute: `cluster status` may run from another directory
    std::error_code ec;
    std::ofstream(SecurityPath(f.run_dir))
        << std::filesystem::absolute(f.security_dir, ec).string() << "\n";
  }
  if (!write_state()) {
    std::fprintf(stderr, "hlem cluster up: cannot write %s\n", StatePath(f.run_dir).c_str());
    stop_all();
    return 1;
  }
  const std::string targets = f.run_dir + "/prometheus-targets.json";
  if (!WritePrometheusTargets(targets, members)) {
    std::fprintf(stderr, "hlem cluster up: cannot write %s\n", targets.c_str());
    stop_all();
    return 1;
  }
  for (ChildProcess& c : started) c.Detach();
  std::printf("cluster up in %.1f s: router 127.0.0.1:%d (hlem cluster status|down --run-dir %s)\n",
              absl::ToDoubleSeconds(absl::Now() - t0), router_port, f.run_dir.c_str());
  return 0;
}

int Status(const ClusterFlags& f) {
  auto state = ReadState(f.run_dir);
  if (!state.ok()) {
    std::fprintf(stderr, "hlem cluster status: %s\n",
                 std::string(state.status().message()).c_str());
    return 1;
  }
  std::string security_dir;
  std::getline(std::ifstream(SecurityPath(f.run_dir)), security_dir);
  ChannelOptions channel;
  if (!security_dir.empty()) {
    auto files = SecurityIn(security_dir);
    if (!files.ok()) {
      std::fprintf(stderr, "hlem cluster status: %s\n",
                   std::string(files.status().message()).c_str());
      return 1;
    }
    channel.tls = files->Tls();
  }
  GrpcHealthProbe probe(channel);
  bool all = true;
  std::printf("%-7s %-8s %-16s %-8s %s\n", "role", "name", "address", "pid", "state");
  for (const Member& m : *state) {
    const std::string address = absl::StrCat("127.0.0.1:", m.port);
    std::string what = "serving";
    if (!Alive(m)) {
      what = "not running";
    } else if (absl::Status h = probe.Check(address, absl::Seconds(2)); !h.ok()) {
      what = absl::StrCat("not serving: ", h.message());
    }
    all = all && what == "serving";
    std::printf("%-7s %-8s %-16s %-8d %s\n", m.role.c_str(), m.name.c_str(), address.c_str(), m.pid,
                what.c_str());
  }
  return all ? 0 : 1;
}

int Down(const ClusterFlags& f) {
  auto state = ReadState(f.run_dir);
  if (!state.ok()) {
    std::fprintf(stderr, "hlem cluster down: %s\n", std::string(state.status().message()).c_str());
    return 1;
  }
  int stopped = 0, killed = 0;
  // Router first (stops new requests), then the nodes (drain), then the shards.
  for (const std::string role : {"allocator", "router", "node", "shard"}) {
    std::vector<Member> group;
    for (const Member& m : *state) {
      if (m.role == role && Alive(m)) group.push_back(m);
    }
    for (const Member& m : group) kill(m.pid, SIGTERM);
    const absl::Time deadline = absl::Now() + absl::Seconds(f.down_timeout_s);
    for (const Member& m : group) {
      while (Alive(m) && absl::Now() < deadline) absl::SleepFor(absl::Milliseconds(20));
      if (Alive(m)) {
        kill(m.pid, SIGKILL);
        ++killed;
        while (Alive(m)) absl::SleepFor(absl::Milliseconds(20));
      }
      ++stopped;
    }
  }
  std::filesystem::remove(StatePath(f.run_dir));
  std::printf("cluster down: %d processes stopped (%d killed after %.0f s)\n", stopped, killed,
              f.down_timeout_s);
  return 0;
}

}  // namespace

void RegisterClusterCommands(CLI::App& app, Run* run) {
  CLI::App* cluster = app.add_subcommand("cluster", "the local cluster: shards, nodes, router");
  cluster->require_subcommand(1);
  auto f = std::make_shared<ClusterFlags>();
  auto* up = cluster->add_subcommand("up", "start the local cluster and wait until it serves");
  up->add_option("--shards-config", f->shards_config, "embedding shard cluster config");
  up->add_option("--node-config", f->node_config, "serving node config");
  up->add_option("--nodes", f->nodes, "serving nodes")->check(CLI::Range(1u, 64u));
  up->add_option("--bin-dir", f->bin_dir, "build tree with the binaries (default: hlem's own)");
  up->add_option("--timeout-s", f->timeout_s, "wait this long for each process")
      ->check(CLI::PositiveNumber);
  up->add_option("--router-arg", f->router_args, "extra router flag (repeatable)")
      ->allow_extra_args(false);
  up->add_option("--allocator", f->allocator,
                 "start the allocator with this controller (none, or one of the allocator's "
                 "--controller: hlem, ppo, ppo+adapter, ppo+recovery, static, kv_only, recovery, "
                 "pid, bo, milp, xgboost, lstm); hlem and ppo* need "
                 "--allocator-arg=--weights=<file>")
      ->check(CLI::IsMember([] {
        std::vector<std::string> names = {"none"};
        names.insert(names.end(), hlem::allocator::kControllerNames.begin(),
                     hlem::allocator::kControllerNames.end());
        return names;
      }()));
  up->add_option("--allocator-arg", f->allocator_args, "extra allocator flag (repeatable)")
      ->allow_extra_args(false);
  up->add_option("--security-dir", f->security_dir,
                 "mutual TLS on every gRPC channel and bearer tokens on the nodes' admin port and "
                 "the router, from ca.crt, tls.crt, tls.key, admin.token and frontend.token here "
                 "(scripts/make-certs.sh DIR makes them)");
  for (CLI::App* sub : {up, cluster->add_subcommand("status", "is every process serving?"),
                        cluster->add_subcommand("down", "stop the local cluster")}) {
    sub->add_option("--run-dir", f->run_dir, "logs, ports and cluster.state");
  }
  cluster->get_subcommand("down")
      ->add_option("--timeout-s", f->down_timeout_s, "SIGKILL what has not exited after this long")
      ->check(CLI::PositiveNumber);
  up->callback([=] { *run = [=] { return Up(*f); }; });
  cluster->get_subcommand("status")->callback([=] { *run = [=] { return Status(*f); }; });
  cluster->get_subcommand("down")->callback([=] { *run = [=] { return Down(*f); }; });
}

}  // namespace hlem::tools
