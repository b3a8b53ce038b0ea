#pragma once
// The synthetic GR workload (ARCHITECTURE §8, issue 6): users with item locality, growing
// histories, candidates, Poisson arrivals and the paper's three regimes. No I/O here: the generator
// streams requests; trace.h writes and reads them; stats.h measures what a trace contains.
//
// Items are feature 0's table. They form `communities` runs of contiguous ids, each a whole number
// of residency shards (community_rows = items ÷ communities, a multiple of residency_shard_rows).
// Community popularity is Zipf(community_zipf) over a seeded permutation of the communities; item
// popularity inside a community is Zipf(item_zipf) over its rows in id order. A user has 1–3 home
// communities (drawn by popularity) and draws each event from them with probability home_share,
// otherwise from the whole catalogue (community by popularity, then item by popularity). Every
// other feature of an event is derived from its item, keeping the locality: the same fraction of
// the way through that feature's table as the item's community is through the catalogue, plus a
// keyed offset inside the community's slice.
//
// Users: a hot set of `hot_users` (ids 1..hot_users, Zipf(hot_user_zipf) inside) and a long tail
// (ids hot_users+1..users, uniform). Each request is a returning user's with probability p_hot(t)
// of the regime in force: a hot-set user if the Zipf draw names one active in the last
// `hot_windows` windows, else the user of a random request of those windows (activity-weighted);
// otherwise it is a tail user not active in them. So the trace's hot-user ratio (ARCHITECTURE §3:
// requests whose user had one in this or the previous hot_windows windows) follows p_hot once the
// first hot_windows windows have passed. A user's first request carries its whole history
// (history_min..history_max events × history_scale, keyed by the user); each later one the events
// added since (Poisson with mean new_events_mean, at least 1). Candidates: `candidates` items, a
// share popular_candidate_share drawn by popularity from the whole catalogue, the rest uniform.
//
// Event j of user u and the user's home communities are keyed by (seed, u, j): the same seed gives
// the same trace byte for byte, and two configs that differ only in the regime see the same
// users' histories (common random numbers).
//
// Regimes (phases run in sequence; `window` is the decision window):
//   steady  p_hot = hot_ratio;
//   trend   p_hot moves linearly from hot_ratio to hot_ratio_end over the phase;
//   burst   p_hot = hot_ratio, except during spikes (Poisson, bursts_per_hour) lasting
//           burst_min_windows..burst_max_windows windows at burst_ratio; a phase holds at
//           least one (placed uniformly when the Poisson draw gives none).

#include <cstdint>
#include <deque>
#include <memory>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/inlined_vector.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/rng.h"
#include "common/zipf.h"

