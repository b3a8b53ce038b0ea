#include "embedding_shard/core/shard_client.h"

#include <algorithm>
#include <optional>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "common/logging.h"
#include "common/status_macros.h"

namespace hlem::shard {
namespace {

bool IsServerFailure(const absl::Status& s) {
  return absl::IsUnavailable(s) || absl::IsDeadlineExceeded(s) || absl::IsAborted(s) ||
         absl::IsCancelled(s);
}

// The rows of one request that go to one server: positions in the caller's batch.
struct Group {
  uint32_t server = 0;
  std::vector<uint32_t> partitions;  // partitions whose rows are in this group
  std::vector<uint64_t> rows;
  std::vector<uint64_t> slots;
  std::vector<std::byte*> dst;
  std::vector<uint32_t> partition_of_row;
  absl::Time deadline;
  absl::Status status;
  uint64_t ups = 0;  // the server's ShardClient::Ups when the group was started
};

}  // namespace

absl::StatusOr<std::unique_ptr<ShardClient>> ShardClient::Create(
    const ShardClientOptions& options, std::unique_ptr<ShardTransport> transport, Clock& clock) {
  ASSIGN_OR_RETURN(ShardMap map, ShardMap::Create(options.map));
  if (transport == nullptr) return absl::InvalidArgumentError("ShardClient: no transport");
  if (transport->num_servers() != map.num_shards()) {
    return absl::InvalidArgumentError(absl::StrCat("ShardClient: transport has ",
                                                   transport->num_servers(),
                                                   " servers, shard map has ", map.num_shards()));
  }
  if (options.max_batch_rows == 0) {
    return absl::InvalidArgumentError("ShardClient: max_batch_rows must be > 0");
  }
  std::unique_ptr<ShardClient> client(
      new ShardClient(options, std::move(map), std::move(transport), clock));
  client->ScheduleProbe();
  return client;
}

ShardClient::ShardClient(const ShardClientOptions& options, ShardMap map,
                         std::unique_ptr<ShardTransport> transport, Clock& clock)
    : options_(options),
      map_(std::move(map)),
      transport_(std::move(transport)),
      clock_(clock),
      down_(map_.num_shards(), false),
      ups_(map_.num_shards(), 0),
      next_reconnect_(map_.num_shards(), absl::InfinitePast()),
      reconnect_wait_(map_.num_shards(), absl::ZeroDuration()) {}

ShardClient::~ShardClient() {
  std::weak_ptr<int> token = probe_token_;
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
    clock_.Cancel(probe_timer_);
    probe_token_.reset();
    auto idle = [&token] { return token.expired(); };
    mu_.Await(absl::Condition(&idle));
  }
}

void ShardClient::ScheduleProbe() {
  if (options_.probe_interval <= absl::ZeroDuration()) return;
  absl::MutexLock lock(&mu_);
  if (stopping_) return;
  std::weak_ptr<int> weak = probe_token_;
  probe_timer_ = clock_.ScheduleAfter(options_.probe_interval, [this, weak] {
    std::shared_ptr<int> token = weak.lock();
    if (!token) return;
    ProbeAll();
    ScheduleProbe();
    absl::MutexLock lock(&mu_);
    token.reset();  // released under mu_ so the destructor's Await sees it
  });
}

void ShardClient::ProbeAll() {
  absl::MutexLock probe_lock(&probe_mu_);
  for (uint32_t s = 0; s < map_.num_shards(); ++s) {
    absl::Status probe = transport_->Probe(s, clock_.Now() + options_.probe_timeout);
    bool was_down;
    {
      absl::MutexLock lock(&mu_);
      if (stopping_) return;
      was_down = down_[s];
    }
    if (!probe.ok()) {
      if (!was_down) MarkDown(s);
      continue;
    }
    if (!was_down) continue;
    const absl::Time now = clock_.Now();
    if (now < next_reconnect_[s]) continue;  // backing off after failed reconnects
    if (absl::Status reconnected = transport_->Reconnect(s); !reconnected.ok()) {
      reconnect_wait_[s] =
          std::min(options_.reconnect_backoff_max,
                   std::max(options_.reconnect_backoff_min, 2 * reconnect_wait_[s]));
      next_reconnect_[s] = now + reconnect_wait_[s];
      // Once per try, and the tries back off: a reconnect that can never succeed (a setting the
      // server's transports refuse: FAILED_PRECONDITION) must not leave the shard down silently.
      GetLogger("shard_client")
          ->warn("shard_reconnect_failed shard={} error={} next_try_in={}", s,
                 reconnected.ToString(), absl::FormatDuration(reconnect_wait_[s]));
      continue;
    }
    reconnect_wait_[s] = absl::ZeroDuration();
    next_reconnect_[s] = absl::InfinitePast();
    {
      absl::MutexLock lock(&mu_);
      down_[s] = false;
      ++ups_[s];
    }
    if (options_.observer) options_.observer->OnServerHealth(s, true);
  }
}

