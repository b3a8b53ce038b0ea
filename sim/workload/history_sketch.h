#pragma once
// Sketched histories (docs/simulator.md, "Sketched histories"): what the digital twin needs of a
// run of a user's events when its EMB cache tracks 1 in `every` rows (SimNodeOptions::emb_sample),
// without drawing every event's rows. A first visit of the paper profile carries 10 000 events;
// row by row the twin generates, dedups, hashes and profiles all of them to keep the ≈ 40 that
// its sampled cache sees (docs/simulator.md, Speed).
//
// The events' communities: whole blocks of kBlock (256) events, keyed by user and block, by
// their counts (home events ~ Binomial(256, home_share), split evenly among the user's homes; the
// rest by community popularity); the events before the first whole block and after the last one
// by one with the generator's own draws (WorkloadGenerator::ForEachEventCommunity: the same
// community as the row-level event). Then per community and feature, how many of its m events use
// a sampled row (Binomial(m, q), q the community's sampled probability; per event, one uniform),
// each drawn from the sampled rows' conditional distribution. So a history's sampled rows have
// the row-level model's distribution (not its draws), and ranges cut at whole blocks give the same
// rows (a returning user's regenerated history uses its first visit's rows). What the twin needs
// beyond them comes from the events' community counts m_c:
//   - expected distinct rows (sampled or not): Σ_c D_c(m_c), D_c(m) = Σ_rows 1 − (1 − p_r)^m over
//     the community's row probabilities (tabulated for every m up to 32 and then every 20 %,
//     interpolated linearly);
//   - expected events per residency shard (the router's profile): m_c × the community's shares.
// Item ranks below head_ranks are treated row by row; the rest of a community's items (the
// paper's communities hold 589 824) by their total: a tail event is sampled with probability
// tail mass ÷ every, and its row is the sampled row (EmbSampledRowOf) of a sampling group drawn
// by the continuous Zipf density, kept ∝ the row's own mass (rejection, ≈ 1 attempt). Derived
// features: the rows of the first kDerivedHead item ranks exactly, the
// rest of the mass spread evenly over the community's slice.

#include <array>
#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "common/rng.h"
#include "sim/workload/workload.h"

namespace hlem::sim {

inline constexpr uint64_t kEmbSampleKey = 0x73616d706c65ULL;  // "sample"
// The twin's EMB sampling rule (stratified spatial sampling): of each aligned group of `every`
// rows (rows g·every … g·every + every − 1 of a table), exactly one, at a keyed-hash offset, is a
// row its cache tracks. Each row is sampled with probability 1/every, as with a per-row hash, but
// the sampled rows of a range can be listed with one hash per group.
inline uint64_t EmbSampledRowOf(uint32_t table, uint64_t group, uint32_t every) {
  return group * every + KeyedHash(kEmbSampleKey, table, group) % every;
}
inline bool EmbSampled(uint32_t table, uint64_t row, uint32_t every) {
  return every <= 1 || EmbSampledRowOf(table, row / every, every) == row;
}

struct HistorySketch {
  uint64_t events = 0;
  struct Feature {
    std::vector<uint64_t> sampled;  // sampled rows the events use, event by event (repeats kept)
    double distinct = 0;            // expected distinct rows the events use, sampled or not
  };
  std::vector<Feature> features;
  struct Shard {
    uint32_t feature = 0;
    uint64_t shard = 0;  // row ÷ the feature's residency shard rows
    double events = 0;   // expected events whose feature row lies in it
  };
  // In no particular order. A shard whose expected events round to 0 may be left out.
  std::vector<Shard> shards;
};

struct HistorySketchOptions {
  uint32_t every = 256;              // the twin's emb_sample (>= 2)
  std::vector<uint32_t> table_ids;   // per feature: the table the sampling rule hashes
  std::vector<uint64_t> shard_rows;  // per feature: the router's residency shard size
  uint32_t head_ranks = 65536;       // item ranks treated row by row
  uint32_t memo = 1024;              // recent sketches kept (the router's and the node's ask twice)
};

class HistorySketcher {
 public:
  // INVALID_ARGUMENT naming the option (sizes that do not match the generator's features, a
  // derived feature's community slice over 65 536 rows).
  static absl::StatusOr<std::unique_ptr<HistorySketcher>> Create(
      const WorkloadGenerator& events, const HistorySketchOptions& options);
  ~HistorySketcher();