namespace hlem::sim {

struct FeatureTable {
  std::string name;
  uint32_t table_id = 0;
  uint64_t rows = 0;
};

enum class Regime : uint8_t { kSteady, kTrend, kBurst };
const char* RegimeName(Regime regime);

struct Phase {
  Regime regime = Regime::kSteady;
  absl::Duration duration = absl::Minutes(5);
  double hot_ratio = 0.2;
  double hot_ratio_end = 0.5;  // trend
  double burst_ratio = 0.5;    // burst
  double bursts_per_hour = 20;
  uint32_t burst_min_windows = 3, burst_max_windows = 5;
};

// Bumped whenever a config generates other requests than before (1: the first; 2: every burst
// phase holds a spike). Tools that cache traces by their config key them by it too.
inline constexpr int kGeneratorVersion = 2;
// The most ids (events or candidates × features) one request may carry: 16 Mi ids, 128 MiB. The
// paper's longest history (15 000 events) is far under it. Configs that could exceed it are
// refused, writers refuse such requests, and readers refuse such records before allocating.
inline constexpr uint64_t kMaxRequestIds = uint64_t{1} << 24;

struct WorkloadConfig {
  uint64_t seed = 1;
  // Feature tables, feature 0 = items. Default: item (1 Mi rows) and category (4 096 rows).
  std::vector<FeatureTable> features = {{"item", 0, 1 << 20}, {"category", 1, 4096}};
  uint32_t communities = 256;  // >= 64
  uint64_t residency_shard_rows = 4096;
  double item_zipf = 1.0;
  double community_zipf = 0.8;
  uint64_t users = 1'000'000;
  uint64_t hot_users = 5000;
  double hot_user_zipf = 0.8;
  uint32_t hot_windows = 12;  // the horizon of "returning" (ARCHITECTURE §3)
  uint32_t min_home = 1, max_home = 3;
  double home_share = 0.9;  // >= 0.8
  uint32_t history_min = 5000, history_max = 15000;
  double history_scale = 1.0;  // the profile's factor (local: histories scaled down)
  double new_events_mean = 8;
  uint32_t candidates = 100;
  double popular_candidate_share = 0.5;
  double rate = 50;  // requests per second (Poisson)
  absl::Duration window = absl::Seconds(5);
  std::vector<Phase> phases = {Phase{}};
};

// INVALID_ARGUMENT naming the field ("workload.communities: ...").
absl::Status Validate(const WorkloadConfig& config);
// The most events one generated request carries: a first visit's longest history
// (history_max × history_scale), or a returning visit's new events (Poisson: mean + 10 standard
// deviations + 100, never reached in practice). Validate keeps it × features under kMaxRequestIds.
uint64_t MaxEventsPerRequest(const WorkloadConfig& c);
// From YAML (every field optional; see deploy/local/workload.yaml); errors name the field.
absl::StatusOr<WorkloadConfig> ParseWorkloadConfig(const std::string& yaml_text);
// The config as YAML that ParseWorkloadConfig reads back to the same config (for trace headers).
std::string WorkloadConfigYaml(const WorkloadConfig& config);

// One request as the trace holds it: the user's events since its previous request (all of them
// on its first), feature-major per event (event e's feature f at new_events[e · F + f]).
struct TraceRequest {
  uint64_t t_ns = 0;  // since the trace's start
  uint64_t user = 0;
  uint64_t prior_events = 0;  // events the user sent before this request
  std::vector<uint64_t> new_events;
  std::vector<uint64_t> candidates;
  // Events the request has beyond new_events, left out for the simulator to sketch (a first
  // visit read with TraceReader::OmitFirstVisits; sim/workload/history_sketch.h): its events are
  // prior_events … + omitted_events − 1, then new_events. 0 everywhere else.
  uint64_t omitted_events = 0;
  bool operator==(const TraceRequest&) const = default;
};

class WorkloadGenerator {
 public:
  static absl::StatusOr<std::unique_ptr<WorkloadGenerator>> Create(const WorkloadConfig& config);

  // Which requests' events Next draws; the others get new_events empty and omitted_events
  // counting them. kNone is what a trace of generated events stores (its reader draws them
  // again); kReturning is what TraceReader::OmitFirstVisits reads (first visits left for the
  // simulator to sketch). The other fields are the same whichever is chosen.
  enum class Events { kAll, kNone, kReturning };
  // The next request in time order; false after the last phase ends.
  bool Next(TraceRequest* out, Events events = Events::kAll);

  const WorkloadConfig& config() const { return config_; }
  uint64_t duration_ns() const { return end_ns_; }
  // p_hot at time t (the regime in force), for reports and tests.
  double HotProbability(uint64_t t_ns) const;
  // The residency shard of (feature f's table, row).
  uint64_t ShardOf(uint64_t row) const { return row / config_.residency_shard_rows; }
  // Appends the feature ids of event `event` (0-based, oldest first) of `user`'s history: what
  // the trace carried for it (keyed, so the simulator regenerates a user's old events instead
  // of keeping them).
  void AppendEventOf(uint64_t user, uint64_t event, std::vector<uint64_t>* out) const {
    AppendEventsOf(user, event, 1, out);
  }
  // Events first … first + count − 1 of `user`, as AppendEventOf each (the user's home
  // communities drawn once).
  void AppendEventsOf(uint64_t user, uint64_t first, uint64_t count,
                      std::vector<uint64_t>* out) const;
  // Events first … first + count − 1 of `user`, each as far as its item's community:
  // fn(event, community, rng), with `rng` the event's keyed stream right after the community's
  // draw, where AppendEventsOf goes on to draw the item's rank (the simulator's history sketches
  // draw from it instead: sim/workload/history_sketch.h). The same communities as AppendEventsOf.
  template <typename Fn>
  void ForEachEventCommunity(uint64_t user, uint64_t first, uint64_t count, Fn&& fn) const {
    if (count == 0) return;
    const Homes homes = HomesOf(user);
    for (uint64_t j = first; j < first + count; ++j) {
      SplitMix64 rng(KeyedHash(config_.seed, user, j));
      fn(j, CommunityOf(rng, homes), rng);
    }
  }

