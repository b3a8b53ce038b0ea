#include "serving_node/core/pipeline.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <exception>
#include <functional>
#include <iterator>
#include <memory>
#include <optional>
#include <utility>

#include "absl/cleanup/cleanup.h"
#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/feature_ids.h"
#include "common/rng.h"
#include "common/status_macros.h"
#include "serving_node/core/table_key.h"

namespace hlem::serving {

uint64_t EventToken(std::span<const uint64_t> feature_ids) {
  uint64_t h = 0x6576656e74303031ULL;  // "event001"
  for (uint64_t id : feature_ids) h = Mix64(h ^ Mix64(id + 0x9e3779b97f4a7c15ULL));
  return h;
}

absl::StatusOr<std::unique_ptr<Pipeline>> Pipeline::Create(const PipelineOptions& options,
                                                           KvCache& kv, EmbCache& emb,
                                                           Device& device, std::byte* pool,
                                                           RowSource& source, ModelRunner& model,
                                                           PopularitySketch* sketch, Clock& clock) {
  if (options.features.empty()) return absl::InvalidArgumentError("pipeline.features: empty");
  for (size_t f = 0; f < options.features.size(); ++f) {
    const FeatureSpec& spec = options.features[f];
    std::optional<uint32_t> rb = emb.RowBytes(spec.table_id);
    if (!rb.has_value()) {
      return absl::InvalidArgumentError(absl::StrCat("pipeline.features[", f, "]: table ",
                                                     spec.table_id, " is not in the EMB cache"));
    }
    if (*rb != model.dim() * sizeof(float)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "pipeline.features[", f, "]: rows of table ", spec.table_id, " are ", *rb,
          " bytes; the model needs ", model.dim(), " fp32 (", model.dim() * sizeof(float), ")"));
    }
    if (spec.rows == 0) {
      return absl::InvalidArgumentError(absl::StrCat("pipeline.features[", f, "].rows: 0"));
    }
  }
  if (options.max_candidates == 0) {
    return absl::InvalidArgumentError("pipeline.max_candidates: must be > 0");
  }
  if (options.max_history == 0 || options.max_history >= model.max_positions()) {
    return absl::InvalidArgumentError(absl::StrCat("pipeline.max_history: ", options.max_history,
                                                   " must be in 1 .. ", model.max_positions() - 1,
                                                   " (the model's positions)"));
  }
  if (options.max_request_events < options.max_history) {
    return absl::InvalidArgumentError("pipeline.max_request_events: must be >= max_history");
  }
  if (!(options.trim_fraction > 0 && options.trim_fraction <= 1)) {
    return absl::InvalidArgumentError("pipeline.trim_fraction: must be in (0, 1]");
  }
  const KvGeometry& g = kv.layout();
  if (g.layers != model.layers() || g.kv_dim != model.kv_dim() || g.dtype_bytes != 4) {
    return absl::InvalidArgumentError(absl::StrCat(
        "kv_cache: layout (layers ", g.layers, ", kv_dim ", g.kv_dim, ", dtype_bytes ",
        g.dtype_bytes, ") is not the model's (", model.layers(), ", ", model.kv_dim(), ", 4)"));
  }
  if (pool == nullptr) return absl::InvalidArgumentError("pipeline: no pool address");
  return std::unique_ptr<Pipeline>(
      new Pipeline(options, kv, emb, device, pool, source, model, sketch, clock));
}

Pipeline::Pipeline(const PipelineOptions& options, KvCache& kv, EmbCache& emb, Device& device,
                   std::byte* pool, RowSource& source, ModelRunner& model, PopularitySketch* sketch,
                   Clock& clock)
    : options_(options),
      kv_(kv),
      emb_(emb),
      device_(device),
      pool_(pool),
      source_(source),
      model_(model),
      sketch_(sketch),
      clock_(clock),
      dim_(model.dim()),
      row_bytes_(model.dim() * sizeof(float)) {}

absl::Status Pipeline::Check(const InferInput& in) const { return CheckInferInput(options_, in); }

uint64_t WindowStart(const PipelineOptions& options, uint64_t events) {
  if (events <= options.max_history) return 0;
  const uint64_t step =
      std::max<uint64_t>(1, static_cast<uint64_t>(options.trim_fraction * options.max_history));
  return (events - options.max_history + step - 1) / step * step;
}

