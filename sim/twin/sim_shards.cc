#include "sim/twin/sim_shards.h"

#include <algorithm>
#include <map>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "common/rng.h"
#include "common/status_macros.h"

namespace hlem::sim {

namespace {
uint64_t MarkKey(uint32_t client, uint32_t server) {
  return (static_cast<uint64_t>(client) << 32) | server;
}
}  // namespace

absl::StatusOr<std::unique_ptr<SimShards>> SimShards::Create(const SimShardOptions& sim,
                                                             const Clock& clock) {
  const shard::ShardClientOptions& options = sim.client;
  ASSIGN_OR_RETURN(shard::ShardMap map, shard::ShardMap::Create(options.map));
  if (options.tables.empty()) return absl::InvalidArgumentError("shards.tables: none");
  absl::flat_hash_set<uint32_t> ids;
  for (const shard::TableSpec& t : options.tables) {
    if (!ids.insert(t.id).second) {
      return absl::InvalidArgumentError(absl::StrCat("shards.tables: table ", t.id, " twice"));
    }
    if (t.rows == 0) {
      return absl::InvalidArgumentError(absl::StrCat("shards.tables: table ", t.id, ": no rows"));
    }
  }
  if (options.probe_interval < absl::ZeroDuration() ||
      options.probe_timeout < absl::ZeroDuration() ||
      options.attempt_timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError(
        "shards: probe_interval and probe_timeout must be >= 0, attempt_timeout > 0");
  }
  return std::unique_ptr<SimShards>(new SimShards(sim, std::move(map), clock));
}

SimShards::SimShards(const SimShardOptions& options, shard::ShardMap map, const Clock& clock)
    : options_(options.client),
      dead_refuses_(options.dead_refuses),
      map_(std::move(map)),
      clock_(clock) {
  for (const shard::TableSpec& t : options_.tables) {
    tables_.emplace(t.id, Table{.layout = map_.Layout(t), .rows = t.rows});
  }
  history_.resize(map_.num_shards());
  for (uint32_t p = 0; p < map_.num_shards(); ++p) servers_of_.push_back(map_.ServersOf(p));
}

void SimShards::Set(uint32_t server, State state) {
  if (server < history_.size()) history_[server].emplace_back(clock_.Now(), state);
}

SimShards::State SimShards::StateAt(uint32_t server, absl::Time t) const {
  const auto& h = history_[server];
  auto it = std::upper_bound(h.begin(), h.end(), t,
                             [](absl::Time x, const auto& e) { return x < e.first; });
  return it == h.begin() ? State::kUp : std::prev(it)->second;
}

uint32_t SimShards::NewClient(uint64_t probe_key) {
  client_start_.push_back(clock_.Now());
  const double fraction =
      probe_key == 0 ? 0.0 : static_cast<double>(Mix64(probe_key) >> 11) * 0x1.0p-53;
  client_phase_.push_back(absl::Trunc(options_.probe_interval * fraction, absl::Microseconds(1)));
  return static_cast<uint32_t>(client_start_.size() - 1);
}

bool SimShards::BelievesUp(uint32_t client, uint32_t server, absl::Time t) const {
  // The latest probe verdict in by t: the start-up ask, then one probe per interval (a stopped
  // server's verdict comes probe_timeout after the probe).
  const absl::Time start = client_start_[client];
  absl::Time verdict_at = start;
  bool up = StateAt(server, start) == State::kUp;
  const absl::Time ticks = start + client_phase_[client];  // probe k at ticks + k × interval
  if (options_.probe_interval > absl::ZeroDuration() && t > ticks) {
    absl::Duration rest;  // IDivDuration needs somewhere to put it
    for (int64_t k = absl::IDivDuration(t - ticks, options_.probe_interval, &rest); k >= 1; --k) {
      const absl::Time probe = ticks + k * options_.probe_interval;
      const State s = StateAt(server, probe);
      const absl::Time in = s == State::kStopped ? probe + options_.probe_timeout : probe;
      if (in <= t) {
        verdict_at = in;
        up = s == State::kUp;
        break;
      }
    }
  }
  // A failed attempt since then marks it down.
  if (auto it = marks_.find(MarkKey(client, server)); it != marks_.end()) {
    auto m = std::upper_bound(it->second.begin(), it->second.end(), t);
    if (m != it->second.begin() && *std::prev(m) >= verdict_at) return false;
  }
  return up;
}

void SimShards::PartitionsOf(uint32_t table, std::span<const uint64_t> rows,
                             std::vector<uint32_t>* out) const {
  auto it = tables_.find(table);
  if (it == tables_.end()) return;
  const shard::TableLayout& layout = it->second.layout;
  for (uint64_t row : rows) {
    if (row < it->second.rows) out->push_back(layout.PartitionOfSlot(layout.SlotOfRow(row)));
  }
  std::sort(out->begin(), out->end());
  out->erase(std::unique(out->begin(), out->end()), out->end());
}

SimShards::Fetch SimShards::Start(uint32_t client, uint32_t table,
                                  std::span<const uint32_t> partitions, absl::Time deadline) {
  ++counters_.fetches;
  const absl::Time now = clock_.Now();
  Fetch f;
  std::vector<size_t> next(partitions.size(), 0);
  std::vector<bool> open(partitions.size(), true);
  std::string failures;
  absl::Time t = now;
  for (;;) {
    std::map<uint32_t, std::vector<size_t>> groups;  // by server, in server order
    for (size_t i = 0; i < partitions.size(); ++i) {
      if (!open[i]) continue;
      const std::vector<uint32_t>& servers = servers_of_[partitions[i]];
      while (next[i] < servers.size() && !BelievesUp(client, servers[next[i]], t)) ++next[i];
      if (next[i] == servers.size()) {
        ++counters_.unavailable;
        f.waited = t - now;
        f.status = absl::UnavailableError(
            absl::StrCat("partition ", partitions[i], " of table ", table,
                         ": no live replica (servers down or failed)", failures));
        return f;
      }
      groups[servers[next[i]]].push_back(i);
    }
    absl::Time round_end = t;
    bool failed = false;
    for (const auto& [server, members] : groups) {
      const State state = StateAt(server, t);
      if (state == State::kUp) {
        for (size_t i : members) open[i] = false;
        continue;
      }
      // Refused, or no answer by the group's deadline: the client marks the server down and
      // sends its partitions to their next replicas.
      bool fallback = true;
      for (size_t i : members) fallback &= next[i] + 1 < servers_of_[partitions[i]].size();
      const absl::Time group_deadline =
          state == State::kKilled && dead_refuses_
              ? t
              : std::max(t, fallback ? std::min(deadline, t + options_.attempt_timeout) : deadline);
      ++counters_.failed_attempts;
      std::vector<absl::Time>& marks = marks_[MarkKey(client, server)];
      marks.insert(std::upper_bound(marks.begin(), marks.end(), group_deadline), group_deadline);
      // Marks older than the newest one at or before now can no longer decide a view (views are
      // asked at now or later): drop them.
      if (auto m = std::upper_bound(marks.begin(), marks.end(), now); m - marks.begin() > 1) {
        marks.erase(marks.begin(), std::prev(m));
      }
      if (group_deadline == t) {
        absl::StrAppend(&failures, "; shard ", server, ": connection refused");
      } else {
        absl::StrAppend(&failures, "; shard ", server, ": no answer in ",
                        absl::FormatDuration(group_deadline - t));
      }
      round_end = std::max(round_end, group_deadline);
      failed = true;
      for (size_t i : members) ++next[i];
    }
    if (!failed) break;
    t = round_end;
    f.failed_over = true;
    if (t >= deadline) {
      ++counters_.deadline_exceeded;
      f.waited = t - now;
      f.status = absl::DeadlineExceededError(absl::StrCat("fetch deadline passed", failures));
      return f;
    }
  }
  if (f.failed_over) ++counters_.failovers;
  f.waited = t - now;
  return f;
}

}  // namespace hlem::sim
