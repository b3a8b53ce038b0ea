#include "sim/twin/cost_model.h"

#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/config.h"

namespace hlem::sim {

absl::StatusOr<CostModel> ParseCostModel(const std::string& yaml_text) {
  absl::StatusOr<YAML::Node> root = ParseYaml(yaml_text);
  if (!root.ok()) return root.status();
  CostModel c;
  ConfigReader r(*root, "costs");
  const absl::Duration second = absl::Seconds(1);
  uint64_t units = c.compute_units;
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
      .UInt("compute_units", &units, 0, 1 << 16);
  c.compute_units = static_cast<uint32_t>(units);
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

std::string CostModelYaml(const CostModel& c) {
  auto d = [](absl::Duration x) { return absl::FormatDuration(x); };
  return absl::StrCat(
      "device: \"", c.device, "\"\nsource: \"", c.source,
      "\"\nflops_per_second: ", absl::StrFormat("%.6g", c.flops_per_second),
      "\nstep_overhead: ", d(c.step_overhead), "\nrequest_overhead: ", d(c.request_overhead),
      "\nlookup_per_row: ", d(c.lookup_per_row), "\nfetch_overhead: ", d(c.fetch_overhead),
      "\nfetch_per_row: ", d(c.fetch_per_row), "\ncopy_overhead: ", d(c.copy_overhead),
      "\nrouter_overhead: ", d(c.router_overhead), "\ncompute_units: ", c.compute_units, "\n");
}

}  // namespace hlem::sim
