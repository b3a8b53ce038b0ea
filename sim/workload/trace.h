#pragma once
// The trace file: a workload written once and replayed many times (the load generator, the
// simulator). Little-endian, versioned, self-describing:
//
//   header   "HLEMTRC1" · u32 version (3) · u32 F (features per event) · u64 seed ·
//            u64 duration_ns · u32 n · n bytes of generator config (YAML, WorkloadConfigYaml) ·
//            F × (u32 table_id · u64 rows · u32 n · n bytes of name) ·
//            u8 events (0 explicit, 1 generated; absent in version 1, which is explicit) ·
//            u32 generator version (kGeneratorVersion of the writer; from version 3)
//   records  u8 1 · then LEB128 varints: t_ns − previous t_ns · user · prior_events ·
//            new events E · [explicit: E·F feature ids] · candidates C · C·F feature ids
//   footer   u8 0 · u64 record count · u64 FNV-1a of every header (version 2) and record byte
//            (tags included)
//
// A request carries only the events its user added since its previous request (the whole
// history on its first); a reader that wants full histories keeps them per user. In a
// `generated` trace the records hold only E: the events are the header's generator's events
// prior_events … prior_events + E − 1 of the user (WorkloadGenerator::AppendEventOf, keyed by
// seed, user and event), which the reader regenerates — a first visit of the paper profile
// carries 10 000 events, and explicit traces of it grow by ~60 KB a request. Explicit traces are
// for workloads from elsewhere. The reader checks the magic, the version, every record's shape
// and the footer's count and hash, so a truncated or corrupted file is an error, not a short
// trace. Readers take versions 1 to 3. A generated trace written by another generator version
// is refused (FAILED_PRECONDITION): this build would regenerate other events than the writer's.
// Version 2 did not record it; its generated traces are read as they are.

#include <cstdint>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "sim/workload/workload.h"

namespace hlem::sim {

inline constexpr uint32_t kTraceVersion = 3;

struct TraceHeader {
  uint32_t version = kTraceVersion;
  uint64_t seed = 0;
  uint64_t duration_ns = 0;
  std::string config_yaml;
  std::vector<FeatureTable> features;
  // The records leave the events out; the reader regenerates them from config_yaml.
  bool generated_events = false;
  // The writer's kGeneratorVersion, as read back (0: version 1 or 2, not recorded). Writers
  // always write their own build's.
  uint32_t generator_version = kGeneratorVersion;
};

class TraceWriter {
 public:
  // UNAVAILABLE when the file cannot be created.
  static absl::StatusOr<std::unique_ptr<TraceWriter>> Create(const std::string& path,
                                                             const TraceHeader& header);
  ~TraceWriter();
  // INVALID_ARGUMENT when the request's ids are not a multiple of F or it goes back in time, or
  // when it has omitted_events and the trace stores explicit events. A trace of generated events
  // stores the count omitted_events + new_events (its reader draws the events again).
  absl::Status Append(const TraceRequest& request);
  // Writes the footer and closes; UNAVAILABLE on a write error. Required: a trace without its
  // footer does not read back.
  absl::Status Finish();
  uint64_t records() const { return count_; }

 private:
  TraceWriter(std::ofstream out, size_t features, bool generated)
      : out_(std::move(out)), F_(features), generated_(generated) {}
  void Hash(const std::string& bytes);
  std::ofstream out_;
  const size_t F_;
  const bool generated_;
  std::string buf_;
  uint64_t count_ = 0, hash_ = 0xcbf29ce484222325ULL, last_t_ = 0;
  bool finished_ = false;
};

class TraceReader {
 public:
  // NOT_FOUND for a missing file; INVALID_ARGUMENT (naming the problem) for another format.
  static absl::StatusOr<std::unique_ptr<TraceReader>> Open(const std::string& path);
  const TraceHeader& header() const { return header_; }
  // The next request: true, or false at the end (after checking the footer); INVALID_ARGUMENT
  // for a corrupt or truncated file.
  absl::StatusOr<bool> Next(TraceRequest* out);
  uint64_t records() const { return count_; }
  // A generated trace's first visits come without their events (TraceRequest::omitted_events),
  // for the simulator's sketched histories: their regeneration is most of a paper-scale replay.
  // Explicit traces carry their events as they are.
  void OmitFirstVisits(bool omit) { omit_first_visits_ = omit; }

 private:
  explicit TraceReader(std::ifstream in) : in_(std::move(in)) {}
  bool Byte(uint8_t* b);
  bool Varint(uint64_t* v);
  bool Fixed(void* p, size_t n);
  absl::Status Ids(uint64_t n, std::vector<uint64_t>* out);
  // INVALID_ARGUMENT when n events or candidates of F ids each would pass kMaxRequestIds.
  absl::Status CheckIdCount(uint64_t n) const;

  std::ifstream in_;
  std::unique_ptr<WorkloadGenerator> events_;  // a generated trace's events
  uint64_t max_events_ = 0;                    // per record, with events_
  std::vector<char> buf_ = std::vector<char>(1 << 20);
  size_t pos_ = 0, len_ = 0;
  bool hashing_ = false;
  TraceHeader header_;
  uint64_t count_ = 0, hash_ = 0xcbf29ce484222325ULL, last_t_ = 0;
  bool done_ = false;
  bool omit_first_visits_ = false;
};

// Writes every request of `generator` to `path`; returns the record count. `generated_events`:
// the records leave the events out (the compact form; see the format above).
absl::StatusOr<uint64_t> WriteTrace(WorkloadGenerator& generator, const std::string& path,
                                    bool generated_events = true);

}  // namespace hlem::sim