uint64_t ShardClient::Ups(uint32_t server) const {
  absl::MutexLock lock(&mu_);
  return ups_[server];
}

void ShardClient::MarkDown(uint32_t server, std::optional<uint64_t> ups) {
  bool changed;
  {
    absl::MutexLock lock(&mu_);
    if (ups.has_value() && *ups != ups_[server]) return;  // it came back since: not this one's
    changed = !down_[server];
    if (changed) ++counters_.server_failures;
    down_[server] = true;
  }
  if (changed && options_.observer) options_.observer->OnServerHealth(server, false);
}

bool ShardClient::IsHealthy(uint32_t server) const {
  absl::MutexLock lock(&mu_);
  return server < down_.size() && !down_[server];
}

ShardClient::Counters ShardClient::counters() const {
  absl::MutexLock lock(&mu_);
  return counters_;
}

const TableSpec* ShardClient::FindTable(uint32_t table_id) const {
  for (const TableSpec& t : options_.tables) {
    if (t.id == table_id) return &t;
  }
  return nullptr;
}

absl::Status ShardClient::Fetch(uint32_t table_id, std::span<const uint64_t> rows,
                                std::span<std::byte> out, absl::Time deadline) {
  const TableSpec* spec = FindTable(table_id);
  if (spec == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat("table_id ", table_id, " is unknown"));
  }
  if (out.size() != rows.size() * spec->row_bytes()) {
    return absl::InvalidArgumentError(absl::StrCat("output buffer of ", out.size(),
                                                   " bytes does not fit ", rows.size(), " rows of ",
                                                   spec->row_bytes(), " bytes"));
  }
  std::vector<std::byte*> dst(rows.size());
  for (size_t i = 0; i < rows.size(); ++i) dst[i] = out.data() + i * spec->row_bytes();
  return FetchInto(table_id, rows, dst, deadline);
}

absl::Status ShardClient::FetchInto(uint32_t table_id, std::span<const uint64_t> rows,
                                    std::span<std::byte* const> dst, absl::Time deadline) {
  if (options_.observer == nullptr) return FetchOnce(table_id, rows, dst, deadline);
  const absl::Time start = clock_.Now();
  absl::Status status = FetchOnce(table_id, rows, dst, deadline);
  const TableSpec* spec = FindTable(table_id);
  size_t bytes = status.ok() && spec != nullptr ? rows.size() * spec->row_bytes() : 0;
  options_.observer->OnFetch(rows.size(), bytes, clock_.Now() - start, status.code());
  return status;
}

