// One whole serving node on a GPU (issue 9; docs/perf/gpu.md): LocalNode with the `cuda` device and
// the CUDA HSTU runner in the node's default mode (bf16 attention, tf32 GEMMs), as NodeStack builds
// it for memory.device: cuda, at the paper's shape: 3 layers (--layers), D 512, 4 heads of 128, 100
// candidates, two fp32 feature tables of 512-dim rows (item ids Zipf(1.0) over 16 Mi items, their
// categories). Requests go one at a time through Node::InferSync: admission, the queue, EMB
// lookups, fetches of the misses, the miss copies into the GPU pool, the hit gather, the feature
// sums, the model and the KV commit.
//
// Rows come from an in-process source (a hash of table, row and dimension: no network), so fetch
// time is the host's own work only. For history lengths L in {1000, 4000, 15000}:
//   cold     a user the node never saw: all L events computed;
//   new p    a returning user whose request adds round(p·L) events (>= 1) to a cached prefix of
//            L - new, p = 1 % and 10 %; the prefix is sent first and not timed.
// Prints P50 and P90 latency and the median of each stage per class, then fits the digital twin's
// per-request host work (sim/twin/cost_model.h: request_overhead + lookup_per_row × distinct rows
// looked up) to latency − model − fetch over every timed request by least squares; --costs-out DIR
// writes the fit and the medians to DIR/<device>-node.csv. Needs no torch (scripts/gpu-check.sh
// bundles it for a bare GPU host).
//
// `--device cpu` runs the same requests on the cpu device (a 4 GiB host arena, touched before the
// first request, behind an emulated link that costs nothing) with no model (a runner that only
// writes zero scores): the host's share of the node's work, timed on a machine without a GPU, so
// that changes to the EMB path can be measured anywhere (docs/perf/gpu.md, "The host's EMB path").
//
//   gpu_node_benchmark [--device cuda|cpu] [--requests N] [--layers L] [--costs-out DIR] [--smoke]
// Exit 0, 1 on an error, 2 on a bad argument, 77 without a GPU for --device cuda (--smoke: one
// request per class, for CTest).

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/clock.h"
#include "common/rng.h"
#include "common/zipf.h"
#include "serving_node/core/hstu_flat.h"
#include "serving_node/core/row_source.h"
#include "serving_node/device/cpu_device.h"
#include "serving_node/device/cuda/cuda_pool.h"
#include "serving_node/device/cuda_device.h"
#include "serving_node/device/cuda_model_runner.h"
#include "serving_node/device/local_node.h"

namespace hlem::bench {
namespace {

using serving::InferInput;
using serving::InferOutput;

constexpr uint32_t kDim = 512;  // the rows' width: the model's D (PaperHstuShape)
constexpr uint64_t kItems = 1ull << 24;
constexpr uint64_t kCategories = 1000000;
constexpr uint32_t kCandidates = 100;

// Rows by hash: what a shard would serve, without the network.
class HashRowSource final : public serving::RowSource {
 public:
  absl::Status Fetch(uint32_t table_id, std::span<const uint64_t> rows, std::span<std::byte> out,
                     absl::Time) override {
    float* f = reinterpret_cast<float*>(out.data());
    for (size_t r = 0; r < rows.size(); ++r) {
      for (uint32_t d = 0; d < kDim; ++d) {
        f[r * kDim + d] =
            static_cast<float>(KeyedHash(table_id, rows[r], d) % 2001) / 1000.0f / 16.0f - 0.0625f;
      }
    }
    return absl::OkStatus();
  }
};

struct Sample {
  double total, model, fetch, emb, copy, kv;  // seconds
  uint64_t rows;
};

double Quantile(std::vector<double> v, double q) {
  std::sort(v.begin(), v.end());
  return v[static_cast<size_t>(q * static_cast<double>(v.size() - 1) + 0.5)];
}

// No model: zero scores, no K/V written (--device cpu times the host's work alone).
class NoModelRunner final : public serving::ModelRunner {
 public:
  explicit NoModelRunner(const serving::HstuFlatShape& shape) : shape_(shape) {}
  uint32_t dim() const override { return shape_.dim; }
  uint32_t targets() const override { return shape_.targets; }
  uint32_t layers() const override { return shape_.layers; }
  uint32_t kv_dim() const override { return shape_.kv_dim(); }
  uint32_t max_positions() const override { return shape_.max_positions; }
  absl::Status Run(std::span<const serving::ModelStep> steps) override {
    for (const serving::ModelStep& s : steps) std::fill(s.scores.begin(), s.scores.end(), 0.0f);
    return absl::OkStatus();
  }

