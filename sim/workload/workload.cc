#include "sim/workload/workload.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/config.h"

namespace hlem::sim {

namespace {

// A uniform double in [0, 1) from 53 random bits (the same on every platform, unlike
// std::uniform_real_distribution).
template <typename G>
double Unit(G& g) {
  return static_cast<double>(g() >> 11) * 0x1.0p-53;
}

// Poisson(mean): inversion by sequential search for small means, a rounded normal above 30.
template <typename G>
uint64_t Poisson(G& g, double mean) {
  if (mean <= 0) return 0;
  if (mean > 30) {
    const double u1 = std::max(Unit(g), 1e-300), u2 = Unit(g);
    const double z = std::sqrt(-2 * std::log(u1)) * std::cos(2 * M_PI * u2);
    return static_cast<uint64_t>(std::max(0.0, std::round(mean + std::sqrt(mean) * z)));
  }
  double p = std::exp(-mean), cdf = p;
  const double u = Unit(g);
  uint64_t k = 0;
  while (u > cdf && k < 1000) {
    ++k;
    p *= mean / static_cast<double>(k);
    cdf += p;
  }
  return k;
}

constexpr uint64_t kHomeKey = 0x686f6d65;    // "home"
constexpr uint64_t kLengthKey = 0x6c656e67;  // "leng"
constexpr uint64_t kGrowKey = 0x67726f77;    // "grow"

}  // namespace

const char* RegimeName(Regime regime) {
  switch (regime) {
    case Regime::kSteady:
      return "steady";
    case Regime::kTrend:
      return "trend";
    case Regime::kBurst:
      return "burst";
  }
  return "?";
}

uint64_t MaxEventsPerRequest(const WorkloadConfig& c) {
  const double first = std::llround(c.history_max * c.history_scale);
  const double returning = c.new_events_mean + 10 * std::sqrt(c.new_events_mean) + 100;
  return static_cast<uint64_t>(std::ceil(std::max({first, returning, 1.0})));
}

absl::Status Validate(const WorkloadConfig& c) {
  std::vector<std::string> errors;
  auto check = [&](bool ok, absl::string_view field, absl::string_view message) {
    if (!ok) errors.push_back(absl::StrCat("workload.", field, ": ", message));
  };
  check(!c.features.empty(), "features", "at least one (feature 0 is the item table)");
  for (size_t f = 0; f < c.features.size(); ++f) {
    check(c.features[f].rows >= 1, absl::StrCat("features[", f, "].rows"), "must be >= 1");
    const std::string& name = c.features[f].name;
    // Names go into trace headers' YAML as they are: identifiers only.
    check(!name.empty() && name.size() <= 64 &&
              std::all_of(name.begin(), name.end(),
                          [](char ch) {
                            return absl::ascii_isalnum(static_cast<unsigned char>(ch)) ||
                                   ch == '_' || ch == '.' || ch == '-';
                          }),
          absl::StrCat("features[", f, "].name"),
          absl::StrCat("'", absl::CEscape(name.substr(0, 64)),
                       "': 1 to 64 letters, digits, '_', '.' or '-'"));
  }
  const uint64_t items = c.features.empty() ? 0 : c.features[0].rows;
  check(c.communities >= 64, "communities", "must be >= 64");
  check(c.residency_shard_rows >= 1, "residency_shard_rows", "must be >= 1");
  if (c.communities >= 64 && c.residency_shard_rows >= 1) {
    check(
        items % c.communities == 0 && (items / c.communities) % c.residency_shard_rows == 0 &&
            items / c.communities > 0,
        "communities",
        absl::StrCat("the item table's ", items, " rows must split into ", c.communities,
                     " communities of whole residency shards (", c.residency_shard_rows, " rows)"));
  }
  check(c.item_zipf >= 0 && c.item_zipf <= 5, "item_zipf", "must be in [0, 5]");
  check(c.community_zipf >= 0 && c.community_zipf <= 5, "community_zipf", "must be in [0, 5]");
  check(c.hot_user_zipf >= 0 && c.hot_user_zipf <= 5, "hot_user_zipf", "must be in [0, 5]");
  check(c.hot_users >= 1, "hot_users", "must be >= 1");
  check(c.hot_windows >= 1, "hot_windows", "must be >= 1");
  check(c.users > c.hot_users, "users", "must be more than hot_users (the long tail)");
  check(c.min_home >= 1 && c.min_home <= c.max_home && c.max_home <= 3, "min_home",
        "want 1 <= min_home <= max_home <= 3");
  check(c.home_share >= 0.8 && c.home_share <= 1, "home_share", "must be in [0.8, 1]");
  check(c.history_min >= 1 && c.history_min <= c.history_max, "history_min",
        "want 1 <= history_min <= history_max");
  check(c.history_scale > 0 && c.history_scale <= 1000, "history_scale", "must be in (0, 1000]");
  check(c.new_events_mean >= 0 && c.new_events_mean <= 1e6, "new_events_mean",
        "must be in [0, 1e6]");
  check(c.candidates >= 1 && c.candidates <= 100000, "candidates", "must be in [1, 100000]");
  // A request's id lists stay under kMaxRequestIds (see MaxEventsPerRequest).
  const double features = static_cast<double>(c.features.size());
  const double limit = static_cast<double>(kMaxRequestIds);
  check(c.history_max * c.history_scale * features <= limit, "history_max",
        absl::StrCat("history_max × history_scale × features must be at most ", kMaxRequestIds,
                     " ids per request"));
  check((c.new_events_mean + 10 * std::sqrt(c.new_events_mean) + 100) * features <= limit,
        "new_events_mean",
        absl::StrCat("(new_events_mean + 10·√new_events_mean + 100) × features must be at most ",
                     kMaxRequestIds, " ids per request"));
  check(c.candidates * features <= limit, "candidates",
        absl::StrCat("candidates × features must be at most ", kMaxRequestIds, " ids per request"));
  check(c.popular_candidate_share >= 0 && c.popular_candidate_share <= 1, "popular_candidate_share",
        "must be in [0, 1]");
  check(c.rate > 0 && c.rate <= 1e7, "rate", "must be in (0, 1e7] requests/s");
  check(c.window > absl::ZeroDuration(), "window", "must be > 0");
  check(!c.phases.empty(), "phases", "at least one");
  for (size_t i = 0; i < c.phases.size(); ++i) {
    const Phase& p = c.phases[i];
    const std::string at = absl::StrCat("phases[", i, "].");
    check(p.duration > absl::ZeroDuration(), at + "duration", "must be > 0");
    for (double r : {p.hot_ratio, p.hot_ratio_end, p.burst_ratio}) {
      check(r >= 0 && r <= 1, at + "hot_ratio", "ratios must be in [0, 1]");
    }
    check(p.bursts_per_hour >= 0, at + "bursts_per_hour", "must be >= 0");
    check(p.burst_min_windows >= 1 && p.burst_min_windows <= p.burst_max_windows,
          at + "burst_min_windows", "want 1 <= burst_min_windows <= burst_max_windows");
  }
  if (errors.empty()) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrJoin(errors, "; "));
}

