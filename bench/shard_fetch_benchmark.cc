// Fetch throughput of the embedding shards, next to the physical limit of one machine.
//
// Starts one embedding_shard process on loopback holding two generated tables of 1 GiB each
// (rows256: 256 B rows, rows2k: 2 KiB rows), connects one ShardClient per read path (UCX get,
// gather and mapped over shared memory, and gRPC), and times ShardClient::Fetch of Zipf(1.0) row
// ids in batches of 1, 64, 1024 and 16384 rows. In the same run, a local in-process gather
// (memcpy of the same rows out of a table of the same size) gives the reference. At the end a
// side-by-side table of GB/s (1e9 B/s) and the best-UCX / local ratio is printed.
// docs/perf/embedding_shard.md records a run and explains the figures.
//
// Own flags (everything else goes to Google Benchmark):
//   --smoke  16 MiB tables and a few cases (the CTest smoke pass),
//   --tcp    also a second shard with `ucx.transports: tcp` (gathered reads over loopback tcp;
//            per-row gets over tcp are refused since 2026-12-07, docs/embedding_shard.md).
// Defaults, overridable on the command line: --benchmark_min_time=0.3
// --benchmark_repetitions=3 --benchmark_display_aggregates_only=true (the summary uses medians).
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "benchmark/benchmark.h"
#include "common/clock.h"
#include "common/rng.h"
#include "common/zipf.h"
#include "embedding_shard/client/shard_client_factory.h"
#include "embedding_shard/core/table.h"
#include "embedding_shard/transport/ucx_client.h"
#include "tests/testing/shard_cluster.h"

namespace hlem::bench {
namespace {

constexpr uint64_t kZipfSeed = 1;
constexpr double kZipfExponent = 1.0;
constexpr uint32_t kTargetBatch = 1024;
constexpr double kTargetRatio = 0.30;  // best shared-memory UCX mode / local gather
constexpr absl::Duration kFetchDeadline = absl::Seconds(30);

struct RunOptions {
  bool smoke = false;
  bool tcp = false;
};

// One table of the run: its spec, the pool of Zipf row ids every case cycles through, and the
// local copy of the same size that the local gather reads.
struct Table {
  shard::TableSpec spec;
  std::vector<uint64_t> ids;
  std::unique_ptr<std::byte[]> local;
};

// One way of reading rows: a client and its read mode, or the local gather (client == nullptr).
struct Variant {
  std::string name;      // column of the summary: local_gather, ucx_get, ...
  std::string label;     // what it ran on, e.g. "ucx/mapped posix/memory"
  bool shm_ucx = false;  // counts for the best-UCX column (UCX over shared memory)
  std::unique_ptr<shard::ShardClient> client;
};

std::string ClusterYaml(const std::vector<shard::TableSpec>& tables, const std::string& tls) {
  std::string yaml = absl::StrCat(
      "shard_map:\n  num_shards: 1\n  partitioning: range\n  replicas: 1\n"
      "content:\n  source: generated\n  seed: 42\n"
      "limits:\n  max_batch_rows: 65536\n"
      "ucx:\n  enabled: true\n  transports: ",
      tls, "\n  net_devices: lo\n  error_handling: auto\ntables:\n");
  for (const shard::TableSpec& t : tables) {
    absl::StrAppend(&yaml, "  - {id: ", t.id, ", name: ", t.name, ", rows: ", t.rows,
                    ", dim: ", t.dim, ", dtype: fp32}\n");
  }
  return yaml;
}

// The next `n` ids of the pool (wrapping around), so every case reads the same sequence.
std::span<const uint64_t> NextIds(const Table& t, size_t* cursor, size_t n) {
  if (*cursor + n > t.ids.size()) *cursor = 0;
  std::span<const uint64_t> ids(t.ids.data() + *cursor, n);
  *cursor += n;
  return ids;
}

void SetRates(benchmark::State& state, const Table& t, uint32_t batch, const std::string& label) {
  const int64_t rows = static_cast<int64_t>(state.iterations()) * batch;
  state.SetItemsProcessed(rows);
  state.SetBytesProcessed(rows * static_cast<int64_t>(t.spec.row_bytes()));
  state.SetLabel(label);
}

void FetchRows(benchmark::State& state, Variant* v, const Table* t, uint32_t batch) {
  std::vector<std::byte> out(size_t{batch} * t->spec.row_bytes());
  size_t cursor = 0;
  for (auto _ : state) {
    absl::Status s = v->client->Fetch(t->spec.id, NextIds(*t, &cursor, batch), out,
                                      absl::Now() + kFetchDeadline);
    if (!s.ok()) {
      state.SkipWithError(s.ToString().c_str());
      break;
    }
    benchmark::DoNotOptimize(out.data());
    benchmark::ClobberMemory();
  }
  SetRates(state, *t, batch, v->label);
}

void LocalGather(benchmark::State& state, const Table* t, uint32_t batch) {
  const size_t row_bytes = t->spec.row_bytes();
  std::vector<std::byte> out(size_t{batch} * row_bytes);
  const std::byte* table = t->local.get();
  size_t cursor = 0;
  for (auto _ : state) {
    std::byte* dst = out.data();
    for (uint64_t id : NextIds(*t, &cursor, batch)) {
      std::memcpy(dst, table + id * row_bytes, row_bytes);
      dst += row_bytes;
    }
    benchmark::DoNotOptimize(out.data());
    benchmark::ClobberMemory();
  }
  SetRates(state, *t, batch, "local memcpy");
}

// Forwards to the default display reporter and keeps each case's bytes/s: the median aggregate
// when there are repetitions, else the single run.
class CapturingReporter final : public benchmark::BenchmarkReporter {
 public:
  explicit CapturingReporter(benchmark::BenchmarkReporter* display) : display_(display) {}

