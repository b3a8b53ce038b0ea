// Infer latency of one serving node in the local profile (issue 4; docs/perf/node.md): the whole
// node stack of deploy/local/node.yaml on the cpu device, with the local shard cluster
// (deploy/local/shards.yaml) running as real embedding_shard processes on loopback.
//
// For history lengths L in {64, 256, 512} (--lengths; the local profile's max_history is 512):
//   cold        a user the node never saw: all L history tokens are computed;
//   new p       a returning user whose request adds new = round(p·L / (1 + p)) events (>= 1) to
//               a cached prefix of L - new, i.e. p = new ÷ cached, for p = 1 %, 10 %, 100 %;
//               the prefix is sent first (not measured).
// Every request has 64 candidates (--candidates); items follow Zipf(1.0) over the item table,
// categories are uniform. Latency is Node::Infer from admission to answer (queue with its 1 ms
// batch window, EMB lookups, shard fetches of misses, copies over the emulated link, model, KV
// commit), one request at a time; no gRPC. The cost split is the pipeline's own stage timing. The
// same run also times the model's cached forward against its plain reference forward (full
// recompute) on the same shapes. Medians and P90 over --requests requests per row.
//
// `--costs-out=FILE` also fits the simulator's cost model (sim/twin/cost_model.h) to these
// measurements by least squares over the rows' medians: the model step's time against its FLOPs
// (CachedForwardFlops), the EMB lookups' time against the rows looked up, the shard fetches' time
// against the rows fetched (one fetch per table), and writes it as a cost file (sim/costs/).
//
// Own harness: each measurement is a whole request with state set up before it, which Google
// Benchmark's iteration model does not fit. `--smoke` runs 3 requests per row (CTest, label
// bench) and checks every answer.

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "common/clock.h"
#include "common/rng.h"
#include "common/zipf.h"
#include "embedding_shard/client/shard_client_factory.h"
#include "serving_node/core/emulated_link.h"
#include "serving_node/service/node_config.h"
#include "serving_node/service/node_stack.h"
#include "serving_node/service/shard_row_source.h"
#include "tests/testing/shard_cluster.h"

namespace hlem::bench {
namespace {

using serving::InferInput;
using serving::InferOutput;

[[noreturn]] void Die(const std::string& what) {
  std::fprintf(stderr, "node_benchmark: %s\n", what.c_str());
  std::exit(1);
}
void Must(const absl::Status& s, const char* what) {
  if (!s.ok()) Die(absl::StrCat(what, ": ", s.ToString()));
}

double Ms(absl::Duration d) { return absl::ToDoubleMilliseconds(d); }

double Quantile(std::vector<double> v, double q) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, static_cast<size_t>(q * static_cast<double>(v.size())))];
}

struct Args {
  bool smoke = false;
  int requests = 40;
  int warmup = 300;
  int candidates = 64;
  std::vector<uint32_t> lengths = {64, 256, 512};
  std::string costs_out;
  // Outside the node: loadgen -> router -> node and back, the median of (latency - node time)
  // in the local cluster, from `hlem loadgen --csv` (docs/simulator.md).
  double router_overhead_us = 1400;
  std::string config = std::string(HLEM_SOURCE_DIR) + "/deploy/local/node.yaml";
};