absl::StatusOr<WorkloadConfig> ParseWorkloadConfig(const std::string& yaml_text) {
  absl::StatusOr<YAML::Node> root = ParseYaml(yaml_text);
  if (!root.ok()) return root.status();
  WorkloadConfig c;
  ConfigReader r(*root, "workload");
  auto u32 = [&](ConfigReader& reader, std::string_view key, uint32_t* out, uint64_t min,
                 uint64_t max) {
    uint64_t v = *out;
    reader.UInt(key, &v, min, max);
    *out = static_cast<uint32_t>(v);
  };
  r.UInt("seed", &c.seed, 0, ~uint64_t{0});
  if (r.Has("features")) {
    c.features.clear();
    r.List("features", [&](ConfigReader& f, size_t i) {
      FeatureTable t{.table_id = static_cast<uint32_t>(i)};
      f.String("name", &t.name, true);
      u32(f, "table_id", &t.table_id, 0, ~uint32_t{0});
      f.UInt("rows", &t.rows, 1, uint64_t{1} << 48, true);
      c.features.push_back(t);
    });
  }
  u32(r, "communities", &c.communities, 64, 1 << 24);
  r.UInt("residency_shard_rows", &c.residency_shard_rows, 1, uint64_t{1} << 32);
  r.Double("item_zipf", &c.item_zipf, 0, 5)
      .Double("community_zipf", &c.community_zipf, 0, 5)
      .UInt("users", &c.users, 2, uint64_t{1} << 48)
      .UInt("hot_users", &c.hot_users, 1, uint64_t{1} << 40)
      .Double("hot_user_zipf", &c.hot_user_zipf, 0, 5);
  u32(r, "hot_windows", &c.hot_windows, 1, 1000);
  u32(r, "min_home", &c.min_home, 1, 3);
  u32(r, "max_home", &c.max_home, 1, 3);
  r.Double("home_share", &c.home_share, 0.8, 1);
  u32(r, "history_min", &c.history_min, 1, 1 << 24);
  u32(r, "history_max", &c.history_max, 1, 1 << 24);
  r.Double("history_scale", &c.history_scale, 1e-6, 1000)
      .Double("new_events_mean", &c.new_events_mean, 0, 1e6);
  u32(r, "candidates", &c.candidates, 1, 100000);
  r.Double("popular_candidate_share", &c.popular_candidate_share, 0, 1)
      .Double("rate", &c.rate, 1e-6, 1e7)
      .Duration("window", &c.window, absl::Milliseconds(1), absl::Hours(24));
  if (r.Has("phases")) {
    c.phases.clear();
    r.List("phases", [&](ConfigReader& p, size_t) {
      Phase phase;
      std::string regime = "steady";
      p.Enum("regime", &regime, {"steady", "trend", "burst"}, true)
          .Duration("duration", &phase.duration, absl::Milliseconds(1), absl::Hours(24 * 30), true)
          .Double("hot_ratio", &phase.hot_ratio, 0, 1)
          .Double("hot_ratio_end", &phase.hot_ratio_end, 0, 1)
          .Double("burst_ratio", &phase.burst_ratio, 0, 1)
          .Double("bursts_per_hour", &phase.bursts_per_hour, 0, 1e6);
      u32(p, "burst_min_windows", &phase.burst_min_windows, 1, 1000);
      u32(p, "burst_max_windows", &phase.burst_max_windows, 1, 1000);
      phase.regime = regime == "trend"   ? Regime::kTrend
                     : regime == "burst" ? Regime::kBurst
                                         : Regime::kSteady;
      c.phases.push_back(phase);
    });
  }
  if (absl::Status st = r.Finish(); !st.ok()) return st;
  if (absl::Status st = Validate(c); !st.ok()) return st;
  return c;
}

