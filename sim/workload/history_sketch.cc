#include "sim/workload/history_sketch.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"

namespace hlem::sim {

namespace {

constexpr uint64_t kDerivedHead = 8192;       // item ranks whose derived rows are placed exactly
constexpr uint64_t kMaxDerivedSlice = 65536;  // a derived feature's rows per community
constexpr double kGridStep = 1.2;             // the distinct tables' spacing beyond m = 32
constexpr uint64_t kGridEnd = uint64_t{1} << 26;

constexpr uint64_t kBlockKey = 0x626c6f636bULL;  // "block"

double Unit(SplitMix64& g) { return static_cast<double>(g() >> 11) * 0x1.0p-53; }

// How many of m events, each with probability q (log1p(−q) given), use a sampled row: Bernoulli
// trials for a few events, else inversion from P(0) = (1 − q)^m.
uint32_t SampledCount(uint32_t m, double q, double log_miss, SplitMix64& rng) {
  if (q <= 0 || m == 0) return 0;
  if (q >= 1) return m;
  if (m <= 8) {
    uint32_t k = 0;
    for (uint32_t i = 0; i < m; ++i) k += Unit(rng) < q;
    return k;
  }
  const double u = Unit(rng), odds = q / (1 - q);
  double p = std::exp(m * log_miss), cdf = p;
  uint32_t k = 0;
  while (u > cdf && k < m) {
    p *= static_cast<double>(m - k) / static_cast<double>(k + 1) * odds;
    ++k;
    cdf += p;
  }
  return k;
}

}  // namespace

// Binomial(n, p) for n <= nmax, by inversion over precomputed CDFs.
class HistorySketcher::Binomial {
 public:
  Binomial(double p, uint32_t nmax) : p_(p), nmax_(nmax), cdf_((nmax + 1) * (nmax + 1), 1.0) {
    if (p <= 0 || p >= 1) return;
    for (uint32_t n = 0; n <= nmax; ++n) {
      double acc = 0;
      for (uint32_t k = 0; k <= n; ++k) {
        acc += std::exp(std::lgamma(n + 1.0) - std::lgamma(k + 1.0) - std::lgamma(n - k + 1.0) +
                        k * std::log(p) + (n - k) * std::log1p(-p));
        cdf_[n * (nmax + 1) + k] = acc;
      }
    }
  }
  uint32_t Draw(uint32_t n, double u) const {
    if (p_ <= 0) return 0;
    if (p_ >= 1) return n;
    const double* row = &cdf_[n * (nmax_ + 1)];
    return static_cast<uint32_t>(
        std::min<ptrdiff_t>(std::upper_bound(row, row + n + 1, u) - row, n));
  }