absl::Status CheckRequestCounts(const PipelineOptions& options, uint64_t events,
                                uint64_t candidates) {
  if (events > options.max_request_events) {
    return absl::InvalidArgumentError(absl::StrCat(
        "history: ", events, " events exceeds the limit ", options.max_request_events));
  }
  if (candidates > options.max_candidates) {
    return absl::InvalidArgumentError(
        absl::StrCat("candidates: ", candidates, " exceeds the limit ", options.max_candidates));
  }
  return absl::OkStatus();
}

absl::Status CheckInferInput(const PipelineOptions& options, const InferInput& in,
                             bool omitted_ok) {
  const size_t F = options.features.size();
  if (in.candidates.empty()) return absl::InvalidArgumentError("candidates: none");
  if (in.omitted_events > 0 && (!omitted_ok || !in.delta.has_value())) {
    return absl::InvalidArgumentError(
        "history: omitted events are the simulator's (a delta request of the twin) only");
  }
  if (in.candidates.size() % F != 0 || in.history.size() % F != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("feature ids: every event and candidate needs exactly ", F, " ids"));
  }
  if (absl::Status st = CheckRequestCounts(options, in.history.size() / F + in.omitted_events,
                                           in.candidates.size() / F);
      !st.ok()) {
    return st;
  }
  const std::span<const FeatureSpec> tables = options.features;
  if (absl::Status st = CheckIdRows<FeatureSpec>(in.history, tables, "history"); !st.ok()) {
    return st;
  }
  return CheckIdRows<FeatureSpec>(in.candidates, tables, "candidates");
}

// Waits for a set of device copies; records the first failure. Shared with the callbacks, which
// also keep their source bytes (and destination buffer) alive: after a timeout the request
// returns, and a late copy must still find them; Finally then settles what the request left.
class Pipeline::CopyWaiter : public std::enable_shared_from_this<CopyWaiter> {
 public:
  std::function<void(absl::Status)> Add(std::shared_ptr<const void> keep) {
    absl::MutexLock lock(&mu_);
    ++left_;
    return [self = shared_from_this(), keep = std::move(keep)](absl::Status st) {
      std::function<void(absl::Status)> finally;
      absl::Status error;
      {
        absl::MutexLock lock(&self->mu_);
        if (!st.ok() && self->error_.ok()) self->error_ = st;
        if (--self->left_ == 0 && self->finally_) {
          finally = std::move(self->finally_);
          self->finally_ = nullptr;
          error = self->error_;
        }
      }
      if (finally) finally(std::move(error));
    };
  }
  // False when the copies did not all complete within `timeout` (real time).
  bool Wait(absl::Duration timeout) {
    absl::MutexLock lock(&mu_);
    auto done = [this]() ABSL_SHARED_LOCKS_REQUIRED(mu_) { return left_ == 0; };
    return mu_.AwaitWithTimeout(absl::Condition(&done), timeout);
  }
  // Runs `fn` with the first failure (OK when none) once every copy has completed: at once, on
  // this thread, when they already have; otherwise on the thread of the last one (a device
  // thread, as the refill's commits). Once per waiter.
  void Finally(std::function<void(absl::Status)> fn) {
    absl::Status error;
    {
      absl::MutexLock lock(&mu_);
      if (left_ > 0) {
        finally_ = std::move(fn);
        return;
      }
      error = error_;
    }
    fn(std::move(error));
  }
  absl::Status error() {
    absl::MutexLock lock(&mu_);
    return error_;
  }

 private:
  absl::Mutex mu_;
  int64_t left_ ABSL_GUARDED_BY(mu_) = 0;
  absl::Status error_ ABSL_GUARDED_BY(mu_);
  std::function<void(absl::Status)> finally_ ABSL_GUARDED_BY(mu_);
};

// Commits the admitted rows when their copies landed (`copy_error` OK), else aborts them; every
// table's rows are settled and the first failure is returned.
absl::Status Pipeline::Settle(EmbCache& emb, const std::vector<Admitted>& admitted,
                              const absl::Status& copy_error) {
  absl::Status first;
  for (const Admitted& adm : admitted) {
    absl::Status st =
        copy_error.ok() ? emb.Commit(adm.table, adm.rows) : emb.Abort(adm.table, adm.rows);
    if (first.ok()) first = st;
  }
  return first;
}

