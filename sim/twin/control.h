#pragma once
// The allocator's control loop in the twin (ARCHITECTURE §3, issue 7): after each decision window
// closes at the nodes, every node's controller (allocator_service/core) sees that node's closed
// windows and sets its α, as the allocator service does over GetState and SetAlpha. One
// controller instance per node incarnation (controllers keep per-node state): a restarted node
// gets a fresh one, as does every node when the allocator itself restarts after a
// "kill:allocator" fault (the twin's fault plan, sim/twin/faults.h); a dead node, or a dead
// allocator, changes no α.

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "allocator_service/core/controller.h"
#include "serving_node/core/node.h"
#include "sim/twin/twin.h"

namespace hlem::sim {

// A node's closed window as the controllers see it.
allocator::WindowState ToWindowState(const serving::NodeWindow& w);

struct ControlRecord {
  uint64_t window = 0;  // the node's window index the decision followed
  uint32_t node = 0;
  double alpha = 0;
  allocator::Reason reason = allocator::Reason::kHold;
  std::string detail;
  uint64_t decide_ns = 0;  // wall time of the controller's Decide (not simulated; not hashed)
};

struct ControlOptions {
  absl::Duration window = absl::Seconds(5);      // the nodes' window (node config: node.window)
  absl::Duration delay = absl::Milliseconds(1);  // after a window closes, the decision
  size_t max_history = 64;                       // windows kept per node for the controller
};

// The loop's state: a controller per node, each node's closed windows so far and its α.
class ControlLoop {
 public:
  // INVALID_ARGUMENT for bad options or a factory that makes no controller.
  static absl::StatusOr<ControlLoop> Create(
      Twin& twin, const std::function<std::unique_ptr<allocator::Controller>()>& make,
      const ControlOptions& options);
  // Every node's controller decides on each of its windows closed since the last call (in
  // order) and its α is applied; the decisions are appended to *records.
  absl::Status Decide(std::vector<ControlRecord>* records);
  // The α each node runs with now (the last applied; the twin's start α before any decision).
  const std::vector<double>& alphas() const { return alphas_; }
  // Windows that closed while the allocator or their node was dead, never decided on.
  uint64_t undecided_windows() const { return undecided_; }

 private:
  ControlLoop(Twin& twin, ControlOptions options) : twin_(&twin), options_(options) {}
  // As a (re)started allocator meets node i (allocator_service/core/allocator.cc): a fresh
  // controller, the node's closed windows but the newest as its history, the newest next.
  void Meet(size_t i);
  Twin* twin_;
  ControlOptions options_;
  std::function<std::unique_ptr<allocator::Controller>()> make_;
  std::vector<std::unique_ptr<allocator::Controller>> controllers_;
  std::vector<uint64_t> epochs_;  // per node, the incarnation its controller belongs to (0: none)
  bool allocator_down_ = false;
  uint64_t undecided_ = 0;
  std::vector<std::vector<allocator::WindowState>> history_;
  std::vector<uint64_t> next_window_;  // per node, the first window index not yet decided on
  std::vector<double> alphas_;
};

// Replays `next` through `twin` (not started) with a controller per node from `make`, then
// Finish()es it. Returns every decision in order.
absl::StatusOr<std::vector<ControlRecord>> RunControlled(
    Twin& twin, std::function<bool(TraceRequest*)> next,
    const std::function<std::unique_ptr<allocator::Controller>()>& make,
    const ControlOptions& options);

}  // namespace hlem::sim