std::string WorkloadConfigYaml(const WorkloadConfig& c) {
  auto d = [](double v) { return absl::StrFormat("%.17g", v); };
  std::string y = absl::StrCat("seed: ", c.seed, "\nfeatures:\n");
  for (const FeatureTable& f : c.features) {
    absl::StrAppend(&y, "  - {name: ", f.name, ", table_id: ", f.table_id, ", rows: ", f.rows,
                    "}\n");
  }
  absl::StrAppend(
      &y, "communities: ", c.communities, "\nresidency_shard_rows: ", c.residency_shard_rows,
      "\nitem_zipf: ", d(c.item_zipf), "\ncommunity_zipf: ", d(c.community_zipf),
      "\nusers: ", c.users, "\nhot_users: ", c.hot_users, "\nhot_user_zipf: ", d(c.hot_user_zipf),
      "\nhot_windows: ", c.hot_windows, "\nmin_home: ", c.min_home, "\nmax_home: ", c.max_home,
      "\nhome_share: ", d(c.home_share));
  absl::StrAppend(
      &y, "\nhistory_min: ", c.history_min, "\nhistory_max: ", c.history_max,
      "\nhistory_scale: ", d(c.history_scale), "\nnew_events_mean: ", d(c.new_events_mean),
      "\ncandidates: ", c.candidates, "\npopular_candidate_share: ", d(c.popular_candidate_share),
      "\nrate: ", d(c.rate), "\nwindow: ", absl::FormatDuration(c.window), "\nphases:\n");
  for (const Phase& p : c.phases) {
    absl::StrAppend(
        &y, "  - {regime: ", RegimeName(p.regime), ", duration: ", absl::FormatDuration(p.duration),
        ", hot_ratio: ", d(p.hot_ratio), ", hot_ratio_end: ", d(p.hot_ratio_end),
        ", burst_ratio: ", d(p.burst_ratio), ", bursts_per_hour: ", d(p.bursts_per_hour),
        ", burst_min_windows: ", p.burst_min_windows, ", burst_max_windows: ", p.burst_max_windows,
        "}\n");
  }
  return y;
}