void Pipeline::CopyMisses(uint32_t table, std::span<const uint64_t> miss_rows,
                          std::span<const size_t> miss_at, std::span<const std::byte> fetched,
                          CopyWaiter* copies, std::vector<uint64_t>* slot,
                          std::vector<Admitted>* admitted) {
  // RESOURCE_EXHAUSTED part-way leaves the rows before it reserved; the rest are used without
  // being cached.
  EmbReservation reservation;
  (void)emb_.ReserveBatch(table, miss_rows, &reservation);
  Admitted adm{table, {}};
  // The rows in slot order from one staging buffer, in one CopyRowsToPool: the cpu device issues
  // one copy per run of consecutive slots (a fresh slab hands out consecutive slots; every copy
  // pays the link's per-transfer latency), the cuda device one staged copy and a scatter kernel.
  std::vector<uint32_t> order(reservation.reserved_positions.begin(),
                              reservation.reserved_positions.end());
  std::sort(order.begin(), order.end(), [&](uint32_t a, uint32_t b) {
    return reservation.offsets[a] < reservation.offsets[b];
  });
  auto staging = std::make_shared<std::vector<std::byte>>(order.size() * row_bytes_);
  std::vector<uint64_t> slots(order.size());
  for (size_t i = 0; i < order.size(); ++i) {
    adm.rows.push_back(miss_rows[order[i]]);
    slots[i] = reservation.offsets[order[i]];
    (*slot)[miss_at[order[i]]] = slots[i];
    std::memcpy(staging->data() + i * row_bytes_, fetched.data() + miss_at[order[i]] * row_bytes_,
                row_bytes_);
  }
  if (!order.empty()) {
    device_.CopyRowsToPool(CopyClass::kCritical, CopyPurpose::kEmbMiss, staging->data(), slots,
                           row_bytes_, options_.max_copy_bytes, copies->Add(staging));
  }
  if (!adm.rows.empty()) admitted->push_back(std::move(adm));
}