 private:
  double p_;
  uint32_t nmax_;
  std::vector<double> cdf_;
};

struct HistorySketcher::Conditional {
  std::vector<uint64_t> rows;  // the sampled rows placed exactly
  std::vector<double> cum;     // their cumulative probability
  double head = 0;             // cum.back()
  double q = 0;                // the probability that an event uses a sampled row
  // Items: the tail's whole sampling groups, community offsets [tail_lo, tail_hi) (q − head is
  // their mass ÷ every; Draw picks their sampled rows).
  uint64_t tail_lo = 0, tail_hi = 0;
};

struct HistorySketcher::ShardShare {
  uint64_t shard = 0;
  double share = 0;        // of the community's events
  bool exclusive = false;  // no other community has rows in it
};

struct HistorySketcher::Community {
  Conditional item;
  std::vector<ShardShare> item_shards;
  struct Derived {
    Conditional sampled;
    std::vector<double> distinct;  // on grid_m_ (up to kSmall until more is needed)
    std::vector<std::pair<double, double>> classes;  // its rows' probabilities
    std::vector<ShardShare> shards;
  };
  std::vector<Derived> derived;  // per feature ([0] unused)
};

absl::StatusOr<std::unique_ptr<HistorySketcher>> HistorySketcher::Create(
    const WorkloadGenerator& events, const HistorySketchOptions& o) {
  const size_t F = events.config().features.size();
  auto bad = [](absl::string_view field, absl::string_view message) {
    return absl::InvalidArgumentError(absl::StrCat("history sketch: ", field, ": ", message));
  };
  if (o.every < 2) return bad("every", "must be >= 2 (1 is row level: no sketch)");
  if (o.table_ids.size() != F) {
    return bad("table_ids",
               absl::StrCat(o.table_ids.size(), " given, the workload has ", F, " features"));
  }
  if (o.shard_rows.size() != F ||
      std::any_of(o.shard_rows.begin(), o.shard_rows.end(), [](uint64_t r) { return r == 0; })) {
    return bad("shard_rows", absl::StrCat("one >= 1 per feature (", F, ")"));
  }
  if (o.head_ranks < 1) return bad("head_ranks", "must be >= 1");
  if (o.memo < 1) return bad("memo", "must be >= 1");
  for (size_t f = 1; f < F; ++f) {
    if (events.DerivedRange(f, 0).second > kMaxDerivedSlice) {
      return bad(absl::StrCat("feature ", f),
                 absl::StrCat(events.DerivedRange(f, 0).second, " rows per community; at most ",
                              kMaxDerivedSlice, " are supported"));
    }
  }
  std::unique_ptr<HistorySketcher> s(new HistorySketcher(events, o));
  s->Build();
  return s;
}

HistorySketcher::HistorySketcher(const WorkloadGenerator& events, const HistorySketchOptions& o)
    : events_(events),
      options_(o),
      F_(events.config().features.size()),
      N_(events.community_rows()),
      s_(events.item_zipf().exponent()) {}

HistorySketcher::~HistorySketcher() = default;

double HistorySketcher::Mass(double a, double b) const {
  return std::abs(1 - s_) < 1e-12 ? std::log(b / a)
                                  : (std::pow(b, 1 - s_) - std::pow(a, 1 - s_)) / (1 - s_);
}

double HistorySketcher::PowerSum(uint64_t n) const {
  if (n <= head_) return prefix_[n];
  // Beyond the exact prefix: the midpoint integral of x^-s (error O(k^-s-2) per term).
  return prefix_[head_] + Mass(static_cast<double>(head_) + 0.5, static_cast<double>(n) + 0.5);
}

double HistorySketcher::ItemP(uint64_t r) const {
  if (r < head_) return pmf_[r];
  const double k = static_cast<double>(r) + 1;
  return Mass(k - 0.5, k + 0.5) / H_;
}

double HistorySketcher::RankPoint(double u, double a, double b) const {
  if (std::abs(1 - s_) < 1e-12) return a * std::exp(u * std::log(b / a));
  const double A = std::pow(a, 1 - s_), B = std::pow(b, 1 - s_);
  return std::pow(A + u * (B - A), 1 / (1 - s_));
}

std::vector<double> HistorySketcher::DistinctGrid(
    const std::vector<std::pair<double, double>>& classes, size_t points) const {
  std::vector<double> log_miss(classes.size());  // log(1 − p) per class
  double used = 0;                               // rows of classes with p > 0: D's limit
  for (size_t i = 0; i < classes.size(); ++i) {  // p rounded above 1 would make a NaN
    log_miss[i] = std::log1p(-std::clamp(classes[i].first, 0.0, 1.0));
    if (classes[i].first > 0) used += classes[i].second;
  }
  std::vector<double> out(grid_m_.size(), 0.0);
  for (size_t g = 1; g < std::min(points, grid_m_.size()); ++g) {
    const double m = static_cast<double>(grid_m_[g]);
    double d = 0;
    for (size_t i = 0; i < classes.size(); ++i) {
      d -= classes[i].second * std::expm1(m * log_miss[i]);
    }
    out[g] = d;
    if (d >= used * (1 - 1e-12)) {  // saturated: every used row is in, to 1e-12
      std::fill(out.begin() + static_cast<std::ptrdiff_t>(g) + 1, out.end(), d);
      break;
    }
  }
  return out;
}

void HistorySketcher::Build() {
  head_ = std::min<uint64_t>(N_, options_.head_ranks);
  prefix_.assign(head_ + 1, 0.0);
  for (uint64_t k = 1; k <= head_; ++k) {
    prefix_[k] = prefix_[k - 1] + std::pow(static_cast<double>(k), -s_);
  }
  H_ = PowerSum(N_);
  pmf_.resize(std::max(head_, std::min(N_, kDerivedHead)));  // the items' and derived heads
  for (uint64_t r = 0; r < pmf_.size(); ++r) {
    pmf_[r] = std::pow(static_cast<double>(r + 1), -s_) / H_;
  }
  {  // The tail draw's bound: a group's first row's mass over the group's mean, at the largest.
    const double k = static_cast<double>(head_) + 1, every = options_.every;
    tail_bound_ = Mass(k - 0.5, k + 0.5) * every / Mass(k - 0.5, k + every - 0.5);
  }
  // The popular communities' alias table (Vose): rank k with probability ∝ (k + 1)^-s.
  {
    const uint32_t C = events_.config().communities;
    const double s = events_.config().community_zipf;
    std::vector<double> p(C);
    double sum = 0;
    for (uint32_t k = 0; k < C; ++k) sum += p[k] = std::pow(k + 1.0, -s);
    std::vector<uint32_t> small, large;
    for (uint32_t k = 0; k < C; ++k) {
      p[k] *= C / sum;
      (p[k] < 1 ? small : large).push_back(k);
    }
    alias_prob_.assign(C, 1.0);
    alias_.resize(C);
    for (uint32_t k = 0; k < C; ++k) alias_[k] = k;
    while (!small.empty() && !large.empty()) {
      const uint32_t s_k = small.back(), l_k = large.back();
      small.pop_back();
      alias_prob_[s_k] = p[s_k];
      alias_[s_k] = l_k;
      p[l_k] -= 1 - p[s_k];
      if (p[l_k] < 1) {
        large.pop_back();
        small.push_back(l_k);
      }
    }
  }
  for (uint64_t m = 0; m <= kSmall; ++m) grid_m_.push_back(m);
  while (grid_m_.back() < kGridEnd) {
    grid_m_.push_back(
        static_cast<uint64_t>(std::ceil(static_cast<double>(grid_m_.back()) * kGridStep)));
  }
  // Items: the head ranks one by one, the tail in buckets of ranks ≈ 2 % apart.
  std::vector<std::pair<double, double>> classes;
  classes.reserve(head_ + 512);
  for (uint64_t r = 0; r < head_; ++r) {
    classes.emplace_back(pmf_[r], 1.0);
  }
  for (uint64_t lo = head_; lo < N_;) {
    const uint64_t hi = std::min<uint64_t>(
        N_, std::max<uint64_t>(lo + 1, static_cast<uint64_t>(static_cast<double>(lo) * 1.02)));
    const double rows = static_cast<double>(hi - lo);
    classes.emplace_back((PowerSum(hi) - PowerSum(lo)) / H_ / rows, rows);
    lo = hi;
  }
  item_distinct_ = DistinctGrid(classes, grid_m_.size());
  for (const auto& [p, rows] : classes) item_sum_p2_ += rows * p * p;
  communities_.resize(events_.config().communities);
  q_.assign(communities_.size() * F_, -1.0);
  hot_.assign(communities_.size() * F_, Hot{});
  small_distinct_.assign(communities_.size() * F_ * (kSmall + 1), 0.0);
  log_miss_.assign(communities_.size() * F_, 0.0);
  block_counts_.assign(communities_.size(), 0);
  home_ = std::make_unique<Binomial>(events_.config().home_share, kBlock);
  half_ = std::make_unique<Binomial>(0.5, kBlock);
  third_ = std::make_unique<Binomial>(1.0 / 3, kBlock);
  counts_.assign(events_.config().communities, 0);
  memo_.resize(options_.memo);
  memo_keys_.assign(options_.memo, {~uint64_t{0}, 0, 0});
}

HistorySketcher::Community& HistorySketcher::Tables(uint32_t c) {
  std::unique_ptr<Community>& slot = communities_[c];
  if (slot != nullptr) return *slot;
  slot = std::make_unique<Community>();
  Community& t = *slot;
  const uint64_t base = static_cast<uint64_t>(c) * N_;
  const uint32_t every = options_.every;
  // Items: the sampled rows of the head ranks and of the tail's partial sampling groups (at its
  // two ends) placed exactly, one hash per group; the tail's whole groups by their mass ÷ every
  // (each holds one sampled row; Draw picks it).
  uint64_t lo = N_, hi = N_;  // the whole groups' community offsets
  if (head_ < N_) {
    lo = std::min(N_, (base + head_ + every - 1) / every * every - base);
    hi = std::max(lo, (base + N_) / every * every - base);
  }
  double acc = 0;
  auto place = [&](uint64_t from, uint64_t to) {  // the sampled rows of offsets [from, to)
    for (uint64_t g = (base + from) / every; from < to && g <= (base + to - 1) / every; ++g) {
      const uint64_t row = EmbSampledRowOf(options_.table_ids[0], g, every);
      if (row < base + from || row >= base + to) continue;
      acc += ItemP(row - base);
      t.item.rows.push_back(row);
      t.item.cum.push_back(acc);
    }
  };
  place(0, lo);
  place(hi, N_);
  t.item.head = acc;
  t.item.tail_lo = lo;
  t.item.tail_hi = hi;
  t.item.q = acc + (PowerSum(hi) - PowerSum(lo)) / H_ / every;
  const uint64_t R = options_.shard_rows[0];
  for (uint64_t shard = base / R; shard <= (base + N_ - 1) / R; ++shard) {
    const uint64_t lo = std::max(base, shard * R) - base;
    const uint64_t hi = std::min(base + N_, (shard + 1) * R) - base;
    t.item_shards.push_back(
        {.shard = shard, .share = (PowerSum(hi) - PowerSum(lo)) / H_, .exclusive = hi - lo == R});
  }
  // Derived features: each row's probability (the head items' exactly, the rest spread evenly).
  t.derived.resize(F_);
  const uint64_t head = std::min(N_, kDerivedHead);
  const double rest = 1 - PowerSum(head) / H_;
  for (size_t f = 1; f < F_; ++f) {
    const auto [first, L] = events_.DerivedRange(f, c);
    std::vector<double> mass(L, rest / static_cast<double>(L));
    for (uint64_t r = 0; r < head; ++r) {
      mass[events_.DerivedRow(f, base + r, c) - first] += pmf_[r];
    }
    Community::Derived& d = t.derived[f];
    std::vector<std::pair<double, double>> classes;
    classes.reserve(L);
    const uint64_t Rf = options_.shard_rows[f];
    double sampled = 0;
    for (uint64_t i = 0; i < L; ++i) {
      classes.emplace_back(mass[i], 1.0);
      const uint64_t row = first + i;
      if (d.shards.empty() || d.shards.back().shard != row / Rf) {
        // Exclusive when the slice holds the whole shard.
        const uint64_t shard = row / Rf;
        d.shards.push_back(
            {.shard = shard, .exclusive = shard * Rf >= first && (shard + 1) * Rf <= first + L});
      }
      d.shards.back().share += mass[i];
      if (!EmbSampled(options_.table_ids[f], row, every)) continue;
      sampled += mass[i];
      d.sampled.rows.push_back(row);
      d.sampled.cum.push_back(sampled);
    }
    d.sampled.head = d.sampled.q = sampled;
    d.distinct = DistinctGrid(classes, kSmall + 1);  // the rest when a history needs it
    d.classes = std::move(classes);
    for (double p : mass) hot_[static_cast<size_t>(c) * F_ + f].sum_p2 += p * p;
    std::copy(d.distinct.begin(), d.distinct.begin() + kSmall + 1,
              small_distinct_.begin() +
                  static_cast<std::ptrdiff_t>((static_cast<size_t>(c) * F_ + f) * (kSmall + 1)));
    q_[static_cast<size_t>(c) * F_ + f] = sampled;
    log_miss_[static_cast<size_t>(c) * F_ + f] = std::log1p(-std::min(sampled, 1.0));
  }
  q_[static_cast<size_t>(c) * F_] = t.item.q;
  log_miss_[static_cast<size_t>(c) * F_] = std::log1p(-std::min(t.item.q, 1.0));
  // Shared shards first, then the exclusive ones by share, largest first (Sketch stops at the
  // first that rounds to no event).
  auto order = [](std::vector<ShardShare>& shares) {
    std::stable_sort(shares.begin(), shares.end(), [](const ShardShare& a, const ShardShare& b) {
      if (a.exclusive != b.exclusive) return !a.exclusive;
      return a.exclusive && a.share > b.share;
    });
  };
  order(t.item_shards);
  for (size_t f = 1; f < F_; ++f) order(t.derived[f].shards);
  // What Sketch's tally needs of a community with few events, side by side for all of them.
  for (size_t f = 0; f < F_; ++f) {
    Hot& h = hot_[static_cast<size_t>(c) * F_ + f];
    const std::vector<ShardShare>& shares = f == 0 ? t.item_shards : t.derived[f].shards;
    for (const ShardShare& s : shares) {
      if (!s.exclusive) {
        if (h.shared++ == 0) h.shared_shard = {s.shard, s.share};
      } else if (h.top_shard.second == 0) {
        h.top_shard = {s.shard, s.share};
      } else if (h.next_share == 0) {
        h.next_share = s.share;
      }
    }
  }
  return t;
}

uint64_t HistorySketcher::Draw(const Conditional& c, uint32_t community, SplitMix64& rng) const {
  const double v = Unit(rng) * c.q;
  if (!c.rows.empty() && v < c.head) {
    const size_t i =
        static_cast<size_t>(std::upper_bound(c.cum.begin(), c.cum.end(), v) - c.cum.begin());
    return c.rows[std::min(i, c.rows.size() - 1)];
  }
  if (c.q <= c.head || c.tail_lo >= c.tail_hi) return c.rows.back();  // rounding at the edge
  // The tail's whole groups: a rank from the continuous Zipf density over them picks a group by
  // its mass; its sampled row is kept with probability ∝ the row's mass ÷ the group's mean, so
  // that a sampled row is drawn ∝ its own mass. The bound is ≈ 1 + s · every ÷ (2 · head): at the
  // paper's head (65 536 ranks) and every 256 a draw is kept with probability > 0.99. Only a
  // tiny head could exhaust the attempts; the last one's row is still a sampled tail row.
  const uint64_t base = static_cast<uint64_t>(community) * N_;
  const uint32_t every = options_.every;
  const double a = static_cast<double>(c.tail_lo) + 0.5, b = static_cast<double>(c.tail_hi) + 0.5;
  uint64_t row = 0;
  for (int attempt = 0; attempt < 1000; ++attempt) {
    const double x = RankPoint(Unit(rng), a, b);
    const uint64_t k = std::clamp<uint64_t>(static_cast<uint64_t>(std::floor(x + 0.5)),
                                            c.tail_lo + 1, c.tail_hi);  // 1-based rank
    const uint64_t group = (base + k - 1) / every;
    row = EmbSampledRowOf(options_.table_ids[0], group, every);
    const double ks = static_cast<double>(row - base) + 1;
    const double first = static_cast<double>(group * every - base) + 1;
    const double keep =
        Mass(ks - 0.5, ks + 0.5) * every / Mass(first - 0.5, first + every - 0.5) / tail_bound_;
    if (Unit(rng) < keep) break;
  }
  return row;
}

void HistorySketcher::Touch(uint32_t c, uint32_t m) {
  if (q_[static_cast<size_t>(c) * F_] < 0) Tables(c);
  if (counts_[c] == 0) touched_.push_back(c);
  counts_[c] += m;
}

void HistorySketcher::SketchEvents(uint64_t user, uint64_t first, uint64_t count,
                                   HistorySketch& out) {
  events_.ForEachEventCommunity(user, first, count, [&](uint64_t, uint32_t c, SplitMix64& rng) {
    // The per-event decision reads only q_ (contiguous; the tables are touched when it hits).
    Touch(c, 1);
    const double* q = &q_[static_cast<size_t>(c) * F_];
    if (Unit(rng) < q[0]) {
      out.features[0].sampled.push_back(Draw(communities_[c]->item, c, rng));
    }
    for (size_t f = 1; f < F_; ++f) {
      if (Unit(rng) < q[f]) {
        out.features[f].sampled.push_back(Draw(communities_[c]->derived[f].sampled, c, rng));
      }
    }
  });
}

void HistorySketcher::SketchBlock(uint64_t user, uint64_t block, const Homes& homes,
                                  HistorySketch& out) {
  SplitMix64 rng(KeyedHash(events_.config().seed, user, block, kBlockKey));
  // The block's events per community: home ones split evenly among the homes, the rest popular.
  const uint32_t home = home_->Draw(kBlock, Unit(rng));
  auto add = [&](uint32_t c, uint32_t m) {
    if (m == 0) return;
    if (block_counts_[c] == 0) block_touched_.push_back(c);
    block_counts_[c] += m;
  };
  if (homes.size() == 1) {
    add(homes[0], home);
  } else if (homes.size() == 2) {
    const uint32_t a = half_->Draw(home, Unit(rng));
    add(homes[0], a);
    add(homes[1], home - a);
  } else {
    const uint32_t a = third_->Draw(home, Unit(rng));
    const uint32_t b = half_->Draw(home - a, Unit(rng));
    add(homes[0], a);
    add(homes[1], b);
    add(homes[2], home - a - b);
  }
  for (uint32_t i = home; i < kBlock; ++i) {  // by popularity, from the alias table
    const uint64_t x = rng();
    const uint32_t k = static_cast<uint32_t>(((x >> 32) * alias_.size()) >> 32);
    const double coin = static_cast<double>(x & 0xffffffffULL) * 0x1.0p-32;
    add(events_.CommunityByRank(coin < alias_prob_[k] ? k : alias_[k]), 1);
  }
  // Per community: how many of its events use a sampled row of each feature, and which.
  for (uint32_t c : block_touched_) {
    const uint32_t m = block_counts_[c];
    block_counts_[c] = 0;
    Touch(c, m);
    for (size_t f = 0; f < F_; ++f) {
      const size_t at = static_cast<size_t>(c) * F_ + f;
      const uint32_t k = SampledCount(m, q_[at], log_miss_[at], rng);
      if (k == 0) continue;  // most: the community's tables stay untouched (cold in memory)
      const Conditional& cond =
          f == 0 ? communities_[c]->item : communities_[c]->derived[f].sampled;
      for (uint32_t i = 0; i < k; ++i) out.features[f].sampled.push_back(Draw(cond, c, rng));
    }
  }
  block_touched_.clear();
}

double HistorySketcher::Interpolate(const std::vector<double>& grid, uint64_t m) const {
  if (m <= kSmall) return grid[m];  // the grid's first points are m = 0 … kSmall
  if (m >= grid_m_.back()) return grid.back();
  const size_t i =
      static_cast<size_t>(std::upper_bound(grid_m_.begin(), grid_m_.end(), m) - grid_m_.begin()) -
      1;
  if (grid_m_[i] == m) return grid[i];
  const double x =
      static_cast<double>(m - grid_m_[i]) / static_cast<double>(grid_m_[i + 1] - grid_m_[i]);
  return grid[i] + x * (grid[i + 1] - grid[i]);
}

double HistorySketcher::DerivedDistinct(uint32_t c, size_t f, uint64_t m) {
  Community::Derived& d = communities_[c]->derived[f];
  if (m > kSmall && d.distinct[kSmall + 1] == 0)
    d.distinct = DistinctGrid(d.classes, grid_m_.size());
  return Interpolate(d.distinct, m);
}

double HistorySketcher::ExpectedDistinct(size_t f, uint32_t community, uint64_t m) {
  if (f == 0) return Interpolate(item_distinct_, m);
  Tables(community);
  return DerivedDistinct(community, f, m);
}

const HistorySketch& HistorySketcher::Sketch(uint64_t user, uint64_t first, uint64_t count) {
  const std::array<uint64_t, 3> key = {user, first, count};
  if (auto it = memo_index_.find(key); it != memo_index_.end()) return memo_[it->second];
  const size_t slot = memo_next_;
  memo_next_ = (memo_next_ + 1) % memo_.size();
  memo_index_.erase(memo_keys_[slot]);
  memo_keys_[slot] = key;
  memo_index_[key] = slot;
  HistorySketch& out = memo_[slot];
  out.events = count;
  out.features.resize(F_);
  for (HistorySketch::Feature& f : out.features) {
    f.sampled.clear();
    f.distinct = 0;
  }
  out.shards.clear();
  // Whole blocks of kBlock events by their counts; the events before the first and after the
  // last one by one.
  const uint64_t end = first + count;
  const uint64_t block_first = (first + kBlock - 1) / kBlock, block_end = end / kBlock;
  if (block_first >= block_end) {
    SketchEvents(user, first, count, out);
  } else {
    SketchEvents(user, first, block_first * kBlock - first, out);
    const Homes homes = events_.HomesOf(user);
    for (uint64_t b = block_first; b < block_end; ++b) SketchBlock(user, b, homes, out);
    SketchEvents(user, block_end * kBlock, end - block_end * kBlock, out);
  }
  // Per community touched: its distinct rows, and its events per shard. A shard only this
  // community has rows in is listed when its expected events round to one or more (the router's
  // profile drops the others); shared ones are summed first.
  auto add = [&](uint32_t f, const std::vector<ShardShare>& shares, double m) {
    for (const ShardShare& s : shares) {
      if (!s.exclusive) {
        shard_scratch_[{f, s.shard}] += m * s.share;
      } else if (m * s.share >= 0.5) {
        out.shards.push_back({.feature = f, .shard = s.shard, .events = m * s.share});
      } else {
        break;  // the rest are smaller
      }
    }
  };
  // Most communities of a history have an event or two (popular draws): those are tallied from
  // hot_ alone (the community's tables are cold in memory: a few hundred of them per history).
  for (uint32_t c : touched_) {
    const uint32_t m = counts_[c];
    counts_[c] = 0;
    for (size_t f = 0; f < F_; ++f) {
      const Hot& h = hot_[static_cast<size_t>(c) * F_ + f];
      const uint32_t feature = static_cast<uint32_t>(f);
      // Distinct rows: one event uses one row; two, 2 − Σp² in expectation.
      const double sum_p2 = f == 0 ? item_sum_p2_ : h.sum_p2;
      out.features[f].distinct +=
          m == 1        ? 1.0
          : m == 2      ? 2 - sum_p2
          : f == 0      ? Interpolate(item_distinct_, m)
          : m <= kSmall ? small_distinct_[(static_cast<size_t>(c) * F_ + f) * (kSmall + 1) + m]
                        : DerivedDistinct(c, f, m);
      if (h.shared > 1 || m * h.next_share >= 0.5) {  // a home community, or an odd layout
        add(feature, f == 0 ? communities_[c]->item_shards : communities_[c]->derived[f].shards, m);
        continue;
      }
      if (h.shared == 1) {
        shard_scratch_[{feature, h.shared_shard.first}] += m * h.shared_shard.second;
      }
      if (m * h.top_shard.second >= 0.5) {
        out.shards.push_back(
            {.feature = feature, .shard = h.top_shard.first, .events = m * h.top_shard.second});
      }
    }
  }
  touched_.clear();
  for (const auto& [k, events] : shard_scratch_) {
    out.shards.push_back({.feature = k.first, .shard = k.second, .events = events});
  }
  shard_scratch_.clear();
  return out;
}

}  // namespace hlem::sim