absl::StatusOr<std::unique_ptr<WorkloadGenerator>> WorkloadGenerator::Create(
    const WorkloadConfig& config) {
  if (absl::Status st = Validate(config); !st.ok()) return st;
  return std::unique_ptr<WorkloadGenerator>(new WorkloadGenerator(config));
}

WorkloadGenerator::WorkloadGenerator(const WorkloadConfig& config)
    : config_(config),
      F_(config.features.size()),
      community_rows_(config.features[0].rows / config.communities),
      community_zipf_(config.communities, config.community_zipf),
      item_zipf_(config.features[0].rows / config.communities, config.item_zipf),
      hot_zipf_(config.hot_users, config.hot_user_zipf),
      arrivals_(DeriveSeed(config.seed, "arrivals")),
      users_(DeriveSeed(config.seed, "users")),
      candidates_(DeriveSeed(config.seed, "candidates")) {
  community_by_rank_.resize(config.communities);
  for (uint32_t i = 0; i < config.communities; ++i) community_by_rank_[i] = i;
  Rng shuffle(DeriveSeed(config.seed, "communities"));
  for (uint32_t i = config.communities - 1; i > 0; --i) {
    std::swap(community_by_rank_[i], community_by_rank_[shuffle() % (i + 1)]);
  }
  // Feature f's rows of community c start at c · rows ÷ communities (precomputed: the 128-bit
  // division was a tenth of the simulator's time at the paper profile).
  derived_.resize(F_);
  for (size_t f = 1; f < F_; ++f) {
    const uint64_t rows = config.features[f].rows;
    DerivedTable& d = derived_[f];
    d.last_row = rows - 1;
    d.slice = std::max<uint64_t>(1, rows / config.communities);
    d.base.resize(config.communities);
    for (uint32_t c = 0; c < config.communities; ++c) {
      d.base[c] = static_cast<uint64_t>(static_cast<__uint128_t>(c) * rows / config.communities);
    }
  }
  uint64_t t = 0;
  for (const Phase& p : config.phases) {
    t += static_cast<uint64_t>(absl::ToInt64Nanoseconds(p.duration));
    phase_end_ns_.push_back(t);
  }
  end_ns_ = t;
  horizon_ns_ = static_cast<uint64_t>(absl::ToInt64Nanoseconds(config.window)) * config.hot_windows;
  PlanBursts();
}