absl::Status Pipeline::Embed(std::span<const uint64_t> ids, absl::Time deadline, InferOutput* info,
                             std::unique_ptr<DeviceBuffer>* sums) {
  const size_t F = options_.features.size(), tokens = ids.size() / F;
  // Distinct rows, grouped by table.
  absl::flat_hash_map<TableKey, uint32_t> index;
  std::vector<TableKey> distinct;
  std::vector<uint32_t> token_row(ids.size());
  absl::flat_hash_map<uint32_t, std::vector<uint32_t>> by_table;  // table -> distinct indices
  for (size_t i = 0; i < ids.size(); ++i) {
    const TableKey key{options_.features[i % F].table_id, ids[i]};
    auto [it, fresh] = index.emplace(key, static_cast<uint32_t>(distinct.size()));
    if (fresh) {
      distinct.push_back(key);
      by_table[key.table_id].push_back(it->second);
    }
    token_row[i] = it->second;
  }
  // Where each distinct row is read from by SumRows: its pool slot (a hit, or a miss admitted
  // below), or RowInBuffer(offset) in the request's buffer of rows used without caching them.
  std::vector<uint64_t> source(distinct.size(), kEmbMiss);
  // The rows the cache did not take (no room, or pending under another request's copy), from
  // every table: they still cross the link, in one staged copy (a device computes on device
  // memory). The shared struct keeps the host bytes and the buffer alive for a late copy.
  struct Uncached {
    std::vector<std::byte> bytes;
    std::unique_ptr<DeviceBuffer> buffer;
  };
  auto uncached = std::make_shared<Uncached>();
  std::vector<Admitted> admitted;
  auto copies = std::make_shared<CopyWaiter>();
  // The copies are waited for up to the request's deadline (copy_timeout bounds a wait on a clock
  // that does not run in real time, or a request without one).
  auto wait_copies = [&] {
    const absl::Duration to_deadline = deadline - clock_.Now();
    return copies->Wait(
        std::max(absl::ZeroDuration(), std::min(options_.copy_timeout, to_deadline)));
  };
  // Settles the rows admitted so far once their copies have completed, whenever that is (a slot
  // is never released under a copy still in flight): landed, they are committed (the bytes are
  // good for the next request), otherwise released. When the request gives up (a later table's
  // fetch failed, its deadline passed, the copies were stuck), it waits for its copies no longer
  // than its deadline; those still out settle on the device's thread as they land.
  auto settle_later = [this, copies, &admitted] {
    copies->Finally([emb = &emb_, admitted = std::move(admitted)](absl::Status copy_error) {
      (void)Settle(*emb, admitted, copy_error);
    });
  };
  auto abandon = [&](absl::Status st) {
    (void)wait_copies();
    settle_later();
    return st;
  };
  // The hits stay pinned until they are summed: this request's own admissions, the refill and
  // an α move would otherwise be free to hand their slots to other rows meanwhile.
  std::vector<uint32_t> pinned;  // EmbCache pin handles
  absl::Cleanup unpin = [&] {
    if (!pinned.empty()) (void)emb_.Unpin(pinned);
  };
  EmbLookupResult lookup;
  std::vector<std::byte> fetched;
  for (auto& [table, members] : by_table) {
    std::vector<uint64_t> rows(members.size());
    for (size_t k = 0; k < members.size(); ++k) rows[k] = distinct[members[k]].id;
    if (absl::Status st = emb_.Lookup(table, rows, &lookup, /*pin=*/true); !st.ok()) {
      return abandon(st);
    }
    pinned.insert(pinned.end(), lookup.pinned.begin(), lookup.pinned.end());
    if (sketch_ != nullptr) sketch_->RecordBatch(table, rows);
    if (options_.on_lookup) options_.on_lookup(table, rows);
    info->emb_hits += lookup.hits;
    for (size_t k = 0; k < rows.size(); ++k) {
      if (lookup.offsets[k] == kEmbMiss) continue;
      source[members[k]] = lookup.offsets[k];
    }
    // Misses, and rows another request is copying in (fetched too rather than waited for).
    std::vector<uint32_t> need;
    std::merge(lookup.miss_positions.begin(), lookup.miss_positions.end(),
               lookup.pending_positions.begin(), lookup.pending_positions.end(),
               std::back_inserter(need));
    if (need.empty()) continue;
    if (clock_.Now() >= deadline) {
      return abandon(absl::DeadlineExceededError("deadline passed before the embedding fetch"));
    }
    std::vector<uint64_t> fetch_rows(need.size());
    for (size_t k = 0; k < need.size(); ++k) fetch_rows[k] = rows[need[k]];
    fetched.resize(need.size() * row_bytes_);
    const absl::Time fetch_start = clock_.Now();
    const absl::Status fetch_status = source_.Fetch(table, fetch_rows, fetched, deadline);
    info->fetch_seconds += clock_.Now() - fetch_start;
    if (absl::Status st = fetch_status; !st.ok()) {
      return abandon(absl::UnavailableError(
          absl::StrCat("fetching ", need.size(), " rows of table ", table, ": ", st.message())));
    }
    info->emb_misses += need.size();
    // Admit the misses: reserve slots, copy them over the link as critical transfers.
    std::vector<uint64_t> miss_rows;
    std::vector<size_t> miss_at;  // index into `need` of each miss row
    for (size_t k = 0, m = 0; k < need.size(); ++k) {
      while (m < lookup.miss_positions.size() && lookup.miss_positions[m] < need[k]) ++m;
      if (m < lookup.miss_positions.size() && lookup.miss_positions[m] == need[k]) {
        miss_rows.push_back(fetch_rows[k]);
        miss_at.push_back(k);
      }
    }
    std::vector<uint64_t> slot(need.size(), kEmbMiss);  // where a reserved row lands
    if (!miss_rows.empty()) {
      CopyMisses(table, miss_rows, miss_at, fetched, copies.get(), &slot, &admitted);
    }
    for (size_t k = 0; k < need.size(); ++k) {
      uint64_t& s = source[members[need[k]]];
      if (slot[k] != kEmbMiss) {
        s = slot[k];
        continue;
      }
      s = RowInBuffer(uncached->bytes.size());
      uncached->bytes.insert(uncached->bytes.end(), fetched.begin() + k * row_bytes_,
                             fetched.begin() + (k + 1) * row_bytes_);
    }
  }
  if (!uncached->bytes.empty()) {
    absl::StatusOr<std::unique_ptr<DeviceBuffer>> buffer =
        device_.AllocBuffer(uncached->bytes.size());
    if (!buffer.ok()) return abandon(buffer.status());
    uncached->buffer = std::move(*buffer);
    device_.CopyToBuffer(CopyClass::kCritical, CopyPurpose::kEmbMiss, uncached->bytes.data(),
                         *uncached->buffer, 0, uncached->bytes.size(), copies->Add(uncached));
  }
  // The request's rows must be on the device before the sums.
  {
    const absl::Time copy_start = clock_.Now();
    absl::Cleanup copy_time = [&] { info->copy_seconds += clock_.Now() - copy_start; };
    if (!wait_copies()) {
      settle_later();
      if (clock_.Now() >= deadline) {
        return absl::DeadlineExceededError(
            "deadline passed while copying embedding rows to the device");
      }
      return absl::InternalError("embedding copies did not complete within copy_timeout");
    }
    const absl::Status copy_error = copies->error();
    if (absl::Status settled = Settle(emb_, admitted, copy_error); !settled.ok()) {
      return absl::InternalError(absl::StrCat("admitting rows: ", settled.message()));
    }
    if (!copy_error.ok()) {
      return absl::UnavailableError(
          absl::StrCat("copying embedding rows to the device: ", copy_error.message()));
    }
  }
  // e[t] = Σ_f row(f, t), on the device.
  std::vector<uint64_t> token_sources(ids.size());
  for (size_t i = 0; i < ids.size(); ++i) {
    token_sources[i] = source[token_row[i]];
    if (token_sources[i] == kEmbMiss) {
      return absl::InternalError("an embedding row was neither hit nor fetched");
    }
  }
  ASSIGN_OR_RETURN(*sums, device_.AllocBuffer(tokens * dim_ * sizeof(float)));
  RETURN_IF_ERROR(device_.SumRows(token_sources, static_cast<uint32_t>(F), dim_,
                                  uncached->buffer.get(), **sums));
  return device_.Synchronize();
}

