// Fuzz target: the workload config parser (YAML from users: deploy/local/workload.yaml, trace
// headers). A config it accepts must validate and survive its own round trip (the YAML a trace
// header stores must read back to the same config).
#include <cstddef>
#include <cstdint>
#include <string>

#include "sim/workload/workload.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  absl::StatusOr<hlem::sim::WorkloadConfig> config = hlem::sim::ParseWorkloadConfig(text);
  if (!config.ok()) return 0;
  if (!hlem::sim::Validate(*config).ok()) __builtin_trap();  // accepted an invalid config
  const std::string yaml = hlem::sim::WorkloadConfigYaml(*config);
  absl::StatusOr<hlem::sim::WorkloadConfig> again = hlem::sim::ParseWorkloadConfig(yaml);
  if (!again.ok()) __builtin_trap();  // its own YAML does not read back
  if (hlem::sim::WorkloadConfigYaml(*again) != yaml) __builtin_trap();  // not the same config
  return 0;
}