  bool ReportContext(const Context& context) override { return display_->ReportContext(context); }
  void ReportRuns(const std::vector<Run>& runs) override {
    for (const Run& run : runs) {
      if (run.error_occurred) continue;
      auto it = run.counters.find("bytes_per_second");
      if (it == run.counters.end()) continue;
      Result& r = results_[run.run_name.function_name];
      if (run.run_type == Run::RT_Aggregate) {
        if (run.aggregate_name != "median") continue;
        r.median = true;
        r.bytes_per_second = it->second.value;
      } else if (!r.median) {
        r.bytes_per_second = it->second.value;
      }
    }
    display_->ReportRuns(runs);
  }
  void Finalize() override { display_->Finalize(); }

  // Bytes/s of the case named `name`, if it ran without error.
  std::optional<double> BytesPerSecond(const std::string& name) const {
    auto it = results_.find(name);
    if (it == results_.end()) return std::nullopt;
    return it->second.bytes_per_second;
  }
  bool any_median() const {
    return std::any_of(results_.begin(), results_.end(),
                       [](const auto& r) { return r.second.median; });
  }

 private:
  struct Result {
    double bytes_per_second = 0;
    bool median = false;
  };
  benchmark::BenchmarkReporter* display_;  // not owned (the library keeps it)
  std::map<std::string, Result> results_;
};

int Fail(const absl::Status& status) {
  std::fprintf(stderr, "shard_fetch_benchmark: %s\n", status.ToString().c_str());
  return 1;
}

std::string CaseName(const Table& t, uint32_t batch, const Variant& v) {
  return absl::StrCat("fetch/", t.spec.name, "/batch:", batch, "/", v.name);
}

// MemAvailable against what the run needs. (UCX 1.13 places the shard's tables in SysV shared
// memory, not in /dev/shm, so the size of /dev/shm is not the limit.)
absl::Status CheckMemory(uint64_t /*shm_bytes*/, uint64_t ram_bytes) {
  std::ifstream meminfo("/proc/meminfo");
  std::string key;
  uint64_t kib = 0;
  std::string unit;
  while (meminfo >> key >> kib >> unit) {
    if (key == "MemAvailable:" && kib * 1024 < ram_bytes) {
      return absl::ResourceExhaustedError(
          absl::StrFormat("%.2f GiB of memory available, the run needs about %.2f GiB",
                          kib / 1048576.0, ram_bytes / 1073741824.0));
    }
  }
  return absl::OkStatus();
}

std::string ShardBinary() {
  std::string path = HLEM_SHARD_BINARY;
  if (std::filesystem::exists(path)) return path;
  // A relocated build tree: the shard binary sits beside bench/ as in the build directory.
  return testing::ExecutableDir() + "/../embedding_shard/embedding_shard";
}

absl::StatusOr<std::unique_ptr<testing::ShardCluster>> StartCluster(
    const std::vector<Table>& tables, const std::string& tls, const std::string& work_dir) {
  std::vector<shard::TableSpec> specs;
  for (const Table& t : tables) specs.push_back(t.spec);
  testing::ShardClusterOptions options;
  options.binary = ShardBinary();
  options.work_dir = work_dir;
  options.config_yaml = ClusterYaml(specs, tls);
  options.start_timeout = absl::Minutes(10);  // generating 2 GiB takes a while on 2 cores
  absl::Time start = absl::Now();
  auto cluster = testing::ShardCluster::Start(options);
  if (!cluster.ok()) {
    return absl::Status(cluster.status().code(),
                        absl::StrCat("starting the ", tls, " shard: ", cluster.status().message()));
  }
  std::fprintf(stderr, "shard (%s) up at %s after %.1f s; log %s\n", tls.c_str(),
               (*cluster)->addresses()[0].c_str(), absl::ToDoubleSeconds(absl::Now() - start),
               (*cluster)->log_path(0).c_str());
  return std::move(*cluster);
}

absl::StatusOr<Variant> Connect(const testing::ShardCluster& cluster, const std::string& name,
                                shard::ClientTransport transport, shard::UcxReadMode mode,
                                bool shm_ucx) {
  shard::ShardClientSetup setup;
  setup.cluster = cluster.config();
  setup.transport = transport;
  setup.ucx_mode = mode;
  setup.probe_interval = absl::ZeroDuration();  // no background RPCs while timing
  auto client = shard::ConnectShardClient(setup, RealClock::Get());
  if (!client.ok()) {
    return absl::Status(client.status().code(),
                        absl::StrCat(name, ": ", client.status().message()));
  }
  Variant v;
  v.name = name;
  v.shm_ucx = shm_ucx;
  v.client = std::move(*client);
  if (transport == shard::ClientTransport::kGrpc) {
    v.label = "grpc";
  } else {
    auto& ucx = static_cast<shard::UcxShardTransport&>(v.client->transport());
    std::vector<std::string> used = ucx.EndpointTransportsOf(0);
    if (used.empty()) {
      return absl::UnavailableError(absl::StrCat(name, ": the UCX endpoint is not connected"));
    }
    v.label = absl::StrCat("ucx/", shard::UcxReadModeName(mode), " ", absl::StrJoin(used, "+"));
  }
  return v;
}

// Reads a batch of pool rows and a single row through the variant and compares them with the
// generator; any difference ends the run.
absl::Status Verify(Variant& v, const Table& t, uint64_t content_seed) {
  const size_t row_bytes = t.spec.row_bytes();
  std::vector<std::byte> expected(row_bytes);
  for (size_t n : {size_t{1}, size_t{kTargetBatch}}) {
    std::span<const uint64_t> ids(t.ids.data() + 7, std::min(n, t.ids.size() - 7));
    std::vector<std::byte> out(ids.size() * row_bytes);
    absl::Status s = v.client->Fetch(t.spec.id, ids, out, absl::Now() + kFetchDeadline);
    if (!s.ok()) {
      return absl::Status(s.code(), absl::StrCat(v.name, " on ", t.spec.name, ": ", s.message()));
    }
    for (size_t i = 0; i < ids.size(); ++i) {
      shard::GenerateRow(content_seed, t.spec, ids[i], expected.data());
      if (std::memcmp(out.data() + i * row_bytes, expected.data(), row_bytes) != 0) {
        return absl::DataLossError(absl::StrCat(v.name, " on ", t.spec.name, ": row ", ids[i],
                                                " (position ", i, " of a ", ids.size(),
                                                "-row batch) differs from the generated content"));
      }
    }
  }
  return absl::OkStatus();
}

// Reads every pool row once (and, for the mapped mode, every row of the table) so that first-touch
// page faults and lazily built state are not timed.
absl::Status WarmUp(Variant& v, const Table& t) {
  constexpr size_t kChunk = 16384;
  std::vector<std::byte> out(kChunk * t.spec.row_bytes());
  auto read = [&](std::span<const uint64_t> ids) {
    absl::Status s =
        v.client->Fetch(t.spec.id, ids, std::span(out.data(), ids.size() * t.spec.row_bytes()),
                        absl::Now() + kFetchDeadline);
    if (s.ok()) return s;
    return absl::Status(
        s.code(), absl::StrCat("warm-up of ", v.name, " on ", t.spec.name, ": ", s.message()));
  };
  for (size_t first = 0; first < t.ids.size(); first += kChunk) {
    absl::Status s = read(std::span(t.ids).subspan(first, std::min(kChunk, t.ids.size() - first)));
    if (!s.ok()) return s;
  }
  if (v.name.ends_with("mapped")) {
    std::vector<uint64_t> sweep(kChunk);
    for (uint64_t first = 0; first < t.spec.rows; first += kChunk) {
      size_t n = std::min<uint64_t>(kChunk, t.spec.rows - first);
      for (size_t i = 0; i < n; ++i) sweep[i] = first + i;
      absl::Status s = read(std::span<const uint64_t>(sweep.data(), n));
      if (!s.ok()) return s;
    }
  }
  return absl::OkStatus();
}

Table MakeTable(uint32_t id, const std::string& name, uint64_t rows, uint32_t dim,
                size_t pool_size) {
  Table t;
  t.spec = shard::TableSpec{id, name, rows, dim, shard::Dtype::kFp32};
  Rng rng(kZipfSeed);
  ZipfSampler zipf(rows, kZipfExponent);
  t.ids.resize(pool_size);
  // Zipf ranks are scattered over the table by a hash of the rank (as `hlem shard fetch` does).
  for (uint64_t& id : t.ids) id = Mix64(zipf(rng) ^ kZipfSeed) % rows;
  // Same size and access pattern as the shard's table, not the same bytes: filling every row
  // touches every page, so the local gather never takes a first-touch fault either.
  const size_t row_bytes = t.spec.row_bytes();
  t.local.reset(new std::byte[t.spec.total_bytes()]);
  for (uint64_t r = 0; r < rows; ++r) {
    std::memset(t.local.get() + r * row_bytes, static_cast<int>(r & 0xff), row_bytes);
  }
  return t;
}

void PrintSummary(const CapturingReporter& reporter, const std::vector<Table>& tables,
                  const std::vector<uint32_t>& batches, const std::vector<Variant*>& variants) {
  std::printf(
      "\nSide by side: GB/s (1e9 B/s) of Zipf(%.1f) row fetches, %s; best UCX = best "
      "shared-memory UCX mode\n",
      kZipfExponent, reporter.any_median() ? "medians of the repetitions" : "single runs");
  std::string header = absl::StrFormat("%-8s %6s", "table", "batch");
  for (const Variant* v : variants) absl::StrAppendFormat(&header, " %12s", v->name);
  absl::StrAppendFormat(&header, " %14s", "best_ucx/local");
  std::printf("%s\n", header.c_str());
  std::vector<std::string> verdicts;
  bool all_met = true;
  for (const Table& t : tables) {
    for (uint32_t batch : batches) {
      std::string line = absl::StrFormat("%-8s %6u", t.spec.name, batch);
      std::optional<double> local, best;
      std::string best_name;
      for (const Variant* v : variants) {
        std::optional<double> bps = reporter.BytesPerSecond(CaseName(t, batch, *v));
        if (!bps) {
          absl::StrAppendFormat(&line, " %12s", "-");
          continue;
        }
        absl::StrAppendFormat(&line, " %12.3f", *bps / 1e9);
        if (v->client == nullptr) local = bps;
        if (v->shm_ucx && (!best || *bps > *best)) {
          best = bps;
          best_name = v->name;
        }
      }
      if (local && best && *local > 0) {
        double ratio = *best / *local;
        absl::StrAppendFormat(&line, " %13.1f%%", 100 * ratio);
        if (batch == kTargetBatch) {
          bool met = ratio >= kTargetRatio;
          all_met = all_met && met;
          verdicts.push_back(absl::StrFormat("%s: %s at %.3f GB/s = %.1f%% of local %.3f GB/s, %s",
                                             t.spec.name, best_name, *best / 1e9, 100 * ratio,
                                             *local / 1e9, met ? "MET" : "NOT MET"));
        }
      } else {
        absl::StrAppendFormat(&line, " %14s", "-");
      }
      std::printf("%s\n", line.c_str());
    }
  }
  if (!verdicts.empty()) {
    std::printf("\nTarget: best UCX mode at %u-row batches >= %.0f%% of the local gather: %s\n",
                kTargetBatch, 100 * kTargetRatio, all_met ? "MET" : "NOT MET");
    for (const std::string& v : verdicts) std::printf("  %s\n", v.c_str());
  }
  std::printf("\nTransports: ");
  for (const Variant* v : variants) std::printf("%s=[%s] ", v->name.c_str(), v->label.c_str());
  std::printf("\n");
}

int Main(int argc, char** argv) {
  RunOptions run;
  // Our defaults go first so that the same flags given on the command line override them.
  std::vector<std::string> defaults = {"--benchmark_min_time=0.3", "--benchmark_repetitions=3",
                                       "--benchmark_display_aggregates_only=true"};
  std::vector<char*> args = {argv[0]};
  for (int i = 1; i < argc; ++i) {
    std::string_view arg = argv[i];
    if (arg == "--smoke") {
      run.smoke = true;
    } else if (arg == "--tcp") {
      run.tcp = true;
    }
  }
  if (run.smoke) defaults = {"--benchmark_min_time=0.01", "--benchmark_repetitions=1"};
  for (std::string& d : defaults) args.push_back(d.data());
  for (int i = 1; i < argc; ++i) {
    std::string_view arg = argv[i];
    if (arg != "--smoke" && arg != "--tcp") args.push_back(argv[i]);
  }
  int n = static_cast<int>(args.size());
  benchmark::Initialize(&n, args.data());
  if (benchmark::ReportUnrecognizedArguments(n, args.data())) return 2;

  // 4 Mi rows of 256 B and 512 Ki rows of 2 KiB: 1 GiB each (16 MiB each in the smoke pass).
  const uint64_t scale = run.smoke ? 64 : 1;
  const size_t pool = run.smoke ? (size_t{1} << 16) : (size_t{1} << 20);
  const std::vector<uint32_t> batches =
      run.smoke ? std::vector<uint32_t>{1, 1024} : std::vector<uint32_t>{1, 64, 1024, 16384};
  std::vector<Table> tables;
  tables.push_back(MakeTable(0, "rows256", (uint64_t{4} << 20) / scale, 64, pool));
  tables.push_back(MakeTable(1, "rows2k", (uint64_t{512} << 10) / scale, 512, pool));
  uint64_t table_bytes = 0;
  for (const Table& t : tables) table_bytes += t.spec.total_bytes();
  const int clusters = run.tcp ? 2 : 1;
  absl::Status memory =
      CheckMemory(clusters * table_bytes, (clusters + 1) * table_bytes + (uint64_t{1} << 30));
  if (!memory.ok()) return Fail(memory);

  char dir_template[] = "/tmp/shard_fetch_benchmark.XXXXXX";
  if (mkdtemp(dir_template) == nullptr) return Fail(absl::InternalError("mkdtemp failed"));
  const std::string work_dir = dir_template;
  // Declared before the clients so that they are destroyed after them.
  std::unique_ptr<testing::ShardCluster> shm, tcp;
  auto started = StartCluster(tables, "shm", work_dir + "/shm");
  if (!started.ok()) return Fail(started.status());
  shm = std::move(*started);
  if (run.tcp) {
    started = StartCluster(tables, "tcp", work_dir + "/tcp");
    if (!started.ok()) return Fail(started.status());
    tcp = std::move(*started);
  }

  using shard::ClientTransport;
  using shard::UcxReadMode;
  struct Wanted {
    testing::ShardCluster* cluster;
    const char* name;
    ClientTransport transport;
    UcxReadMode mode;
    bool shm_ucx;
  };
  std::vector<Wanted> wanted = {
      {shm.get(), "ucx_get", ClientTransport::kUcx, UcxReadMode::kGet, true},
      {shm.get(), "ucx_gather", ClientTransport::kUcx, UcxReadMode::kGather, true},
      {shm.get(), "ucx_mapped", ClientTransport::kUcx, UcxReadMode::kMapped, true},
      {shm.get(), "grpc", ClientTransport::kGrpc, UcxReadMode::kAuto, false},
  };
  if (tcp) {
    wanted.push_back({tcp.get(), "tcp_gather", ClientTransport::kUcx, UcxReadMode::kGather, false});
  }
  std::vector<Variant> variants;
  variants.push_back(Variant{"local_gather", "local memcpy", false, nullptr});
  const uint64_t content_seed = shm->config().content.seed;
  for (const Wanted& w : wanted) {
    auto v = Connect(*w.cluster, w.name, w.transport, w.mode, w.shm_ucx);
    if (!v.ok()) return Fail(v.status());
    for (const Table& t : tables) {
      absl::Status s = Verify(*v, t, content_seed);
      if (s.ok()) s = WarmUp(*v, t);
      if (!s.ok()) return Fail(s);
    }
    std::fprintf(stderr, "%s: verified and warmed up (%s)\n", w.name, v->label.c_str());
    variants.push_back(std::move(*v));
  }

  // Grouped by (table, batch) so that the cases compared side by side run close in time.
  std::vector<Variant*> columns;
  for (Variant& v : variants) columns.push_back(&v);
  for (const Table& t : tables) {
    for (uint32_t batch : batches) {
      for (Variant* v : columns) {
        std::string name = CaseName(t, batch, *v);
        benchmark::internal::Benchmark* b =
            v->client == nullptr
                ? benchmark::RegisterBenchmark(name.c_str(), LocalGather, &t, batch)
                : benchmark::RegisterBenchmark(name.c_str(), FetchRows, v, &t, batch);
        b->UseRealTime()->Unit(benchmark::kMicrosecond);
      }
    }
  }
  CapturingReporter reporter(benchmark::CreateDefaultDisplayReporter());
  benchmark::RunSpecifiedBenchmarks(&reporter);
  benchmark::Shutdown();
  PrintSummary(reporter, tables, batches, columns);

  variants.clear();  // clients before the servers they talk to
  tcp.reset();
  shm.reset();
  std::error_code ec;
  std::filesystem::remove_all(work_dir, ec);
  return 0;
}

}  // namespace
}  // namespace hlem::bench

int main(int argc, char** argv) { return hlem::bench::Main(argc, argv); }