 private:
  serving::HstuFlatShape shape_;
};

int Run(int argc, char** argv) {
  uint32_t requests = 15, layers = 3;
  bool smoke = false;
  std::string costs_out, device_kind = "cuda";
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--smoke") {
      smoke = true;
    } else if (a == "--device" && i + 1 < argc) {
      device_kind = argv[++i];
      if (device_kind != "cuda" && device_kind != "cpu") {
        std::fprintf(stderr, "gpu_node_benchmark: --device must be cuda or cpu, not '%s'\n",
                     device_kind.c_str());
        return 2;
      }
    } else if (a == "--requests" && i + 1 < argc) {
      requests = static_cast<uint32_t>(std::max(1, std::atoi(argv[++i])));
    } else if (a == "--layers" && i + 1 < argc) {
      layers = static_cast<uint32_t>(std::max(1, std::atoi(argv[++i])));
    } else if (a == "--costs-out" && i + 1 < argc) {
      costs_out = argv[++i];
    } else {
      std::fprintf(stderr,
                   "gpu_node_benchmark: unknown argument '%s' (known: --device cuda|cpu, "
                   "--requests N, --layers L, --costs-out DIR, --smoke)\n",
                   a.c_str());
      return 2;
    }
  }
  if (smoke) requests = 1;
  const bool on_gpu = device_kind == "cuda";
  if (!on_gpu && !costs_out.empty()) {
    // The twin's cpu costs come from node_benchmark, with the model (docs/simulator.md).
    std::fprintf(stderr, "gpu_node_benchmark: --costs-out needs --device cuda\n");
    return 2;
  }
  const serving::HstuFlatShape shape = serving::PaperHstuShape(layers, 16384);
  std::unique_ptr<serving::ModelRunner> runner;
  if (on_gpu) {
    std::string detail;
    if (cuda::CudaDeviceCount(&detail) == 0) {
      std::fprintf(stderr, "gpu_node_benchmark: no CUDA device (%s)\n", detail.c_str());
      return 77;
    }
    auto cuda_runner = serving::CudaModelRunner::Create(
        serving::RandomHstuFlatWeights(shape, 7), 0,
        {.attention = cuda::HstuAttentionMath::kBf16, .tf32_gemm = true});
    if (!cuda_runner.ok()) {
      std::fprintf(stderr, "gpu_node_benchmark: %s\n", cuda_runner.status().ToString().c_str());
      return 1;
    }
    runner = std::move(*cuda_runner);
  } else {
    runner = std::make_unique<NoModelRunner>(shape);
  }
  serving::LocalNodeOptions o;
  o.node.slo = absl::Seconds(10);
  o.node.max_in_flight_tokens = 1 << 22;
  o.pool_bytes = (smoke ? 1ull : on_gpu ? 48ull : 4ull) << 30;
  o.page_bytes = 2 << 20;
  o.memory.initial_alpha = 0.3;
  o.queue.batch_window = absl::ZeroDuration();
  o.pipeline = {.features = {{.table_id = 0, .rows = kItems}, {.table_id = 1, .rows = kCategories}},
                .max_candidates = 128,
                .max_history = 15360,
                .max_request_events = 1 << 16};
  RealClock clock;
  if (!on_gpu) {
    // The emulated link costs nothing, and the arena is touched first (a running node's pool is
    // resident; a fresh one would charge the first requests the kernel's page faults): the time is
    // the host's own work.
    o.make_device = [&clock](uint64_t pool_bytes) -> absl::StatusOr<serving::PoolDevice> {
      auto device = serving::CpuDevice::Create(
          {.pool_bytes = pool_bytes,
           .link = {.bytes_per_second = 1e15, .latency = absl::ZeroDuration()}},
          clock);
      if (!device.ok()) return device.status();
      std::byte* pool = (*device)->pool_data();
      std::memset(pool, 0, pool_bytes);
      return serving::PoolDevice{.device = std::move(*device), .runner_pool = pool};
    };
  } else {
    o.make_device = [](uint64_t pool_bytes) -> absl::StatusOr<serving::PoolDevice> {
      auto device = serving::CudaDevice::Create({.pool_bytes = pool_bytes});
      if (!device.ok()) return device.status();
      std::byte* pool = (*device)->cuda_pool().pool();
      return serving::PoolDevice{.device = std::move(*device), .runner_pool = pool};
    };
  }
  HashRowSource source;
  auto node = serving::LocalNode::Build(o, source, *runner, 1, clock);
  if (!node.ok()) {
    std::fprintf(stderr, "gpu_node_benchmark: %s\n", node.status().ToString().c_str());
    return 1;
  }
  (*node)->Start();
  const std::string device = (*node)->device->name();

