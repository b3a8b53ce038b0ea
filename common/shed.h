#pragma once
// A serving node's two ways of shedding a request under overload, both RESOURCE_EXHAUSTED, and
// how the difference crosses the wire (docs/reliability.md, "Overload"):
//   - at admission: the node refused the request at once (its queue full or behind): another
//     node may well take it, and the router retries it there;
//   - late: the request waited in the node's queue past queue.max_delay and was taken out
//     unserved. It has spent its time; sent elsewhere it would wait in a second queue and be
//     answered past any SLO, with capacity the cluster lacks. The router does not retry it.
// In the cores the mark is a payload on the absl::Status; across gRPC it is trailing metadata
// (the status's payloads do not cross). Header-only; no state.

#include "absl/status/status.h"
#include "absl/strings/cord.h"
#include "absl/strings/string_view.h"

namespace hlem {

inline constexpr absl::string_view kShedLatePayloadUrl = "type.hlem.dev/shed";
// Trailing metadata of a node's answer: "hlem-shed: late".
inline constexpr char kShedMetadataKey[] = "hlem-shed";
inline constexpr char kShedLateValue[] = "late";

// RESOURCE_EXHAUSTED with `message`, marked as shed late.
inline absl::Status ShedLateError(absl::string_view message) {
  absl::Status st = absl::ResourceExhaustedError(message);
  st.SetPayload(kShedLatePayloadUrl, absl::Cord(kShedLateValue));
  return st;
}

// `status` is a late shed (RESOURCE_EXHAUSTED carrying the mark).
inline bool IsShedLate(const absl::Status& status) {
  if (status.code() != absl::StatusCode::kResourceExhausted) return false;
  const auto mark = status.GetPayload(kShedLatePayloadUrl);
  return mark.has_value() && *mark == kShedLateValue;
}

// Marks `status` as shed late when it is RESOURCE_EXHAUSTED (a status read back from the wire
// with the metadata set); leaves any other status as it is.
inline absl::Status MarkShedLate(absl::Status status) {
  if (status.code() == absl::StatusCode::kResourceExhausted) {
    status.SetPayload(kShedLatePayloadUrl, absl::Cord(kShedLateValue));
  }
  return status;
}

}  // namespace hlem
