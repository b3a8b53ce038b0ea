#pragma once
// Open-loop replay of a trace against the router (issue 6's load generator): request i goes out
// at start + t_i ÷ speed whatever happened to the others (async gRPC, callback API), with a
// deadline, and its outcome is recorded once: the answer, the error, or — when the client already
// has `max_in_flight` calls out — RESOURCE_EXHAUSTED without sending (the replay would otherwise
// turn closed-loop and hide the overload).
//
// Histories: the trace carries each user's new events; the replayer keeps every user's full
// history. Full mode sends it whole. Delta mode sends only the new events with the prefix the
// router's last answer named, when that answer came back OK and no other request of the user is
// out; a FAILED_PRECONDITION (the node no longer holds that prefix) is resent in full at once,
// within the same deadline, and recorded as one outcome (`resent`).

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "common/grpc_server.h"
#include "sim/workload/trace.h"
#include "tools/loadgen/summary.h"

namespace hlem::loadgen {

struct ReplayOptions {
  std::string router;      // host:port
  ChannelOptions channel;  // TLS and bearer token of the channel to the router
  double speed = 1;        // 2: twice as fast as the trace
  uint64_t limit = 0;      // requests (0: all)
  absl::Duration deadline = absl::Seconds(1);
  uint32_t max_in_flight = 4096;
  bool delta = false;
  // Called about once a second with (requests read, outcomes recorded, in flight).
  std::function<void(uint64_t, uint64_t, uint64_t)> progress;
  // Called once per outcome as it is recorded (under the replayer's lock: keep it short).
  std::function<void(const Outcome&)> on_outcome;
};

// Replays `trace` (already opened); fills `outcomes` (one per request read, in trace order).
// INVALID_ARGUMENT for bad options, the reader's error for a damaged trace (the outcomes of the
// requests sent before it are still recorded).
absl::Status Replay(sim::TraceReader& trace, const ReplayOptions& options,
                    std::vector<Outcome>* outcomes);

}  // namespace hlem::loadgen