  Rng rng(2026);
  const ZipfSampler items(kItems, 1.0);
  auto events = [&](size_t n) {
    std::vector<uint64_t> ids;
    for (size_t i = 0; i < n; ++i) {
      const uint64_t item = items(rng);
      ids.push_back(item);
      ids.push_back(Mix64(item) % kCategories);
    }
    return ids;
  };
  auto infer = [&](uint64_t user, const std::vector<uint64_t>& history,
                   const std::vector<uint64_t>& cand, Sample* s) -> bool {
    const auto t0 = std::chrono::steady_clock::now();
    absl::StatusOr<InferOutput> out =
        (*node)->node->InferSync({.user = user, .history = history, .candidates = cand});
    const double total =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (!out.ok()) {
      std::fprintf(stderr, "gpu_node_benchmark: user %llu: %s\n",
                   static_cast<unsigned long long>(user), out.status().ToString().c_str());
      return false;
    }
    if (s != nullptr) {
      *s = {total,
            absl::ToDoubleSeconds(out->compute_seconds),
            absl::ToDoubleSeconds(out->fetch_seconds),
            absl::ToDoubleSeconds(out->emb_seconds),
            absl::ToDoubleSeconds(out->copy_seconds),
            absl::ToDoubleSeconds(out->kv_seconds),
            out->emb_hits + out->emb_misses};
    }
    return true;
  };