struct Pipeline::Prepared {
  InferOutput out;
  uint64_t user = 0;
  uint64_t cached = 0;
  KvPrefix kv_prefix;                 // cached before this request
  uint64_t first = 0;                 // window start
  std::unique_ptr<DeviceBuffer> emb;  // the new history tokens' inputs, then the candidates'
  size_t history_tokens = 0, tokens = 0;
  std::vector<uint64_t> page_offsets;  // the user's block table
  std::optional<KvAppendResult> append;
};

uint64_t Pipeline::WindowStart(uint64_t events) const {
  return serving::WindowStart(options_, events);
}

void Pipeline::RememberClient(uint64_t user, const ClientState& state) {
  absl::MutexLock lock(&clients_mu_);
  clients_[user] = state;
  // Users whose K/V are gone keep stale entries until a sweep; sweeps are amortised O(1).
  if (clients_.size() > 2 * kv_.Stats().users_held + 1024) {
    absl::erase_if(clients_, [&](const auto& kv) { return kv_.cached_len(kv.first) == 0; });
  }
}

void Pipeline::ForgetClient(uint64_t user) {
  absl::MutexLock lock(&clients_mu_);
  clients_.erase(user);
}

absl::Status Pipeline::Prepare(const InferInput& in, Prepared* p) {
  RETURN_IF_ERROR(Check(in));
  if (clock_.Now() >= in.deadline) return absl::DeadlineExceededError("deadline passed on arrival");
  const size_t F = options_.features.size();
  const size_t events = in.history.size() / F, C_n = in.candidates.size() / F;

  // Delta mode: the events before the request's are the prefix the last answer named.
  ClientState before;
  if (in.delta.has_value()) {
    bool known = false;
    {
      absl::MutexLock lock(&clients_mu_);
      auto it = clients_.find(in.user);
      if (it != clients_.end() && it->second.client == *in.delta) {
        before = it->second;
        known = true;
      }
    }
    if (!known) {
      return absl::FailedPreconditionError(absl::StrCat(
          "delta: this node does not hold the prefix (length ", in.delta->len, ", hash ",
          in.delta->hash, ") of user ", in.user, "; resend the full history"));
    }
  }
  const uint64_t base = before.client.len;  // 0 in full mode
  const uint64_t H = base + events;
  // The window: the start moves in steps, so the cached prefix survives most requests.
  const uint64_t first = WindowStart(H);
  if (in.delta.has_value() && first != before.first) {
    return absl::FailedPreconditionError(absl::StrCat(
        "delta: the history window of user ", in.user, " moves from event ", before.first, " to ",
        first, " (max_history ", options_.max_history, "); resend the full history"));
  }
  std::vector<uint64_t> event_tokens(events);
  uint64_t client_hash = before.client.hash;
  for (size_t j = 0; j < events; ++j) {
    event_tokens[j] = EventToken(std::span<const uint64_t>(in.history).subspan(j * F, F));
    client_hash = KvHashExtend(client_hash, event_tokens[j]);
  }
  // The request's events inside the window: all of them in delta mode (base >= first).
  const size_t skip = static_cast<size_t>(first > base ? first - base : 0);
  const std::span<const uint64_t> tokens = std::span<const uint64_t>(event_tokens).subspan(skip);
  const uint64_t tokens_from = base + skip - first;  // window index of tokens[0]
  const uint64_t Hw = H - first;

  InferOutput& out = p->out;
  out.targets = model_.targets();
  out.history_tokens = static_cast<uint32_t>(Hw);
  out.trimmed_events = static_cast<uint32_t>(first);
  out.next_prefix = {.len = H, .hash = client_hash};
  p->user = in.user;
  p->first = first;
  kv_.Pin(in.user);
  absl::Cleanup release = [&] { Release(*p, /*commit=*/false); };

  // Prefix and slots for the new tokens; a concurrent append of the same user makes a full-mode
  // request retry.
  const absl::Time kv_start = clock_.Now();
  KvLookupResult prefix;
  for (int attempt = 0;; ++attempt) {
    if (in.delta.has_value()) {
      std::optional<KvLookupResult> held = kv_.LookupPrefix(in.user, before.kv, Hw);
      if (!held.has_value()) {
        return absl::FailedPreconditionError(
            absl::StrCat("delta: the cached K/V of user ", in.user,
                         " no longer hold the named prefix; resend the full history"));
      }
      prefix = std::move(*held);
    } else {
      prefix = kv_.Lookup(in.user, tokens);
    }
    // Stale: the router believed the user's K/V were here and the node held none. A prefix the
    // node held but could not use (an edited history, a moved window) is not the router's error.
    if (attempt == 0) {
      out.stale_kv_hit = in.expected_kv_resident && prefix.prefix.len == 0 && !prefix.evicted_stale;
    }
    if (prefix.prefix.len == Hw) break;  // everything cached: nothing to append
    absl::StatusOr<KvAppendResult> a =
        kv_.Append(in.user, prefix.prefix, tokens.subspan(prefix.prefix.len - tokens_from));
    if (a.ok()) {
      p->append = std::move(*a);
      break;
    }
    if (a.status().code() != absl::StatusCode::kFailedPrecondition) return a.status();
    if (in.delta.has_value()) {
      return absl::FailedPreconditionError(
          absl::StrCat("delta: a concurrent request of user ", in.user,
                       " changed the cached K/V; resend the full history"));
    }
    if (attempt + 1 >= options_.append_attempts) {
      return absl::AbortedError(absl::StrCat("user ", in.user, ": ", options_.append_attempts,
                                             " conflicting appends; retry"));
    }
    absl::SleepFor(absl::Milliseconds(1));  // the other request's append is committing
  }
  out.kv_seconds = clock_.Now() - kv_start;
  p->cached = prefix.prefix.len;
  p->kv_prefix = prefix.prefix;
  const size_t n = Hw - p->cached;

  // Embeddings of the new history tokens and the candidates.
  const absl::Time emb_start = clock_.Now();
  std::vector<uint64_t> ids;
  ids.reserve((n + C_n) * F);
  ids.insert(ids.end(), in.history.end() - n * F, in.history.end());
  ids.insert(ids.end(), in.candidates.begin(), in.candidates.end());
  RETURN_IF_ERROR(Embed(ids, in.deadline, &out, &p->emb));
  p->history_tokens = n;
  p->tokens = n + C_n;
  out.emb_seconds = clock_.Now() - emb_start;
  if (clock_.Now() >= in.deadline) {
    return absl::DeadlineExceededError("deadline passed before compute");
  }

  // The block table: the prefix's pages, then the pages the append reserved.
  const uint64_t page_bytes = kv_.layout().page_bytes;
  for (PageId page : prefix.pages) p->page_offsets.push_back(page_bytes * page);
  if (p->append.has_value()) {
    for (const KvSlotRun& run : p->append->runs) {
      const uint64_t off = page_bytes * run.page;
      if (p->page_offsets.empty() || p->page_offsets.back() != off) p->page_offsets.push_back(off);
    }
  }
  out.scores.resize(C_n * out.targets);
  out.cached_prefix_tokens = static_cast<uint32_t>(p->cached);
  out.computed_tokens = static_cast<uint32_t>(n + C_n);
  std::move(release).Cancel();
  return absl::OkStatus();
}