void WorkloadGenerator::PlanBursts() {
  Rng rng(DeriveSeed(config_.seed, "bursts"));
  const uint64_t window_ns = static_cast<uint64_t>(absl::ToInt64Nanoseconds(config_.window));
  uint64_t start = 0;
  for (size_t i = 0; i < config_.phases.size(); ++i) {
    const Phase& p = config_.phases[i];
    const uint64_t end = phase_end_ns_[i];
    if (p.regime == Regime::kBurst && p.bursts_per_hour > 0) {
      const double mean_gap_ns = 3600e9 / p.bursts_per_hour;
      double t = static_cast<double>(start);
      const size_t before = bursts_.size();
      while (true) {
        t += -std::log(1 - Unit(rng)) * mean_gap_ns;
        if (t >= static_cast<double>(end)) break;
        const uint64_t windows =
            p.burst_min_windows + rng() % (p.burst_max_windows - p.burst_min_windows + 1);
        const uint64_t b = static_cast<uint64_t>(t);
        const uint64_t e = std::min(end, b + windows * window_ns);
        bursts_.emplace_back(b, e);
        t = static_cast<double>(e);  // spikes do not overlap
      }
      if (bursts_.size() == before) {
        // A burst phase holds at least one spike: a short phase at a low rate would otherwise
        // often be a steady one (3 minutes at 60 an hour: 5 %). Placed uniformly where its
        // shortest length fits.
        const uint64_t windows = p.burst_min_windows;
        const uint64_t room =
            end - start > windows * window_ns ? end - start - windows * window_ns : 0;
        const uint64_t b = start + static_cast<uint64_t>(Unit(rng) * static_cast<double>(room));
        bursts_.emplace_back(b, std::min(end, b + windows * window_ns));
      }
    }
    start = end;
  }
}

bool WorkloadGenerator::Recent(uint64_t user) const {
  auto it = last_seen_.find(user);
  return it != last_seen_.end() && it->second + horizon_ns_ >= now_ns_;
}

uint64_t WorkloadGenerator::PickUser() {
  if (Unit(users_) < HotProbability(now_ns_)) {
    const uint64_t hot = 1 + hot_zipf_(users_);
    if (Recent(hot) || recent_.empty()) return hot;
    return recent_[users_() % recent_.size()].second;
  }
  const uint64_t tail = config_.users - config_.hot_users;
  uint64_t user = 0;
  for (int attempt = 0; attempt < 8; ++attempt) {
    user = config_.hot_users + 1 + users_() % tail;
    if (!Recent(user)) break;
  }
  return user;
}

double WorkloadGenerator::HotProbability(uint64_t t_ns) const {
  const size_t i = static_cast<size_t>(
      std::upper_bound(phase_end_ns_.begin(), phase_end_ns_.end(), t_ns) - phase_end_ns_.begin());
  if (i >= config_.phases.size()) return config_.phases.back().hot_ratio;
  const Phase& p = config_.phases[i];
  const uint64_t start = i == 0 ? 0 : phase_end_ns_[i - 1];
  switch (p.regime) {
    case Regime::kSteady:
      return p.hot_ratio;
    case Regime::kTrend: {
      const double x =
          static_cast<double>(t_ns - start) / static_cast<double>(phase_end_ns_[i] - start);
      return p.hot_ratio + (p.hot_ratio_end - p.hot_ratio) * x;
    }
    case Regime::kBurst:
      for (const auto& [b, e] : bursts_) {
        if (t_ns >= b && t_ns < e) return p.burst_ratio;
      }
      return p.hot_ratio;
  }
  return p.hot_ratio;
}

WorkloadGenerator::Drawn WorkloadGenerator::PopularItem(SplitMix64& rng) const {
  const uint32_t community = community_by_rank_[community_zipf_(rng)];
  return {community * community_rows_ + item_zipf_(rng), community};
}