  std::printf("gpu_node_benchmark on %s: %u layers, D %u, %u candidates, %u requests a class%s\n",
              device.c_str(), layers, kDim, kCandidates, requests,
              on_gpu ? "" : " (no model: the host's work alone)");
  std::printf("%-6s %-8s %9s %9s %9s %9s %9s %9s %9s %8s\n", "L", "class", "p50 ms", "p90 ms",
              "model", "emb", "fetch", "copy", "kv", "rows");
  std::vector<Sample> all;
  std::vector<std::string> csv;
  uint64_t user = 1;
  for (uint32_t length : {1000u, 4000u, 15000u}) {
    for (double share : {1.0, 0.1, 0.01}) {
      const bool cold = share == 1.0;
      const uint32_t fresh =
          cold ? length : std::max<uint32_t>(1, static_cast<uint32_t>(length * share + 0.5));
      std::vector<Sample> samples;
      for (uint32_t r = 0; r < requests; ++r, ++user) {
        std::vector<uint64_t> history = events(length);
        const std::vector<uint64_t> cand = events(kCandidates);
        if (!cold) {
          const std::vector<uint64_t> prefix(history.begin(),
                                             history.end() - 2 * static_cast<ptrdiff_t>(fresh));
          if (!infer(user, prefix, cand, nullptr)) return 1;
        }
        Sample s{};
        if (!infer(user, history, cand, &s)) return 1;
        samples.push_back(s);
        all.push_back(s);
      }
      auto med = [&](double Sample::*f) {
        std::vector<double> v;
        for (const Sample& s : samples) v.push_back(s.*f);
        return Quantile(v, 0.5) * 1e3;
      };
      std::vector<double> totals, rows;
      for (const Sample& s : samples) {
        totals.push_back(s.total);
        rows.push_back(static_cast<double>(s.rows));
      }
      const std::string cls = cold ? "cold" : absl::StrCat("new ", share * 100, "%");
      std::printf("%-6u %-8s %9.3f %9.3f %9.3f %9.3f %9.3f %9.3f %9.3f %8.0f\n", length,
                  cls.c_str(), Quantile(totals, 0.5) * 1e3, Quantile(totals, 0.9) * 1e3,
                  med(&Sample::model), med(&Sample::emb), med(&Sample::fetch), med(&Sample::copy),
                  med(&Sample::kv), Quantile(rows, 0.5));
      const std::string key = absl::StrCat("L", length, cold ? "_cold" : "_new");
      csv.push_back(absl::StrCat(key, cold ? "" : absl::StrCat(share * 100), "_p50_ms,",
                                 Quantile(totals, 0.5) * 1e3, ",ms,\"Node::InferSync, median\""));
      csv.push_back(absl::StrCat(key, cold ? "" : absl::StrCat(share * 100), "_model_p50_ms,",
                                 med(&Sample::model), ",ms,\"the model step, median\""));
    }
  }
  // The twin's host work per request: latency − model − fetch = a + b · rows, by least squares on
  // the relative error (weights 1/y², as hlem_cuda_model fits the step), so the small returning
  // requests count as much as the cold ones.
  double sw = 0, sx = 0, sy = 0, sxx = 0, sxy = 0;
  for (const Sample& s : all) {
    const double x = static_cast<double>(s.rows), y = s.total - s.model - s.fetch;
    const double w = 1 / (y * y);
    sw += w, sx += w * x, sy += w * y, sxx += w * x * x, sxy += w * x * y;
  }
  const double det = sw * sxx - sx * sx;
  const double b = det > 0 ? (sw * sxy - sx * sy) / det : 0, a = (sy - b * sx) / sw;
  double worst = 0;
  for (const Sample& s : all) {
    const double y = s.total - s.model - s.fetch;
    worst = std::max(worst, std::abs(a + b * static_cast<double>(s.rows) - y) / y);
  }
  std::printf(
      "host work per request (latency - model - fetch) = %.1f us + %.1f ns x distinct rows "
      "(least squares on relative error over %zu requests; largest error %.0f %%)\n",
      a * 1e6, b * 1e9, all.size(), 100 * worst);
  if (!costs_out.empty()) {
    const std::string path = costs_out + "/" + cuda::DeviceSlug(device) + "-node.csv";
    std::FILE* f = std::fopen(path.c_str(), "w");
    if (f == nullptr) {
      std::fprintf(stderr, "gpu_node_benchmark: cannot write %s\n", path.c_str());
      return 1;
    }
    std::fprintf(f, "# measured by gpu_node_benchmark (scripts/gpu-check.sh) on %s\n",
                 device.c_str());
    std::fprintf(f, "metric,value,unit,note\n");
    std::fprintf(f, "twin_request_overhead_us,%.6g,us,\"fit: latency - model - fetch\"\n", a * 1e6);
    std::fprintf(f, "twin_lookup_per_row_ns,%.6g,ns,\"fit: per distinct row looked up\"\n",
                 b * 1e9);
    std::fprintf(f, "twin_host_fit_largest_error,%.4g,ratio,\"over every timed request\"\n", worst);
    for (const std::string& line : csv) std::fprintf(f, "%s\n", line.c_str());
    std::fclose(f);
    std::printf("wrote %s\n", path.c_str());
  }
  return 0;
}

}  // namespace
}  // namespace hlem::bench

int main(int argc, char** argv) { return hlem::bench::Run(argc, argv); }
