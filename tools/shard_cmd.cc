// hlem shard info|fetch: inspect a shard server, and read (and verify) rows from a shard cluster
// through the same ShardClient the serving node uses.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "common/clock.h"
#include "common/grpc_flags.h"
#include "common/grpc_server.h"
#include "common/grpc_status.h"
#include "common/rng.h"
#include "common/zipf.h"
#include "embedding_shard/client/grpc_transport.h"
#include "embedding_shard/client/shard_client_factory.h"
#include "embedding_shard/core/shard_config.h"
#include "tools/commands.h"

namespace hlem::tools {
namespace {

struct FetchFlags {
  std::string config;
  std::string servers;  // comma-separated; default: the config's servers
  std::string transport = "ucx";
  std::string mode = "auto";
  uint32_t table = 0;
  uint64_t rows = 100000;
  uint32_t batch = 1024;
  double zipf = 1.0;
  uint64_t seed = 1;
  bool verify = true;
  int deadline_ms = 5000;
  TlsConfig tls;
};

int Usage(const std::string& message) {
  std::fprintf(stderr, "hlem shard: %s\n", message.c_str());
  return 2;
}

int Fetch(const FetchFlags& f) {
  auto config = shard::LoadShardClusterConfig(f.config);
  if (!config.ok()) return Usage(std::string(config.status().message()));
  shard::ShardClientSetup setup;
  setup.cluster = *config;
  if (auto s = f.tls.Validate(/*client_only=*/true); !s.ok()) {
    return Fail("shard fetch", "security", s);
  }
  setup.tls = f.tls;
  if (!f.servers.empty()) setup.addresses = absl::StrSplit(f.servers, ',');
  auto transport = shard::ParseClientTransport(f.transport);
  if (!transport.ok()) return Usage(absl::StrCat("--transport: ", transport.status().message()));
  setup.transport = *transport;
  auto mode = shard::ParseUcxReadMode(f.mode);
  if (!mode.ok()) return Usage(absl::StrCat("--mode: ", mode.status().message()));
  setup.ucx_mode = *mode;
  if (f.batch == 0) return Usage("--batch: must be > 0");
  auto client = shard::ConnectShardClient(setup, RealClock::Get());
  if (!client.ok()) {
    std::fprintf(stderr, "hlem shard fetch: %s\n", client.status().ToString().c_str());
    return 1;
  }
  const shard::TableSpec* spec = (*client)->FindTable(f.table);
  if (spec == nullptr) return Usage(absl::StrCat("--table: no table ", f.table, " in the config"));

  Rng rng(f.seed);
  ZipfSampler zipf(spec->rows, f.zipf);
  std::vector<uint64_t> ids(f.batch);
  std::vector<std::byte> out(size_t{f.batch} * spec->row_bytes());
  std::vector<std::byte> expected(spec->row_bytes());
  std::vector<double> latencies;
  uint64_t done = 0, wrong = 0, failed = 0;
  auto start = std::chrono::steady_clock::now();
  while (done < f.rows) {
    size_t n = std::min<uint64_t>(f.batch, f.rows - done);
    // Zipf ranks are scattered over the table by a fixed permutation-free hash of the rank.
    for (size_t i = 0; i < n; ++i) ids[i] = Mix64(zipf(rng) ^ f.seed) % spec->rows;
    auto t0 = std::chrono::steady_clock::now();
    absl::Status s = (*client)->Fetch(f.table, std::span<const uint64_t>(ids.data(), n),
                                      std::span<std::byte>(out.data(), n * spec->row_bytes()),
                                      absl::Now() + absl::Milliseconds(f.deadline_ms));
    latencies.push_back(
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    if (!s.ok()) {
      if (++failed <= 3) std::fprintf(stderr, "fetch failed: %s\n", s.ToString().c_str());
    } else if (f.verify) {
      for (size_t i = 0; i < n; ++i) {
        shard::GenerateRow(config->content.seed, *spec, ids[i], expected.data());
        if (std::memcmp(out.data() + i * spec->row_bytes(), expected.data(), spec->row_bytes())) {
          ++wrong;
        }
      }
    }
    done += n;
  }
  // Rates count the time spent inside Fetch only (not drawing ids or verifying).
  double seconds = 0;
  for (double l : latencies) seconds += l;
  const double wall =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::sort(latencies.begin(), latencies.end());
  auto pct = [&](double q) { return latencies[static_cast<size_t>(q * (latencies.size() - 1))]; };
  std::vector<std::string> in_use;
  if (setup.transport == shard::ClientTransport::kUcx) {
    auto& ucx = static_cast<shard::UcxShardTransport&>((*client)->transport());
    for (uint32_t s = 0; s < config->map.num_shards; ++s) {
      in_use.push_back(absl::StrCat("shard", s, "=",
                                    absl::StrJoin(ucx.EndpointTransportsOf(s), "+"), "/",
                                    shard::UcxReadModeName(ucx.ModeFor(s, f.batch))));
    }
  }
  std::printf(
      "transport=%s %s rows=%llu batch=%u fetch_seconds=%.3f wall_seconds=%.3f rows_per_s=%.0f "
      "GB_per_s=%.3f "
      "batch_p50_us=%.1f batch_p99_us=%.1f failed_batches=%llu wrong_rows=%llu%s\n",
      f.transport.c_str(), absl::StrJoin(in_use, ",").c_str(),
      static_cast<unsigned long long>(done), f.batch, seconds, wall, done / seconds,
      done * spec->row_bytes() / seconds / 1e9, pct(0.5) * 1e6, pct(0.99) * 1e6,
      static_cast<unsigned long long>(failed), static_cast<unsigned long long>(wrong),
      f.verify ? "" : " (not verified)");
  return failed == 0 && wrong == 0 ? 0 : 1;
}

int PrintShardInfo(const std::string& address, const TlsConfig& tls) {
  if (auto s = tls.Validate(/*client_only=*/true); !s.ok())
    return Fail("shard info", "security", s);
  shard::GrpcShardTransport grpc({address}, tls);
  grpc::ClientContext context;
  SetDeadline(context, absl::Now() + absl::Seconds(5));
  hlem::v1::ShardInfo info;
  absl::Status s =
      FromGrpcStatus(grpc.stub(0).GetShardInfo(&context, hlem::v1::GetShardInfoRequest(), &info));
  if (!s.ok()) {
    std::fprintf(stderr, "hlem shard info: %s: %s\n", address.c_str(), s.ToString().c_str());
    return 1;
  }
  std::printf("%s", info.DebugString().c_str());
  grpc::ClientContext rdma_context;
  SetDeadline(rdma_context, absl::Now() + absl::Seconds(5));
  hlem::v1::RdmaInfo rdma;
  s = FromGrpcStatus(
      grpc.stub(0).GetRdmaInfo(&rdma_context, hlem::v1::GetRdmaInfoRequest(), &rdma));
  if (s.ok()) {
    std::printf("ucx: worker address %zu bytes, %d regions, transports %s\n",
                rdma.worker_address().size(), rdma.regions_size(),
                absl::StrJoin(rdma.transports(), ",").c_str());
  } else {
    std::printf("ucx: %s\n", s.ToString().c_str());
  }
  return 0;
}

}  // namespace

void RegisterShardCommands(CLI::App& app, Run* run) {
  CLI::App* shard = app.add_subcommand("shard", "talk to embedding shard servers");
  shard->require_subcommand(1);

  auto f = std::make_shared<FetchFlags>();
  auto* fetch = shard->add_subcommand(
      "fetch", "read random (Zipf) rows through ShardClient, verify every byte, print rates");
  fetch->add_option("--config", f->config, "shard cluster config YAML")->required();
  fetch->add_option("--servers", f->servers, "comma-separated gRPC addresses, one per shard");
  fetch->add_option("--transport", f->transport, "ucx | grpc");
  fetch->add_option("--mode", f->mode, "UCX read mode: auto | get | gather | mapped");
  fetch->add_option("--table", f->table, "table id");
  fetch->add_option("--rows", f->rows, "rows to read in all");
  fetch->add_option("--batch", f->batch, "rows per Fetch call");
  fetch->add_option("--zipf", f->zipf, "Zipf exponent of row popularity (0 = uniform)");
  fetch->add_option("--seed", f->seed, "seed of the row sequence");
  fetch->add_option("--verify", f->verify, "check every byte against the generator");
  fetch->add_option("--deadline-ms", f->deadline_ms, "deadline per Fetch call");
  AddTlsFlags(*fetch, &f->tls);
  fetch->callback([=] { *run = [=] { return Fetch(*f); }; });

  auto address = std::make_shared<std::string>();
  auto* info = shard->add_subcommand("info", "print a shard's GetShardInfo and UCX setup");
  info->add_option("--server", *address, "gRPC address host:port")->required();
  auto tls = std::make_shared<TlsConfig>();
  AddTlsFlags(*info, tls.get());
  info->callback([=] { *run = [=] { return PrintShardInfo(*address, *tls); }; });
}

}  // namespace hlem::tools
