#include "sim/twin/cost_model.h"

#include <fstream>
#include <sstream>

#include <algorithm>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/config.h"
#include "common/rng.h"

namespace hlem::sim {

absl::StatusOr<CostModel> ParseCostModel(const std::string& yaml_text) {
  absl::StatusOr<YAML::Node> root = ParseYaml(yaml_text);
  if (!root.ok()) return root.status();
  CostModel c;
  ConfigReader r(*root, "costs");
  const absl::Duration second = absl::Seconds(1);
  uint64_t units = c.compute_units, kv_bytes = c.kv_dtype_bytes;
  r.String("device", &c.device, true)
      .String("source", &c.source, true)
      .Double("flops_per_second", &c.flops_per_second, 1e6, 1e18, true)
      .Duration("step_overhead", &c.step_overhead, absl::ZeroDuration(), second)
      .Duration("request_overhead", &c.request_overhead, absl::ZeroDuration(), second)
      .Duration("lookup_per_row", &c.lookup_per_row, absl::ZeroDuration(), absl::Milliseconds(1))
      .Duration("fetch_overhead", &c.fetch_overhead, absl::ZeroDuration(), second)
      .Duration("fetch_per_row", &c.fetch_per_row, absl::ZeroDuration(), absl::Milliseconds(1))
      .Duration("copy_overhead", &c.copy_overhead, absl::ZeroDuration(), absl::Milliseconds(10))
      .Duration("router_overhead", &c.router_overhead, absl::ZeroDuration(), second)
      .Duration("background_cpu", &c.background_cpu, absl::ZeroDuration(), second)
      .UInt("compute_units", &units, 0, 1 << 16)
      .UInt("kv_dtype_bytes", &kv_bytes, 1, 8);
  std::vector<std::string> quantiles;
  r.StringList("slowdown_quantiles", &quantiles);
  for (size_t i = 0; i < quantiles.size(); ++i) {
    double q = 0;
    if (!absl::SimpleAtod(quantiles[i], &q) || !(q > 0 && q < 1e3) ||
        (i > 0 && q < c.slowdown_quantiles.back())) {
      r.AddError("slowdown_quantiles", absl::StrCat("item ", i, " '", quantiles[i],
                                                    "': expected positive, ascending factors"));
      break;
    }
    c.slowdown_quantiles.push_back(q);
  }
  c.compute_units = static_cast<uint32_t>(units);
  c.kv_dtype_bytes = static_cast<uint32_t>(kv_bytes);
  if (absl::Status st = r.Finish(); !st.ok()) return st;
  return c;
}

absl::StatusOr<CostModel> LoadCostModel(const std::string& path) {
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrCat("cost model file ", path, " cannot be read"));
  std::stringstream text;
  text << in.rdbuf();
  absl::StatusOr<CostModel> costs = ParseCostModel(text.str());
  if (!costs.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": ", costs.status().message()));
  }
  return costs;
}

double CostModel::Slowdown(uint64_t user, uint64_t prior_events) const {
  const size_t n = slowdown_quantiles.size();
  if (n == 0) return 1.0;
  const double u = static_cast<double>(KeyedHash(0x736c6f77ULL, user, prior_events) >> 11) /
                   static_cast<double>(uint64_t{1} << 53);
  const double at = std::clamp(u * static_cast<double>(n) - 0.5, 0.0, static_cast<double>(n - 1));
  const auto lo = static_cast<size_t>(at);
  const size_t hi = std::min(lo + 1, n - 1);
  return slowdown_quantiles[lo] +
         (at - static_cast<double>(lo)) * (slowdown_quantiles[hi] - slowdown_quantiles[lo]);
}

std::string CostModelYaml(const CostModel& c) {
  auto d = [](absl::Duration x) { return absl::FormatDuration(x); };
  return absl::StrCat(
      "device: \"", c.device, "\"\nsource: \"", c.source,
      "\"\nflops_per_second: ", absl::StrFormat("%.6g", c.flops_per_second),
      "\nstep_overhead: ", d(c.step_overhead), "\nrequest_overhead: ", d(c.request_overhead),
      "\nlookup_per_row: ", d(c.lookup_per_row), "\nfetch_overhead: ", d(c.fetch_overhead),
      "\nfetch_per_row: ", d(c.fetch_per_row), "\ncopy_overhead: ", d(c.copy_overhead),
      "\nrouter_overhead: ", d(c.router_overhead), "\nbackground_cpu: ", d(c.background_cpu),
      "\ncompute_units: ", c.compute_units, "\nkv_dtype_bytes: ", c.kv_dtype_bytes,
      "\nslowdown_quantiles: [",
      absl::StrJoin(c.slowdown_quantiles, ", ",
                    [](std::string* out, double q) { absl::StrAppendFormat(out, "%.4g", q); }),
      "]\n");
}

}  // namespace hlem::sim