void Pipeline::Release(Prepared& p, bool commit) {
  if (commit) {
    // What this answer names for delta mode: the prefix the user's K/V now hold. CommitAppend
    // ABORTED: the user's KV was dropped meanwhile (the pinned pages stayed intact, so the scores
    // stand); nothing is cached and delta mode is off for the user.
    KvPrefix held = p.kv_prefix;
    bool cached = true;
    if (p.append.has_value()) {
      cached = kv_.CommitAppend(p.user, p.append->prefix).ok();
      held = p.append->prefix;
    }
    if (cached) {
      RememberClient(p.user, {.client = p.out.next_prefix, .first = p.first, .kv = held});
    } else {
      ForgetClient(p.user);
    }
  } else if (p.append.has_value()) {
    (void)kv_.AbortAppend(p.user, p.append->prefix);
  }
  p.append.reset();
  (void)kv_.Unpin(p.user);
}

absl::StatusOr<InferOutput> Pipeline::Infer(const InferInput& in) {
  return std::move(InferBatch(std::span<const InferInput>(&in, 1))[0]);
}

std::vector<absl::StatusOr<InferOutput>> Pipeline::InferBatch(std::span<const InferInput> batch) {
  std::vector<absl::StatusOr<InferOutput>> results(batch.size(), absl::InternalError("not run"));
  std::vector<size_t> waiting(batch.size());
  for (size_t i = 0; i < batch.size(); ++i) waiting[i] = i;
  while (!waiting.empty()) {
    // One round: at most one request per user.
    std::vector<size_t> round, later;
    absl::flat_hash_set<uint64_t> users;
    for (size_t i : waiting) (users.insert(batch[i].user).second ? round : later).push_back(i);
    std::vector<Prepared> prepared(round.size());
    std::vector<size_t> ready;  // indices into round
    for (size_t r = 0; r < round.size(); ++r) {
      absl::Status st = Prepare(batch[round[r]], &prepared[r]);
      if (st.ok()) {
        ready.push_back(r);
      } else {
        results[round[r]] = st;
      }
    }
    if (!ready.empty()) {
      std::vector<ModelStep> steps;
      for (size_t r : ready) {
        Prepared& p = prepared[r];
        // The inputs in device memory, as the runner addresses it (host memory on `cpu`).
        const float* emb = reinterpret_cast<const float*>(p.emb->data());
        const size_t history = p.history_tokens * dim_;
        steps.push_back({.kv = {kv_.layout(), pool_, p.page_offsets},
                         .cached_len = p.cached,
                         .new_history_emb = {emb, history},
                         .candidate_emb = {emb + history, p.tokens * dim_ - history},
                         .scores = p.out.scores});
      }
      const absl::Time compute_start = clock_.Now();
      absl::Status st;
      try {
        st = model_.Run(steps);
      } catch (const std::exception& e) {
        // libtorch reports a failed check or allocation by throwing (c10::Error, bad_alloc):
        // the batch fails like any runner error and the node goes on.
        st = absl::InternalError(absl::StrCat("the runner threw: ", e.what()));
      }
      const absl::Duration compute = clock_.Now() - compute_start;
      for (size_t r : ready) {
        const absl::Time commit_start = clock_.Now();
        Release(prepared[r], st.ok());
        prepared[r].out.kv_seconds += clock_.Now() - commit_start;
        if (st.ok()) {
          prepared[r].out.compute_seconds = compute;
          results[round[r]] = std::move(prepared[r].out);
        } else {
          results[round[r]] = absl::InternalError(absl::StrCat("model: ", st.message()));
        }
      }
    }
    waiting = std::move(later);
  }
  return results;
}

}  // namespace hlem::serving