Args Parse(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    absl::string_view arg = argv[i];
    auto value = [&](absl::string_view flag) -> absl::string_view {
      if (arg.substr(0, flag.size()) == flag && arg.size() > flag.size() &&
          arg[flag.size()] == '=') {
        return arg.substr(flag.size() + 1);
      }
      return {};
    };
    if (arg == "--smoke") {
      a.smoke = true;
      a.requests = 3;
      a.warmup = 20;
    } else if (auto v = value("--requests"); !v.empty()) {
      if (!absl::SimpleAtoi(v, &a.requests) || a.requests < 1) Die("--requests: not a count");
    } else if (auto w = value("--warmup"); !w.empty()) {
      if (!absl::SimpleAtoi(w, &a.warmup) || a.warmup < 0) Die("--warmup: not a count");
    } else if (auto c = value("--config"); !c.empty()) {
      a.config = std::string(c);
    } else if (auto o = value("--costs-out"); !o.empty()) {
      a.costs_out = std::string(o);
    } else if (auto r = value("--router-overhead-us"); !r.empty()) {
      if (!absl::SimpleAtod(r, &a.router_overhead_us) || a.router_overhead_us < 0) {
        Die("--router-overhead-us: not a duration in µs");
      }
    } else if (auto n = value("--candidates"); !n.empty()) {
      if (!absl::SimpleAtoi(n, &a.candidates) || a.candidates < 1) Die("--candidates: not a count");
    } else if (auto l = value("--lengths"); !l.empty()) {
      a.lengths.clear();
      for (absl::string_view part : absl::StrSplit(l, ',')) {
        uint32_t length = 0;
        if (!absl::SimpleAtoi(part, &length) || length < 1) Die("--lengths: not a list of counts");
        a.lengths.push_back(length);
      }
    } else {
      Die(absl::StrCat("unknown argument ", arg,
                       " (--smoke, --requests=N, --warmup=N, --config=node.yaml, --lengths=64,256, "
                       "--candidates=N, --costs-out=FILE, --router-overhead-us=X)"));
    }
  }
  return a;
}

// Random events of the local profile's two features (item, category).
class Events {
 public:
  Events(uint64_t items, uint64_t categories, uint64_t seed)
      : zipf_(items, 1.0), categories_(categories), rng_(seed) {}
  std::vector<uint64_t> Make(size_t n) {
    std::vector<uint64_t> ids;
    ids.reserve(2 * n);
    for (size_t i = 0; i < n; ++i) {
      ids.push_back(zipf_(rng_));
      ids.push_back(rng_() % categories_);
    }
    return ids;
  }

 private:
  ZipfSampler zipf_;
  uint64_t categories_;
  Rng rng_;
};

struct Sample {
  double total_ms, emb_lookup_ms, fetch_ms, copy_ms, compute_ms, kv_ms, other_ms;
  double hits, misses;
  double flops;               // CachedForwardFlops of the request's model step
  double copies, copy_bytes;  // the request's miss copies over the link
};

// Least squares y = a + b·x; `a` clamped at 0 (a fixed cost is never negative).
std::pair<double, double> Fit(const std::vector<std::pair<double, double>>& xy) {
  double n = 0, sx = 0, sy = 0, sxx = 0, sxy = 0;
  for (auto [x, y] : xy) {
    n += 1, sx += x, sy += y, sxx += x * x, sxy += x * y;
  }
  const double den = n * sxx - sx * sx;
  const double b = den > 0 ? (n * sxy - sx * sy) / den : 0;
  const double a = n > 0 ? (sy - b * sx) / n : 0;
  if (a >= 0) return {a, b};
  return {0, sxx > 0 ? sxy / sxx : 0};
}

struct Row {
  std::string scenario;
  uint32_t length = 0, cached = 0, fresh = 0;
  std::vector<Sample> samples;
};

}  // namespace
}  // namespace hlem::bench