absl::Status ShardClient::FetchOnce(uint32_t table_id, std::span<const uint64_t> rows,
                                    std::span<std::byte* const> dst, absl::Time deadline) {
  const TableSpec* spec = FindTable(table_id);
  if (spec == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat("table_id ", table_id, " is unknown"));
  }
  if (rows.empty()) return absl::InvalidArgumentError("row_ids: empty batch");
  if (dst.size() != rows.size()) {
    return absl::InvalidArgumentError("FetchInto: one destination per row required");
  }
  const uint32_t num_partitions = map_.num_shards();
  const TableLayout layout = map_.Layout(*spec);
  std::vector<uint64_t> slots(rows.size());
  std::vector<uint32_t> partition_of(rows.size());
  std::vector<bool> open(num_partitions, false);  // partitions still to read
  for (size_t i = 0; i < rows.size(); ++i) {
    if (rows[i] >= spec->rows) {
      return absl::OutOfRangeError(absl::StrCat("row_ids[", i, "] = ", rows[i],
                                                " out of range for table ", table_id, " with ",
                                                spec->rows, " rows"));
    }
    slots[i] = layout.SlotOfRow(rows[i]);
    partition_of[i] = layout.PartitionOfSlot(slots[i]);
    open[partition_of[i]] = true;
  }
  std::vector<size_t> next_replica(num_partitions, 0);
  std::vector<int> server_of(num_partitions, -1);
  std::string failures;
  bool failed_over = false;
  for (;;) {
    if (clock_.Now() >= deadline) {
      return absl::DeadlineExceededError(absl::StrCat("fetch deadline passed", failures));
    }
    // Assign every open partition to its next replica that is healthy; a partition without one
    // fails at once rather than waiting for the deadline on a server known to be down.
    std::vector<Group> groups;
    std::vector<int> group_of_server(map_.num_shards(), -1);
    bool any_open = false;
    for (uint32_t p = 0; p < num_partitions; ++p) {
      server_of[p] = -1;
      if (!open[p]) continue;
      any_open = true;
      std::vector<uint32_t> servers = map_.ServersOf(p);
      while (next_replica[p] < servers.size() && !IsHealthy(servers[next_replica[p]])) {
        ++next_replica[p];
      }
      if (next_replica[p] == servers.size()) {
        return absl::UnavailableError(absl::StrCat("partition ", p, " of table ", table_id,
                                                   ": no live replica (servers down or failed)",
                                                   failures));
      }
      uint32_t s = servers[next_replica[p]];
      if (group_of_server[s] < 0) {
        group_of_server[s] = static_cast<int>(groups.size());
        groups.emplace_back();
        groups.back().server = s;
      }
      groups[group_of_server[s]].partitions.push_back(p);
      server_of[p] = static_cast<int>(s);
    }
    if (!any_open) break;
    if (groups.size() == 1 && !failed_over) {
      // First round and one server gets everything (one shard, or full replicas): no regrouping.
      Group& g = groups[0];
      g.rows.assign(rows.begin(), rows.end());
      g.slots = slots;
      g.dst.assign(dst.begin(), dst.end());
      g.partition_of_row = partition_of;
    } else {
      for (Group& g : groups) {
        g.rows.reserve(rows.size() / groups.size() + 16);
        g.slots.reserve(rows.size() / groups.size() + 16);
        g.dst.reserve(rows.size() / groups.size() + 16);
        g.partition_of_row.reserve(rows.size() / groups.size() + 16);
      }
      for (size_t i = 0; i < rows.size(); ++i) {
        int s = server_of[partition_of[i]];
        if (s < 0) continue;
        Group& g = groups[group_of_server[s]];
        g.rows.push_back(rows[i]);
        g.slots.push_back(slots[i]);
        g.dst.push_back(dst[i]);
        g.partition_of_row.push_back(partition_of[i]);
      }
    }
    // Start every group (in chunks of max_batch_rows), then collect. A group whose partitions all
    // have another replica left gets only attempt_timeout.
    std::vector<std::pair<Group*, std::unique_ptr<ShardTransport::Pending>>> started;
    for (Group& g : groups) {
      g.deadline = deadline;
      g.ups = Ups(g.server);
      bool has_fallback = true;
      for (uint32_t p : g.partitions) {
        has_fallback &= next_replica[p] + 1 < map_.ServersOf(p).size();
      }
      if (has_fallback) g.deadline = std::min(deadline, clock_.Now() + options_.attempt_timeout);
      for (size_t first = 0; first < g.rows.size() && g.status.ok();
           first += options_.max_batch_rows) {
        size_t n = std::min<size_t>(options_.max_batch_rows, g.rows.size() - first);
        ReadBatch batch{std::span<const uint64_t>(g.rows).subspan(first, n),
                        std::span<const uint64_t>(g.slots).subspan(first, n),
                        std::span<std::byte* const>(g.dst).subspan(first, n),
                        std::span<const uint32_t>(g.partition_of_row).subspan(first, n)};
        auto pending = transport_->Start(g.server, *spec, batch, g.deadline);
        if (pending.ok()) {
          started.emplace_back(&g, std::move(*pending));
        } else {
          g.status = pending.status();
        }
      }
    }
    for (auto& [g, pending] : started) {
      absl::Status s = transport_->Finish(*pending, g->deadline);
      if (g->status.ok()) g->status = s;
    }
    for (Group& g : groups) {
      if (g.status.ok()) {
        for (uint32_t p : g.partitions) open[p] = false;
        continue;
      }
      if (!IsServerFailure(g.status)) return g.status;  // the server's verdict on the request
      absl::StrAppend(&failures, "; shard ", g.server, ": ", g.status.message());
      // A server that did not answer in time is skipped until a probe finds it serving again.
      MarkDown(g.server, g.ups);
      if (absl::IsDeadlineExceeded(g.status) && clock_.Now() >= deadline) {
        return absl::DeadlineExceededError(absl::StrCat("fetch deadline passed", failures));
      }
      for (uint32_t p : g.partitions) ++next_replica[p];
      failed_over = true;
    }
  }
  if (failed_over) {
    {
      absl::MutexLock lock(&mu_);
      ++counters_.failovers;
    }
    if (options_.observer) options_.observer->OnFailover();
  }
  return absl::OkStatus();
}

}  // namespace hlem::shard
