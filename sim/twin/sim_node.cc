#include "sim/twin/sim_node.h"

#include <algorithm>
#include <cmath>
#include <utility>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "common/rng.h"
#include "common/shed.h"
#include "common/status_macros.h"
#include "serving_node/core/pipeline.h"

namespace hlem::sim {

namespace {

constexpr double kSampleDecay = 0.98;  // per lookup of a table at a node

// A sketched event's placeholder KV token: a function of its position alone.
uint64_t PlaceholderToken(uint64_t position) { return Mix64(position); }

// The KV prefix hashes of placeholder tokens from an empty prefix: [k] after the first k. The
// same for every user, so computed once (per thread: twins may run side by side).
const std::vector<uint64_t>& PlaceholderHashes(uint64_t upto) {
  thread_local std::vector<uint64_t> hashes{serving::kKvHashSeed};
  while (hashes.size() <= upto) {
    hashes.push_back(serving::KvHashExtend(hashes.back(), PlaceholderToken(hashes.size() - 1)));
  }
  return hashes;
}

}  // namespace

using serving::InferInput;
using serving::InferOutput;

struct SimExecutor::Job {
  InferInput in;
  serving::RequestQueue::Done done;
  absl::Time enqueued;
  InferOutput out;
  absl::Status error;
  uint64_t prior = 0, total = 0, first = 0, cached = 0, fresh = 0, candidates = 0;
  double slowdown = 1;  // of this request's CPU stages (CostModel::Slowdown)
  std::optional<serving::KvAppendResult> append;
  bool pinned = false;
  // Per table (feature order): distinct rows to fetch, and which of them to admit.
  struct Table {
    uint32_t table_id = 0;
    std::vector<uint64_t> fetch, admit, reserved;  // sampled rows (all rows when emb_sample = 1)
    uint64_t estimated_misses = 0;  // of the rows outside the sample (emb_sample > 1)
    // The shard partitions the fetch reads (with shard faults only): those of `fetch`, and when
    // rows outside the sample miss, those of every row outside it (which of them miss is not
    // known: an upper bound).
    std::vector<uint32_t> partitions;
    uint64_t Fetched() const { return fetch.size() + estimated_misses; }
  };
  std::vector<Table> tables;
  uint32_t copies_in_flight = 0;
  bool fetches_done = false;
  absl::Time copy_wait_from;
};

SimExecutor::SimExecutor(const SimNodeOptions& options, const CostModel& costs,
                         SharedCompute& compute, const WorkloadGenerator& events,
                         const Parts& parts, Clock& clock)
    : options_(options),
      costs_(costs),
      compute_(compute),
      generator_(events),
      parts_(parts),
      clock_(clock),
      row_bytes_(options.model.dim * 4),
      entry_bytes_(row_bytes_ * options.emb_sample) {}

SimExecutor::~SimExecutor() { *alive_ = false; }

absl::Status SimExecutor::Check(const InferInput& in) const {
  return serving::CheckInferInput(options_.local.pipeline, in,
                                  /*omitted_ok=*/parts_.sketcher != nullptr);
}

uint64_t SimExecutor::WindowStart(uint64_t events) const {
  return serving::WindowStart(options_.local.pipeline, events);
}

void SimExecutor::Submit(InferInput in, serving::RequestQueue::Done done) {
  if (queue_.size() >= options_.local.queue.max_queue) {
    done(absl::ResourceExhaustedError(
        absl::StrCat("node queue full (", options_.local.queue.max_queue, " waiting)")));
    return;
  }
  // RequestQueue's time bound: the oldest waiting request has waited too long.
  const absl::Time now = clock_.Now();
  if (!queue_.empty() && now - queue_.front()->enqueued > options_.local.queue.max_delay) {
    done(absl::ResourceExhaustedError("node queue behind (max_delay)"));
    return;
  }
  auto job = std::make_unique<Job>();
  job->in = std::move(in);
  job->done = std::move(done);
  job->enqueued = now;
  queue_.push_back(std::move(job));
  MaybeStartBatch();
}

void SimExecutor::MaybeStartBatch() {
  if (busy_ || queue_.empty()) return;
  busy_ = true;
  // Up to max_batch requests of distinct users, oldest first; a user's second request waits.
  // RequestQueue's rules: one whose deadline passed while queued is answered DEADLINE_EXCEEDED,
  // one that waited longer than max_delay is shed now, not served late.
  absl::flat_hash_set<uint64_t> users;
  const absl::Time now = clock_.Now();
  for (auto it = queue_.begin();
       it != queue_.end() && batch_.size() < options_.local.queue.max_batch;) {
    if (now >= (*it)->in.deadline) {
      (*it)->done(absl::DeadlineExceededError("deadline passed while queued"));
      it = queue_.erase(it);
    } else if (now - (*it)->enqueued > options_.local.queue.max_delay) {
      (*it)->done(ShedLateError("node overloaded: waited over max_delay"));
      it = queue_.erase(it);
    } else if (users.insert((*it)->in.user).second) {
      batch_.push_back(std::move(*it));
      it = queue_.erase(it);
    } else {
      ++it;
    }
  }
  if (batch_.empty()) {  // every waiting request was shed
    busy_ = false;
    return;
  }
  next_ = 0;
  PrepareNext();
}

void SimExecutor::PrepareNext() {
  if (next_ == batch_.size()) {
    RunModel();
    return;
  }
  Prepare(*batch_[next_]);
}

void SimExecutor::Prepare(Job& job) {
  if (clock_.Now() >= job.in.deadline) {  // the pipeline's check on arrival
    job.error = absl::DeadlineExceededError("deadline passed on arrival");
    Prepared(job);
    return;
  }
  const size_t F = features();
  const uint64_t user = job.in.user;
  job.prior = job.in.delta.has_value() ? job.in.delta->len : 0;
  job.total = job.prior + job.in.omitted_events + job.in.history.size() / F;
  job.first = WindowStart(job.total);
  job.candidates = job.in.candidates.size() / F;
  job.slowdown = costs_.Slowdown(user, job.prior);
  const uint64_t window = job.total - job.first;

  // 1. The cached prefix and the new tokens' slots.
  parts_.kv->Pin(user);
  job.pinned = true;
  serving::KvPrefix prefix;
  if (std::optional<serving::KvUserInfo> info = parts_.kv->Info(user);
      info.has_value() && info->prefix.len > 0) {
    auto it = kv_first_.find(user);
    if (it != kv_first_.end() && it->second == job.first && info->prefix.len <= window) {
      prefix = info->prefix;
    } else {
      parts_.kv->Evict(user);  // the real node's hash check fails on a moved window
    }
  }
  std::optional<serving::KvLookupResult> lookup = parts_.kv->LookupPrefix(user, prefix, window);
  if (!lookup.has_value()) prefix = {};
  job.cached = prefix.len;
  job.fresh = window - job.cached;
  // The fresh events' ids: those sent before this request regenerated (the twin keeps no
  // histories), then the request's own. Sketched: the regenerated and omitted ones (up to
  // `carried`, the first event `history` carries) come from one sketch, with placeholder tokens.
  const uint64_t from = job.first + job.cached;
  const uint64_t carried = job.prior + job.in.omitted_events;
  const uint64_t sketched = parts_.sketcher != nullptr && from < carried ? carried - from : 0;
  std::vector<uint64_t> ids, tokens;
  ids.reserve((job.fresh - sketched + job.candidates) * F);
  const HistorySketch* sketch = nullptr;
  if (parts_.sketcher != nullptr) {
    if (sketched > 0) sketch = &parts_.sketcher->Sketch(user, from, sketched);
  } else if (const uint64_t sent_end = std::min(job.prior, job.total); from < sent_end) {
    generator_.AppendEventsOf(user, from, sent_end - from, &ids);
  }
  ids.insert(
      ids.end(),
      job.in.history.begin() + static_cast<std::ptrdiff_t>((std::max(from, carried) - carried) * F),
      job.in.history.end());
  // Placeholders only, in a window from event 0 on a placeholder prefix (a first visit): their
  // hashes are known; else the tokens one by one.
  const std::vector<uint64_t>* known = nullptr;
  if (sketched > 0 && ids.empty() && job.first == 0) {
    known = &PlaceholderHashes(carried);
    if ((*known)[from] != prefix.hash) known = nullptr;
  }
  if (known == nullptr) {
    tokens.reserve(job.fresh);
    for (uint64_t j = from; j < from + sketched; ++j) tokens.push_back(PlaceholderToken(j));
    for (size_t at = 0; at < ids.size(); at += F) {
      tokens.push_back(serving::EventToken(std::span<const uint64_t>(ids).subspan(at, F)));
    }
  }
  const uint64_t new_tokens = known != nullptr ? sketched : tokens.size();
  if (new_tokens > 0) {
    absl::StatusOr<serving::KvAppendResult> append;
    if (known != nullptr) {
      const uint64_t pt = parts_.kv->page_tokens();
      std::vector<uint64_t> page_starts;
      for (uint64_t p = (from + pt - 1) / pt * pt; p < carried; p += pt) {
        page_starts.push_back((*known)[p]);
      }
      append = parts_.kv->AppendHashed(user, prefix, {.len = carried, .hash = (*known)[carried]},
                                       page_starts);
    } else {
      append = parts_.kv->Append(user, prefix, tokens);
    }
    if (!append.ok()) {
      job.error = append.status().code() == absl::StatusCode::kResourceExhausted
                      ? absl::ResourceExhaustedError(absl::StrCat(
                            "no KV room for ", new_tokens, " tokens: ", append.status().message()))
                      : absl::AbortedError(append.status().message());
      Prepared(job);
      return;
    }
    job.append = std::move(*append);
  }
  ids.insert(ids.end(), job.in.candidates.begin(), job.in.candidates.end());
  job.out.cached_prefix_tokens = static_cast<uint32_t>(job.cached);
  job.out.computed_tokens = static_cast<uint32_t>(job.fresh + job.candidates);
  job.out.history_tokens = static_cast<uint32_t>(window);
  job.out.trimmed_events = static_cast<uint32_t>(job.first);
  job.out.stale_kv_hit = job.in.expected_kv_resident && job.cached == 0;
  job.out.next_prefix = {.len = job.total, .hash = 0};
  job.out.targets = options_.model.targets;

  // 2. EMB lookups of the distinct rows, per table in feature order.
  const auto& features = options_.local.pipeline.features;
  uint64_t distinct = 0;
  serving::EmbLookupResult result;
  for (size_t f = 0; f < F; ++f) {
    const uint32_t table = features[f].table_id;
    if (std::any_of(job.tables.begin(), job.tables.end(),
                    [&](const Job::Table& t) { return t.table_id == table; })) {
      continue;  // a table shared by two features was looked up with the first
    }
    // The distinct rows; the sampled ones go to the cache (all of them when emb_sample = 1).
    const uint32_t every = options_.emb_sample;
    absl::flat_hash_set<uint64_t> seen;
    seen.reserve(static_cast<size_t>(
        std::count_if(features.begin() + static_cast<std::ptrdiff_t>(f), features.end(),
                      [&](const auto& g) { return g.table_id == table; }) *
        (ids.size() / F)));
    std::vector<uint64_t> rows, outside;  // `outside`: with shard faults only
    uint64_t unsampled = 0, sketch_unsampled = 0;
    Job::Table t{.table_id = table};
    if (sketch != nullptr) {  // its sampled rows, and its expected distinct rows beyond them
      double expected = 0;
      for (size_t g = f; g < F; ++g) {
        if (features[g].table_id != table) continue;
        expected += sketch->features[g].distinct;
        for (uint64_t row : sketch->features[g].sampled) {
          if (seen.insert(row).second) rows.push_back(row);
        }
      }
      const auto sketched = static_cast<uint64_t>(std::llround(expected));
      sketch_unsampled = unsampled = sketched > rows.size() ? sketched - rows.size() : 0;
      distinct += rows.size() + unsampled;
    }
    for (size_t g = f; g < F; ++g) {
      if (features[g].table_id != table) continue;
      for (size_t i = g; i < ids.size(); i += F) {
        if (!seen.insert(ids[i]).second) continue;
        ++distinct;
        if (EmbSampled(table, ids[i], every)) {
          rows.push_back(ids[i]);
        } else {
          ++unsampled;
          if (parts_.shards != nullptr) outside.push_back(ids[i]);
        }
      }
    }
    if (absl::Status st = parts_.emb->Lookup(table, rows, &result); !st.ok()) {
      job.error = absl::InternalError(absl::StrCat("EMB lookup: ", st.message()));
      break;
    }
    if (parts_.sketch != nullptr) parts_.sketch->RecordBatch(table, rows);
    if (parts_.tracker != nullptr) parts_.tracker->Record(table, rows);
    size_t m = 0, p = 0;
    while (m < result.miss_positions.size() || p < result.pending_positions.size()) {
      const bool miss = p == result.pending_positions.size() ||
                        (m < result.miss_positions.size() &&
                         result.miss_positions[m] < result.pending_positions[p]);
      const uint64_t row = rows[miss ? result.miss_positions[m++] : result.pending_positions[p++]];
      t.fetch.push_back(row);
      if (miss) t.admit.push_back(row);
    }
    if (unsampled > 0) {
      // The rows outside the sample miss at the sample's rate: this request's sampled rows,
      // shrunk towards the node's recent rate for the table (a request may hold few sampled
      // rows), rounded by keyed randomness.
      SampleRate& rate = sample_rate_[table];
      const double recent = rate.looked_up > 0 ? rate.missed / rate.looked_up : 1.0;
      constexpr double kPrior = 8;  // weight of the node's rate, in sampled rows
      const double miss_rate = (static_cast<double>(t.fetch.size()) + kPrior * recent) /
                               (static_cast<double>(rows.size()) + kPrior);
      const double expected = miss_rate * static_cast<double>(unsampled);
      const double u = static_cast<double>(KeyedHash(kEmbSampleKey, user, job.prior, table) >> 11) /
                       static_cast<double>(uint64_t{1} << 53);
      t.estimated_misses =
          static_cast<uint64_t>(expected) + (u < expected - std::floor(expected) ? 1 : 0);
      rate.missed = rate.missed * kSampleDecay + static_cast<double>(t.fetch.size());
      rate.looked_up = rate.looked_up * kSampleDecay + static_cast<double>(rows.size());
    }
    if (parts_.shards != nullptr) {
      parts_.shards->PartitionsOf(table, t.fetch, &t.partitions);
      if (t.estimated_misses > 0) parts_.shards->PartitionsOf(table, outside, &t.partitions);
    }
    const uint64_t fetched = t.Fetched();
    job.out.emb_misses += fetched;
    job.out.emb_hits += seen.size() + sketch_unsampled - fetched;
    job.tables.push_back(std::move(t));
  }
  if (!job.error.ok()) {
    Prepared(job);
    return;
  }
  const absl::Duration overhead = costs_.request_overhead * job.slowdown;
  const absl::Duration cpu =
      overhead + costs_.lookup_per_row * static_cast<int64_t>(distinct) * job.slowdown;
  job.out.kv_seconds = overhead;
  job.out.emb_seconds = cpu - overhead;
  compute_.Run(cpu, [this, &job, alive = alive_] {
    if (*alive) FetchFrom(job, 0);
  });
}

void SimExecutor::FetchFrom(Job& job, size_t table) {
  while (table < job.tables.size() && job.tables[table].Fetched() == 0) ++table;
  if (table == job.tables.size()) {
    job.fetches_done = true;
    job.copy_wait_from = clock_.Now();
    if (job.copies_in_flight == 0) Prepared(job);
    return;
  }
  if (clock_.Now() >= job.in.deadline) {  // the pipeline's check before each table's fetch
    job.error = absl::DeadlineExceededError("deadline passed before the embedding fetch");
    job.fetches_done = true;
    job.copy_wait_from = clock_.Now();
    if (job.copies_in_flight == 0) Prepared(job);
    return;
  }
  absl::Duration fetch = costs_.FetchTime(job.tables[table].Fetched()) * job.slowdown;
  if (parts_.shards != nullptr) {
    // Shard faults: failed attempts first; no live replica or the deadline passed: the request
    // fails as the pipeline fails it (UNAVAILABLE naming the fetch), after its copies so far.
    const Job::Table& t = job.tables[table];
    SimShards::Fetch f =
        parts_.shards->Start(parts_.shard_client, t.table_id, t.partitions, job.in.deadline);
    if (!f.status.ok()) {
      job.out.fetch_seconds += f.waited;
      job.out.emb_seconds += f.waited;
      job.error = absl::UnavailableError(absl::StrCat("fetching ", t.Fetched(), " rows of table ",
                                                      t.table_id, ": ", f.status.message()));
      clock_.ScheduleAfter(f.waited, [this, &job, alive = alive_] {
        if (!*alive) return;
        job.fetches_done = true;
        job.copy_wait_from = clock_.Now();
        if (job.copies_in_flight == 0) Prepared(job);
      });
      return;
    }
    fetch += f.waited;
  }
  job.out.fetch_seconds += fetch;
  job.out.emb_seconds += fetch;
  clock_.ScheduleAfter(fetch, [this, &job, table, alive = alive_] {
    if (!*alive) return;
    // 3. Admit the misses: reserve slots, one critical copy per run of consecutive slots.
    Job::Table& t = job.tables[table];
    serving::EmbReservation reservation;
    (void)parts_.emb->ReserveBatch(t.table_id, t.admit, &reservation);
    // One row's bytes per reserved slot (a sampled row's entry stands for emb_sample rows'
    // space; the request copies its own row), a copy per run of consecutive slots.
    std::vector<uint64_t> offsets;
    for (uint32_t i : reservation.reserved_positions) {
      t.reserved.push_back(t.admit[i]);
      offsets.push_back(reservation.offsets[i]);
    }
    std::sort(offsets.begin(), offsets.end());
    const uint64_t max_copy = options_.local.pipeline.max_copy_bytes;
    for (size_t begin = 0, i = 1; i <= offsets.size(); ++i) {
      if (i < offsets.size() && offsets[i] == offsets[i - 1] + entry_bytes_ &&
          (i - begin) * row_bytes_ < max_copy) {
        continue;
      }
      ++job.copies_in_flight;
      parts_.device->CopyToPool(serving::CopyClass::kCritical, serving::CopyPurpose::kEmbMiss,
                                nullptr, offsets[begin], (i - begin) * row_bytes_,
                                [this, &job, alive = alive_](absl::Status) {
                                  if (*alive) CopyDone(job);
                                });
      begin = i;
    }
    // Rows the cache did not take (no room, or pending under another request's copy) still
    // cross the link to be used, in one staged copy, as in the real pipeline; so do the
    // estimated misses outside the sample (their admission is the sampled rows').
    if (const uint64_t unadmitted = t.Fetched() - t.reserved.size(); unadmitted > 0) {
      ++job.copies_in_flight;
      parts_.device->CopyToPool(serving::CopyClass::kCritical, serving::CopyPurpose::kEmbMiss,
                                nullptr, 0, unadmitted * row_bytes_,
                                [this, &job, alive = alive_](absl::Status) {
                                  if (*alive) CopyDone(job);
                                });
    }
    FetchFrom(job, table + 1);
  });
}

void SimExecutor::CopyDone(Job& job) {
  --job.copies_in_flight;
  if (job.copies_in_flight == 0 && job.fetches_done) Prepared(job);
}

void SimExecutor::Prepared(Job& job) {
  if (job.fetches_done) {
    // Waiting for the request's copies after its last fetch (the pipeline's copy stage).
    job.out.copy_seconds = clock_.Now() - job.copy_wait_from;
    job.out.emb_seconds += job.out.copy_seconds;
  }
  for (const Job::Table& t : job.tables) {
    if (!t.reserved.empty()) (void)parts_.emb->Commit(t.table_id, t.reserved);
  }
  if (job.error.ok() && clock_.Now() >= job.in.deadline) {  // the pipeline's check before compute
    job.error = absl::DeadlineExceededError("deadline passed before compute");
  }
  ++next_;
  PrepareNext();
}

void SimExecutor::RunModel() {
  double flops = 0, slowdown = 1;  // a stall slows the batch's whole step
  for (const auto& job : batch_) {
    if (job->error.ok()) {
      slowdown = std::max(slowdown, job->slowdown);
      flops +=
          serving::CachedForwardFlops(options_.model, job->cached, job->fresh, job->candidates);
    }
  }
  const absl::Duration step = costs_.StepTime(flops) * slowdown;
  for (auto& job : batch_) job->out.compute_seconds = step;
  compute_.Run(step, [this, alive = alive_] {
    if (*alive) FinishBatch();
  });
}

void SimExecutor::FinishBatch() {
  std::vector<std::unique_ptr<Job>> batch = std::move(batch_);
  batch_.clear();
  for (auto& job : batch) {
    const uint64_t user = job->in.user;
    if (job->append.has_value()) {
      if (job->error.ok()) {
        if (parts_.kv->CommitAppend(user, job->append->prefix).ok()) kv_first_[user] = job->first;
      } else {
        (void)parts_.kv->AbortAppend(user, job->append->prefix);
      }
    }
    if (job->pinned) (void)parts_.kv->Unpin(user);
  }
  busy_ = false;
  // Answers after the batch's state is final; a `done` may submit the next request.
  for (auto& job : batch) {
    if (job->error.ok()) {
      job->done(std::move(job->out));
    } else {
      job->done(job->error);
    }
  }
  MaybeStartBatch();
}

absl::StatusOr<std::unique_ptr<SimNode>> SimNode::Create(
    const SimNodeOptions& options, const CostModel& costs, SharedCompute& compute,
    const WorkloadGenerator& events, uint64_t epoch, Clock& clock, SimShards* shards,
    HistorySketcher* sketcher) {
  const serving::LocalNodeOptions& o = options.local;
  const uint32_t every = options.emb_sample;
  if (every == 0) return absl::InvalidArgumentError("emb_sample: must be positive (1 = every row)");
  auto n = std::make_unique<SimNode>();
  const uint32_t row_bytes = options.model.dim * 4;  // fp32 tables (the node config's check)
  // A sampled row's entry holds `every` rows' bytes: the cache holds 1 in `every` of the rows
  // it would hold at row level.
  serving::EmbCacheOptions emb_options = serving::EmbCacheOptionsFor(o, row_bytes);
  for (serving::EmbTableSpec& t : emb_options.tables) t.row_bytes *= every;
  ASSIGN_OR_RETURN(
      n->pool, serving::HbmPool::Create({.pool_bytes = o.pool_bytes, .page_bytes = o.page_bytes}));
  ASSIGN_OR_RETURN(n->device, SimDevice::Create(o.pool_bytes, o.link, clock));
  n->events = std::make_unique<serving::ResidencyEventLog>(epoch, o.events_retained);
  n->residency = serving::FollowResidency(*n->events);
  ASSIGN_OR_RETURN(n->kv, serving::KvCache::Create({.layers = options.model.layers,
                                                    .kv_dim = options.model.kv_dim(),
                                                    .dtype_bytes = options.kv_dtype_bytes},
                                                   *n->pool, n->events.get(), clock));
  ASSIGN_OR_RETURN(n->emb, serving::EmbCache::Create(emb_options, *n->pool, clock));
  ASSIGN_OR_RETURN(n->memory,
                   serving::MemoryManager::Create(o.memory, *n->pool, *n->kv, *n->emb, clock));
  // The popularity summary sees the sampled rows only: 1 in `every` of the keys and of the
  // accesses, so it keeps 1 in `every` of the counters (each still covers the same share).
  ASSIGN_OR_RETURN(n->sketch,
                   serving::PopularitySketch::Create(
                       {.capacity = std::max<uint32_t>(16, o.popularity_capacity / every)}));
  if (o.refill_enabled) {
    ASSIGN_OR_RETURN(n->refiller, serving::Refiller::Create(o.refill, *n->emb, *n->device,
                                                            n->source, *n->sketch, clock));
  }
  ASSIGN_OR_RETURN(
      n->tracker, serving::ResidencyTracker::Create({.residency_shard_rows = o.residency_shard_rows,
                                                     .windows = o.node.hot_windows,
                                                     .threshold = o.residency_threshold},
                                                    *n->emb, n->events.get()));
  n->executor = std::make_unique<SimExecutor>(
      options, costs, compute, events,
      SimExecutor::Parts{.kv = n->kv.get(),
                         .emb = n->emb.get(),
                         .device = n->device.get(),
                         .sketch = n->sketch.get(),
                         .tracker = n->tracker.get(),
                         .shards = shards,
                         // Probes out of step from node to node and incarnation to incarnation.
                         .shard_client = shards != nullptr
                                             ? shards->NewClient(o.node.seed + (epoch << 32) + 1)
                                             : 0,
                         .sketcher = sketcher},
      clock);
  ASSIGN_OR_RETURN(n->node, serving::Node::Create(o.node,
                                                  {.executor = n->executor.get(),
                                                   .memory = n->memory.get(),
                                                   .kv = n->kv.get(),
                                                   .emb = n->emb.get(),
                                                   .device = n->device.get(),
                                                   .events = n->events.get(),
                                                   .residency = n->residency.get(),
                                                   .refiller = n->refiller.get(),
                                                   .tracker = n->tracker.get(),
                                                   .row_bytes = row_bytes,
                                                   .link_bytes_per_second = o.link.bytes_per_second,
                                                   .max_queue = o.queue.max_queue},
                                                  clock));
  return n;
}

void SimNode::Start() {
  memory->Start();
  node->Start();
}

SimNode::~SimNode() {
  if (node != nullptr) node->Stop();
  if (memory != nullptr) memory->Stop();
  if (refiller != nullptr) refiller->Cancel();
}

}  // namespace hlem::sim
