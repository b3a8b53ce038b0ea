#pragma once
// The offline-optimal α*_t of every decision window (ARCHITECTURE §8): at the start of window t
// the whole twin is forked (fork(2): a copy-on-write snapshot of the single-threaded simulation)
// once per candidate α (the trace read ahead to past the window's drain first: a child reads
// nothing from the trace's file); each child pushes its α to every node (a metadata change as the
// allocator's; the refill it starts and the KV it reclaims are part of its cost), runs to the end
// of the window and until every request sent in it has its outcome, and reports the window's
// reward and P99; every child sees the same requests (the trace) and the same state (common random
// numbers). α*_t is the best candidate: the highest reward, and among rewards that tie (within
// kRewardTie: when every α meets the SLO the reward saturates) the lowest P99. The parent then runs
// window t with the α `follow` names (α*_t itself for the oracle trajectory, or a controller's) and
// goes on. Candidates whose rewards tie go to the one nearest the α the nodes run (no move without
// a gain).
//
// Reward of a window (ARCHITECTURE §3): over the requests sent in it, the SLO-satisfied fraction
// (OK within the SLO) − max(0, P99 − SLO) ÷ SLO, where a failed request counts as never answered
// in the P99 and P99 ÷ SLO is capped at 4 (the node's p99_norm cap), so a window that fails is
// the worst, never better than one that is slow; 0 for an empty window.
//
// Search: a coarse grid (coarse_step) over [lo, hi]; when that curve has one local maximum
// (unimodal) the fine grid (fine_step) is evaluated only within one coarse step of its best, and
// the finest (finest_step) within one fine step of the fine best; otherwise the whole fine grid is
// evaluated. Every evaluated point is returned.

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "sim/twin/control.h"
#include "sim/twin/twin.h"

namespace hlem::sim {

class SearchCache;

struct OracleOptions {
  absl::Duration window = absl::Seconds(5);
  absl::Duration slo = absl::Milliseconds(25);
  double lo = 0.0, hi = 1.0;
  double coarse_step = 0.1, fine_step = 0.02, finest_step = 0.01;
  int parallel = 2;  // children at once
  // How long past a window's end a child waits for the window's last answers.
  absl::Duration drain = absl::Seconds(10);
  // TrackControlled searches α* at every search_every-th window only (a search costs about one
  // plain run of the window per candidate: ≈ 20× a plain run when every window is searched).
  uint32_t search_every = 1;
  // TrackControlled looks each search up in `cache` first (and stores what it searched), under
  // `cache_key` — which must name every input of the twin (trace, configs, costs, start α, the
  // code's commit) but not the controller — followed by the grid, t and the αs applied so far.
  // Null: every window is searched.
  std::shared_ptr<SearchCache> cache;
  std::string cache_key;
};

// A candidate α's window: the reward and the P99 (ms; infinite when over 1 % failed).
struct CurvePoint {
  double alpha = 0, reward = 0, p99_ms = 0;
};

struct WindowOracle {
  uint64_t window = 0;
  double alpha_star = 0;
  double reward_star = 0, p99_star_ms = 0;  // at α*
  double alpha_followed = 0;
  bool unimodal = true;           // the coarse curve had a single maximum of what α* maximises
  std::vector<CurvePoint> curve;  // ascending α
};

// α*_t searches already done, for TrackControlled. The twin is deterministic: its state at the
// start of window t follows from its inputs and from every α applied before t (which node, after
// which window, what α), so runs that applied the same αs so far — a static α and a policy that
// holds it, or any two controllers until they first disagree — search the same α*_t. The key is
// exact (the caller's description of the inputs, the search grid, t, and every α applied), not
// a hash; an implementation may hash it to name a file but must compare it whole.
class SearchCache {
 public:
  virtual ~SearchCache() = default;
  virtual std::optional<WindowOracle> Find(const std::string& key) = 0;
  virtual void Store(const std::string& key, const WindowOracle& found) = 0;
};

// One line of text that ParseWindowOracle reads back exactly (hexadecimal floating point), for
// SearchCache implementations that keep searches in files.
std::string FormatWindowOracle(const WindowOracle& w);
// INVALID_ARGUMENT naming what is malformed.
absl::StatusOr<WindowOracle> ParseWindowOracle(const std::string& text);

inline constexpr double kRewardP99Cap = 4.0;
// The reward from its two parts (p99: InfiniteDuration when over 1 % of the requests failed).
double Reward(double slo_satisfied, absl::Duration p99, absl::Duration slo);
// Reward and P99 of the requests sent in [from, to) (outcomes of the twin's trace so far); 0 and
// 0 for an empty window.
struct WindowScore {
  double reward = 0, p99_ms = 0;
};
WindowScore ScoreWindow(const std::vector<TwinOutcome>& outcomes, absl::Duration from,
                        absl::Duration to, absl::Duration slo);
double WindowReward(const std::vector<TwinOutcome>& outcomes, absl::Duration from,
                    absl::Duration to, absl::Duration slo);

// α*_t of the window [from, to) from the twin's state now (at `from`; started): the search above,
// in forked children. `window` only labels the result (alpha_followed is left 0). Rewards within
// kRewardTie of the best (about one request in a thousand missing the SLO) are a tie, broken by
// the lower window P99, then toward `prefer` (the α the nodes run now).
inline constexpr double kRewardTie = 1e-3;
absl::StatusOr<WindowOracle> SearchAlphaStar(Twin& twin, uint64_t window, absl::Duration from,
                                             absl::Duration to, double prefer,
                                             const OracleOptions& options);

// Runs a started twin (Twin::Start) window by window to the end of its trace. `follow(t, α*_t)`
// names the α the parent applies in window t. Does not call Finish. INTERNAL when a child
// fails.
absl::StatusOr<std::vector<WindowOracle>> WindowAlphaStar(
    Twin& twin, const OracleOptions& options,
    const std::function<double(uint64_t window, double alpha_star)>& follow);

// INVALID_ARGUMENT for a bad grid, window or parallelism.
absl::Status CheckOptions(const OracleOptions& options);

// A controller tracked against α*_t (issue 8, experiments 3 and 4): the control loop of
// control.h over `twin` (not started); at each decision point (window t ≥ 1 starts at
// t·window + delay) α*_t is searched from the controllers' own state (their α_{t−1}, the caches
// they left) before they decide, then the controllers decide and the twin runs window t with
// their α. The oracle's window is the control window. With oracle.cache, a search found there
// is not run again (SearchCache). Finish()es the twin.
struct TrackedWindow {
  uint64_t window = 0;
  double alpha_star = 0, reward_star = 0;
  double p99_star_ms = 0;  // at α*
  bool unimodal = true;
  std::vector<double> alphas;     // per node, the α the controllers run window t with
  double gap = 0;                 // mean over nodes of |α_n − α*_t|
  double reward = 0;              // the window's reward as the controllers ran it
  double p99_ms = 0;              // and its P99
  uint64_t requests = 0;          // sent in the window
  std::vector<CurvePoint> curve;  // the oracle's, ascending α
};
struct Tracked {
  std::vector<TrackedWindow> windows;  // the windows searched that had requests
  std::vector<ControlRecord> decisions;
};
absl::StatusOr<Tracked> TrackControlled(
    Twin& twin, std::function<bool(TraceRequest*)> next,
    const std::function<std::unique_ptr<allocator::Controller>()>& make,
    const ControlOptions& control, const OracleOptions& oracle);

}  // namespace hlem::sim