int main(int argc, char** argv) {
  using namespace hlem;                                                // NOLINT
  using namespace hlem::bench;                                         // NOLINT
  const std::string compute_note = serving::TuneComputeProcess(argv);  // may re-exec
  const Args args = Parse(argc, argv);
  auto config = serving::LoadNodeConfig(args.config);
  if (!config.ok()) Die(config.status().ToString());
  serving::SetComputeThreads(config->compute_threads);

  // The shard cluster of the profile, as real processes.
  std::ifstream shards_file(config->shards_config);
  std::stringstream shards_yaml;
  shards_yaml << shards_file.rdbuf();
  testing::ShardClusterOptions cluster_options;
  cluster_options.binary = HLEM_SHARD_BINARY;
  cluster_options.work_dir = absl::StrCat("/tmp/hlem_node_benchmark_", getpid());
  cluster_options.config_yaml = shards_yaml.str();
  auto cluster = testing::ShardCluster::Start(cluster_options);
  if (!cluster.ok()) Die(cluster.status().ToString());

  // The clocks serving_node/main.cc gives a node: the critical path's, the refiller's and memory
  // manager's, and the shard client's probes'.
  RealClock clock;
  RealClock background;
  RealClock probes;
  shard::ShardClientSetup setup;
  setup.cluster = (*cluster)->config();
  setup.addresses = (*cluster)->addresses();
  auto transport = shard::ParseClientTransport(config->shard_transport);
  Must(transport.status(), "shards.transport");
  setup.transport = *transport;
  auto client = shard::ConnectShardClient(setup, probes);
  if (!client.ok()) Die(client.status().ToString());
  serving::ShardRowSource source(**client);
  auto stack = serving::NodeStack::Build(*config, source, 1, clock, &background);
  if (!stack.ok()) Die(stack.status().ToString());
  serving::NodeStack& node = **stack;
  node.Start();

  const uint64_t items = node.features[0].rows, categories = node.features[1].rows;
  Events events(items, categories, 7);
  const size_t candidates = static_cast<size_t>(args.candidates);
  uint64_t next_user = 1;
  auto infer = [&](uint64_t user, std::vector<uint64_t> history) {
    absl::StatusOr<InferOutput> out = node.node->InferSync(
        {.user = user, .history = std::move(history), .candidates = events.Make(candidates)});
    if (!out.ok()) Die(absl::StrCat("infer: ", out.status().ToString()));
    if (out->scores.size() != candidates * out->targets) Die("wrong number of scores");
    return *out;
  };

  std::printf(
      "# node_benchmark: %s, pool %llu MiB, alpha %.2f, %s, shards over %s, %d requests "
      "per row, %d candidates, %d warm-up requests; %s\n",
      args.config.c_str(), static_cast<unsigned long long>(config->pool_bytes >> 20),
      config->memory.initial_alpha, config->model_name.c_str(), config->shard_transport.c_str(),
      args.requests, args.candidates, args.warmup, compute_note.c_str());
  // Warm-up: the EMB cache fills with the popular rows; every later request sees a steady cache.
  for (int i = 0; i < args.warmup; ++i) infer(next_user++, events.Make(128));

  std::vector<Row> rows;
  for (uint32_t length : args.lengths) {
    if (length > config->max_history) continue;
    rows.push_back({"cold", length, 0, length, {}});
    for (double p : {0.01, 0.10, 1.00}) {
      const uint32_t fresh =
          std::max<uint32_t>(1, static_cast<uint32_t>(std::lround(p * length / (1.0 + p))));
      rows.push_back({absl::StrCat("new ", static_cast<int>(p * 100), "%"),
                      length,
                      length - fresh,
                      fresh,
                      {}});
    }
  }
  for (Row& row : rows) {
    for (int r = 0; r < args.requests; ++r) {
      const uint64_t user = next_user++;
      std::vector<uint64_t> history = events.Make(row.length);
      if (row.cached > 0) {
        infer(user, std::vector<uint64_t>(history.begin(), history.begin() + 2 * row.cached));
      }
      const serving::DeviceCopyStats before = node.device->stats();
      const absl::Time start = clock.Now();
      const InferOutput out = infer(user, history);
      const absl::Duration total = clock.Now() - start;
      const serving::DeviceCopyStats after = node.device->stats();
      const int miss = static_cast<int>(serving::CopyPurpose::kEmbMiss);
      if (out.cached_prefix_tokens != row.cached) {
        Die(absl::StrCat(row.scenario, " L=", row.length, ": reused ", out.cached_prefix_tokens,
                         " tokens, expected ", row.cached));
      }
      const absl::Duration lookup = out.emb_seconds - out.fetch_seconds - out.copy_seconds;
      row.samples.push_back(
          {.total_ms = Ms(total),
           .emb_lookup_ms = Ms(lookup),
           .fetch_ms = Ms(out.fetch_seconds),
           .copy_ms = Ms(out.copy_seconds),
           .compute_ms = Ms(out.compute_seconds),
           .kv_ms = Ms(out.kv_seconds),
           .other_ms = Ms(total - out.emb_seconds - out.compute_seconds - out.kv_seconds),
           .hits = static_cast<double>(out.emb_hits),
           .misses = static_cast<double>(out.emb_misses),
           .flops = serving::CachedForwardFlops(config->model, row.cached, row.fresh, candidates),
           .copies = static_cast<double>(after.copies[miss] - before.copies[miss]),
           .copy_bytes = static_cast<double>(after.bytes[miss] - before.bytes[miss])});
    }
  }
  std::printf("\n%-9s %5s %6s %5s | %8s %8s | %7s %7s %7s %8s %6s %7s | %6s %6s\n", "scenario", "L",
              "cached", "new", "p50 ms", "p90 ms", "lookup", "fetch", "copy", "compute", "kv",
              "queue+", "hits", "misses");
  for (const Row& row : rows) {
    auto col = [&](double Sample::*field, double q = 0.5) {
      std::vector<double> v;
      for (const Sample& s : row.samples) v.push_back(s.*field);
      return Quantile(v, q);
    };
    std::printf(
        "%-9s %5u %6u %5u | %8.3f %8.3f | %7.3f %7.3f %7.3f %8.3f %6.3f %7.3f | %6.0f %6.0f\n",
        row.scenario.c_str(), row.length, row.cached, row.fresh, col(&Sample::total_ms),
        col(&Sample::total_ms, 0.9), col(&Sample::emb_lookup_ms), col(&Sample::fetch_ms),
        col(&Sample::copy_ms), col(&Sample::compute_ms), col(&Sample::kv_ms),
        col(&Sample::other_ms), col(&Sample::hits), col(&Sample::misses));
  }

  // The model alone, both forwards timed back to back on the same shapes: the cached forward
  // (the new tokens over a cached prefix read from KV pages, their K/V written to pages, as the
  // node runs it) against the plain reference forward (full recompute of the history).
  std::printf("\n%-9s %5s %6s %5s | %12s %14s %7s | %12s\n", "model", "L", "cached", "new",
              "cached p50 ms", "reference p50", "ratio", "in node p50");
  const uint32_t dim = config->model.dim;
  const serving::KvPageLayout& layout = node.kv->layout();
  Rng rng(3);
  auto fill = [&](std::vector<float>& v) {
    for (float& x : v) x = static_cast<float>(static_cast<double>(rng() % 2001) / 1000 - 1);
  };
  for (const Row& row : rows) {
    std::vector<float> history(static_cast<size_t>(row.length) * dim), cand(candidates * dim),
        scores(candidates * config->model.targets);
    fill(history);
    fill(cand);
    const uint32_t pages = (row.length + layout.page_tokens - 1) / layout.page_tokens;
    std::vector<std::byte> pool(static_cast<size_t>(pages) * layout.page_bytes);
    std::vector<uint64_t> offsets;
    for (uint32_t p = 0; p < pages; ++p) offsets.push_back(uint64_t{p} * layout.page_bytes);
    const serving::KvPagesView kv{layout, pool.data(), offsets};
    // The prefix's K/V, written once by a forward over it.
    if (row.cached > 0) {
      Must(
          node.model->ForwardCached(
              kv, 0, std::span<const float>(history).first(size_t{row.cached} * dim), cand, scores),
          "prefix forward");
    }
    const std::span<const float> fresh =
        std::span<const float>(history).subspan(size_t{row.cached} * dim);
    std::vector<double> reference, cached;
    for (int r = 0; r < args.requests; ++r) {
      absl::Time start = clock.Now();
      Must(node.model->ForwardCached(kv, row.cached, fresh, cand, scores), "cached forward");
      cached.push_back(Ms(clock.Now() - start));
      start = clock.Now();
      Must(node.model->ForwardReference(history, cand, scores), "reference forward");
      reference.push_back(Ms(clock.Now() - start));
    }
    std::vector<double> in_node;
    for (const Sample& s : row.samples) in_node.push_back(s.compute_ms);
    const double c = Quantile(cached, 0.5), ref = Quantile(reference, 0.5);
    std::printf("%-9s %5u %6u %5u | %12.3f %14.3f %6.1fx | %12.3f\n", row.scenario.c_str(),
                row.length, row.cached, row.fresh, c, ref, ref / c, Quantile(in_node, 0.5));
  }
  stack->reset();
  if (!args.costs_out.empty()) {
    // What one transfer of the emulated link costs beyond its configured latency and bandwidth
    // (the clock's timer wake-up and the hand-off to the waiting request): 256 transfers of one
    // row each, submitted at once as a request's miss copies are, against their configured time.
    double copy_overhead_ms = 0;
    {
      auto link = serving::EmulatedLink::Create(config->link, clock);
      Must(link.status(), "link");
      constexpr int kCopies = 256;
      const uint32_t row = config->model.dim * 4;
      absl::Mutex mu;
      int done = 0;
      const absl::Time start = clock.Now();
      for (int i = 0; i < kCopies; ++i) {
        (*link)->Submit(serving::CopyClass::kCritical, row, [&] {
          absl::MutexLock lock(&mu);
          ++done;
        });
      }
      {
        absl::MutexLock lock(&mu);
        mu.Await(absl::Condition(
            +[](int* d) { return *d == kCopies; }, &done));
      }
      const double measured = Ms(clock.Now() - start);
      copy_overhead_ms =
          std::max(0.0, (measured - kCopies * Ms((*link)->TransferTime(row))) / kCopies);
      std::printf(
          "\nlink: %d transfers of %u B in %.3f ms, configured %.3f ms: %.1f us more each\n",
          kCopies, row, measured, kCopies * Ms((*link)->TransferTime(row)), copy_overhead_ms * 1e3);
    }
    std::vector<std::pair<double, double>> compute, lookup, fetch, copy;
    std::vector<double> fixed;  // KV bookkeeping and queue/answer time per request
    // One point per row (its medians): a few slow requests (a page fault, a preempted thread)
    // must not tilt the lines.
    for (const Row& row : rows) {
      auto median = [&](double Sample::*field) {
        std::vector<double> v;
        for (const Sample& s : row.samples) v.push_back(s.*field);
        return Quantile(v, 0.5);
      };
      compute.push_back({median(&Sample::flops), median(&Sample::compute_ms)});
      lookup.push_back(
          {median(&Sample::hits) + median(&Sample::misses), median(&Sample::emb_lookup_ms)});
      fetch.push_back({median(&Sample::misses), median(&Sample::fetch_ms)});
      for (const Sample& s : row.samples) {
        // The copy stage beyond the configured link (bytes ÷ bandwidth + latency per copy and
        // the per-copy overhead measured below): gather and feature sums, per request.
        const double link_ms =
            s.copy_bytes / config->link.bytes_per_second * 1e3 +
            s.copies * (absl::ToDoubleMilliseconds(config->link.latency) + copy_overhead_ms);
        copy.push_back({1, s.copy_ms - link_ms});
        fixed.push_back(s.kv_ms + s.other_ms);
      }
    }
    const auto [step_ms, ms_per_flop] = Fit(compute);
    const auto [lookup_ms, lookup_ms_per_row] = Fit(lookup);
    const auto [fetch_ms, fetch_ms_per_row] = Fit(fetch);
    std::vector<double> copy_fixed;
    for (auto [one, ms] : copy) copy_fixed.push_back(ms);
    const double copy_fixed_ms = std::max(0.0, Quantile(copy_fixed, 0.5));
    const double tables = static_cast<double>(node.features.size());
    auto us = [](double ms) { return absl::StrFormat("%.3fus", ms * 1e3); };
    std::ofstream out(args.costs_out);
    out << "# Fitted by bench/node_benchmark --costs-out from its own measurements (least squares "
           "over\n"
           "# each row's medians; docs/simulator.md). Do not edit by hand: re-run it.\n"
        << "device: \"cpu\"\n"
        << "source: \"node_benchmark " << args.config << ", " << rows.size() << " rows x "
        << args.requests << " requests, " << candidates << " candidates; " << compute_note
        << "; router_overhead from --router-overhead-us (the local cluster's loadgen CSV)\"\n"
        << "flops_per_second: "
        << absl::StrFormat("%.4g", ms_per_flop > 0 ? 1e3 / ms_per_flop : 1e12)
        << "\nstep_overhead: " << us(step_ms)
        << "\nrequest_overhead: " << us(lookup_ms + copy_fixed_ms + Quantile(fixed, 0.5))
        << "\nlookup_per_row: " << us(lookup_ms_per_row)
        << "\nfetch_overhead: " << us(fetch_ms / std::max(1.0, tables))
        << "\nfetch_per_row: " << us(fetch_ms_per_row)
        << "\ncopy_overhead: " << us(copy_overhead_ms)
        << "\nrouter_overhead: " << us(args.router_overhead_us / 1e3)
        << "\ncompute_units: " << std::max(1u, std::thread::hardware_concurrency()) << "\n";
    if (!out) Die(absl::StrCat("cannot write ", args.costs_out));
    std::printf("\ncost model written to %s\n", args.costs_out.c_str());
  }
  return 0;
}