  // Events first … first + count − 1 of `user`. The reference stays valid until the next call.
  // Not thread-safe: fills per-community tables on first use.
  const HistorySketch& Sketch(uint64_t user, uint64_t first, uint64_t count);

  const HistorySketchOptions& options() const { return options_; }
  // Expected distinct rows of feature f among m events of community c (for tests).
  double ExpectedDistinct(size_t f, uint32_t community, uint64_t m);

 private:
  struct Conditional;
  struct ShardShare;
  struct Community;
  class Binomial;
  using Homes = WorkloadGenerator::Homes;
  static constexpr uint32_t kBlock = 256;  // events a block sketches by their counts
  void Touch(uint32_t community, uint32_t events);
  void SketchEvents(uint64_t user, uint64_t first, uint64_t count, HistorySketch& out);
  void SketchBlock(uint64_t user, uint64_t block, const Homes& homes, HistorySketch& out);
  HistorySketcher(const WorkloadGenerator& events, const HistorySketchOptions& options);
  void Build();
  Community& Tables(uint32_t community);
  uint64_t Draw(const Conditional& c, uint32_t community, SplitMix64& rng) const;
  double Mass(double a, double b) const;  // ∫_a^b x^-s dx
  double PowerSum(uint64_t n) const;      // Σ_{k=1..n} k^-s
  double ItemP(uint64_t r) const;         // an item's probability by 0-based rank
  double Interpolate(const std::vector<double>& grid, uint64_t m) const;
  // Feature f's (>= 1) expected distinct rows of m events of community c (built tables).
  double DerivedDistinct(uint32_t c, size_t f, uint64_t m);
  // D(m) on grid_m_ for rows in classes of (probability, rows of it).
  // (The first `points` of them, the rest 0; past the point where every row with p > 0 is in,
  // to 1e-12, that value.)
  std::vector<double> DistinctGrid(const std::vector<std::pair<double, double>>& classes,
                                   size_t points) const;
  // The inverse CDF of the continuous density x^-s over [a, b] (1-based ranks).
  double RankPoint(double u, double a, double b) const;

  const WorkloadGenerator& events_;
  const HistorySketchOptions options_;
  const size_t F_;
  const uint64_t N_;  // items per community
  const double s_;    // item Zipf exponent
  uint64_t head_ = 0;
  std::vector<double> prefix_;      // prefix_[n] = Σ_{k=1..n} k^-s, n <= head_
  std::vector<double> pmf_;         // rank r's probability, r < max(head_, the derived head)
  double tail_bound_ = 1;           // Draw's tail rejection bound
  std::vector<double> alias_prob_;  // popular communities by rank (Vose's alias method)
  std::vector<uint32_t> alias_;
  double H_ = 1;  // PowerSum(N_)
  std::vector<uint64_t> grid_m_;
  std::vector<double> item_distinct_;  // on grid_m_
  std::vector<std::unique_ptr<Community>> communities_;
  std::vector<double> q_;         // [community · F + f]: Conditional::q of each; < 0 until built
  std::vector<double> log_miss_;  // log(1 − q) of each
  struct Hot {                    // [community · F + f]: the tally's
    double sum_p2 = 0;            // Σ p² over the community's rows of the feature (f >= 1)
    uint32_t shared = 0;          // shards it shares with other communities
    std::pair<uint64_t, double> shared_shard{0, 0};  // the first of them, and its share
    std::pair<uint64_t, double> top_shard{0, 0};     // its largest exclusive shard, and share
    double next_share = 0;                           // the second largest exclusive share
  };
  std::vector<Hot> hot_;
  static constexpr uint32_t kSmall = 32;  // the distinct tables hold every m up to this
  std::vector<double> small_distinct_;    // [(community · F + f) · (kSmall + 1) + m], f >= 1
  double item_sum_p2_ = 0;
  std::unique_ptr<Binomial> home_, half_, third_;
  std::vector<uint32_t> block_counts_, block_touched_;
  std::vector<uint32_t> counts_, touched_;
  // Memo: recent sketches by (user, first, count), overwritten in turn.
  std::vector<HistorySketch> memo_;
  std::vector<std::array<uint64_t, 3>> memo_keys_;
  absl::flat_hash_map<std::array<uint64_t, 3>, size_t> memo_index_;
  size_t memo_next_ = 0;
  absl::flat_hash_map<std::pair<uint32_t, uint64_t>, double> shard_scratch_;
};

}  // namespace hlem::sim