  // A user's home communities (1 to 3, drawn by popularity; a community may repeat), and the
  // community of a popularity rank (rank 0 the most popular; ranks are Zipf(community_zipf)): an
  // event's community is a home, uniformly, with probability home_share, else a popular one (for
  // history sketches, which draw counts, not events).
  using Homes = absl::InlinedVector<uint32_t, 3>;
  Homes HomesOf(uint64_t user) const;
  uint32_t CommunityByRank(uint32_t rank) const { return community_by_rank_[rank]; }

  // The item model, for history sketches: community c holds items c · community_rows() …
  // (c + 1) · community_rows() − 1, ranked by id; item_zipf() draws the rank.
  uint64_t community_rows() const { return community_rows_; }
  const ZipfSampler& item_zipf() const { return item_zipf_; }
  // Feature f's (f >= 1) row of an item of community c (what the events carry).
  uint64_t DerivedRow(size_t f, uint64_t item, uint32_t community) const {
    return Derived(f, {item, community});
  }
  // Feature f's (f >= 1) rows of community c: DerivedRow is within [first, first + count).
  std::pair<uint64_t, uint64_t> DerivedRange(size_t f, uint32_t community) const {
    const DerivedTable& d = derived_[f];
    const uint64_t first = d.base[community];
    return {first, std::min(d.slice, d.last_row - first + 1)};
  }

 private:
  explicit WorkloadGenerator(const WorkloadConfig& config);
  // The community of an event's item (its first draws from the event's stream).
  uint32_t CommunityOf(SplitMix64& rng, const Homes& homes) const;
  struct Drawn {  // an item and its community
    uint64_t item = 0, community = 0;
  };
  Drawn Item(uint64_t user, uint64_t event, const Homes& homes) const;
  Drawn PopularItem(SplitMix64& rng) const;
  uint64_t Derived(size_t feature, Drawn item) const;
  void AppendEvent(Drawn item, std::vector<uint64_t>* out) const;
  void PlanBursts();
  bool Recent(uint64_t user) const;
  uint64_t PickUser();

  const WorkloadConfig config_;
  const size_t F_;
  const uint64_t community_rows_;
  std::vector<uint32_t> community_by_rank_;  // popularity rank -> community
  struct DerivedTable {
    std::vector<uint64_t> base;  // community -> its first row
    uint64_t slice = 1, last_row = 0;
  };
  std::vector<DerivedTable> derived_;  // per feature (feature 0, the item, unused)
  ZipfSampler community_zipf_, item_zipf_, hot_zipf_;
  uint64_t end_ns_ = 0;
  std::vector<uint64_t> phase_end_ns_;
  std::vector<std::pair<uint64_t, uint64_t>> bursts_;  // [start, end) ns
  Rng arrivals_, users_, candidates_;
  uint64_t now_ns_ = 0;
  uint64_t horizon_ns_ = 0;                            // hot_windows windows
  absl::flat_hash_map<uint64_t, uint64_t> sent_;       // user -> events sent so far
  absl::flat_hash_map<uint64_t, uint64_t> last_seen_;  // user -> t of its last request
  std::deque<std::pair<uint64_t, uint64_t>> recent_;   // (t, user) of the horizon's requests
};

}  // namespace hlem::sim