WorkloadGenerator::Homes WorkloadGenerator::HomesOf(uint64_t user) const {
  const uint64_t homes = config_.min_home + KeyedHash(config_.seed, user, kHomeKey) %
                                                (config_.max_home - config_.min_home + 1);
  Homes out;
  for (uint64_t pick = 0; pick < homes; ++pick) {
    SplitMix64 home(KeyedHash(config_.seed, user, kHomeKey, pick));
    out.push_back(community_by_rank_[community_zipf_(home)]);
  }
  return out;
}

uint32_t WorkloadGenerator::CommunityOf(SplitMix64& rng, const Homes& homes) const {
  if (Unit(rng) >= config_.home_share) return community_by_rank_[community_zipf_(rng)];
  return homes[rng() % homes.size()];
}

WorkloadGenerator::Drawn WorkloadGenerator::Item(uint64_t user, uint64_t event,
                                                 const Homes& homes) const {
  SplitMix64 rng(KeyedHash(config_.seed, user, event));
  const uint32_t community = CommunityOf(rng, homes);
  return {community * community_rows_ + item_zipf_(rng), community};
}

void WorkloadGenerator::AppendEventsOf(uint64_t user, uint64_t first, uint64_t count,
                                       std::vector<uint64_t>* out) const {
  if (count == 0) return;
  const Homes homes = HomesOf(user);
  out->reserve(out->size() + count * F_);
  for (uint64_t j = first; j < first + count; ++j) AppendEvent(Item(user, j, homes), out);
}

uint64_t WorkloadGenerator::Derived(size_t feature, Drawn item) const {
  const DerivedTable& d = derived_[feature];
  return std::min(d.last_row,
                  d.base[item.community] + KeyedHash(config_.seed, feature, item.item) % d.slice);
}

void WorkloadGenerator::AppendEvent(Drawn item, std::vector<uint64_t>* out) const {
  out->push_back(item.item);
  for (size_t f = 1; f < F_; ++f) out->push_back(Derived(f, item));
}

bool WorkloadGenerator::Next(TraceRequest* out, Events events) {
  now_ns_ += static_cast<uint64_t>(-std::log(1 - Unit(arrivals_)) * 1e9 / config_.rate);
  if (now_ns_ >= end_ns_) return false;
  while (!recent_.empty() && recent_.front().first + horizon_ns_ < now_ns_) {
    recent_.pop_front();
  }
  const uint64_t user = PickUser();
  last_seen_[user] = now_ns_;
  recent_.emplace_back(now_ns_, user);
  uint64_t& sent = sent_[user];
  uint64_t n;
  if (sent == 0) {
    const uint64_t span = config_.history_max - config_.history_min + 1;
    const uint64_t len = config_.history_min + KeyedHash(config_.seed, user, kLengthKey) % span;
    n = std::max<uint64_t>(
        1, static_cast<uint64_t>(std::llround(static_cast<double>(len) * config_.history_scale)));
  } else {
    SplitMix64 grow(KeyedHash(config_.seed, user, kGrowKey, sent));
    n = std::max<uint64_t>(1, Poisson(grow, config_.new_events_mean));
  }
  out->t_ns = now_ns_;
  out->user = user;
  out->prior_events = sent;
  out->new_events.clear();
  out->omitted_events = 0;
  if (events == Events::kAll || (events == Events::kReturning && sent > 0)) {
    out->new_events.reserve(n * F_);
    AppendEventsOf(user, sent, n, &out->new_events);
  } else {
    out->omitted_events = n;
  }
  sent += n;
  out->candidates.clear();
  out->candidates.reserve(config_.candidates * F_);
  SplitMix64 rng(candidates_());
  for (uint32_t c = 0; c < config_.candidates; ++c) {
    Drawn item;
    if (Unit(rng) < config_.popular_candidate_share) {
      item = PopularItem(rng);
    } else {
      item.item = rng() % config_.features[0].rows;
      item.community = item.item / community_rows_;
    }
    AppendEvent(item, &out->candidates);
  }
  return true;
}

}  // namespace hlem::sim
