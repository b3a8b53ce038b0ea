#pragma once
// One Infer on a serving node (ARCHITECTURE §2), without RPC: the code between the gRPC handler
// and the memory system and model.
//
//   1. Check the request (candidates, feature ids, deadline) and cut the history window: beyond
//      max_history events the oldest are left out, the window start moving in steps of
//      trim_fraction · max_history, so a growing history costs one recompute per step rather
//      than one per request.
//   2. Pin the user; KvCache::Lookup gives the reusable prefix C (a changed history evicts the
//      stale K/V: it is never served); Append reserves the slots of the new tokens
//      (compare-and-set: a concurrent request of the same user makes this one retry).
//   3. Embeddings of the new history tokens and the candidates only: per feature table the
//      distinct ids are looked up in the EMB cache; misses (and rows another request is still
//      copying) are fetched from the RowSource (the shard client) in one call per table; misses
//      are admitted (ReserveBatch, critical copies over the link, Commit) and the request waits
//      for its copies; rows the cache did not take cross the link into a request buffer;
//      Device::SumRows adds each token's feature rows where they lie (pool slots, that buffer)
//      into the model's input in device memory.
//   4. ModelRunner::Run computes the new tokens and the candidates and writes the new K/V into
//      the reserved slots; CommitAppend makes them the user's prefix; Unpin.
//
// Every path answers exactly once; on any failure after Append the append is aborted and the pin
// released. Thread-safe: concurrent Infer calls share the caches (which are thread-safe) and the
// model runner (which must be).

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/clock.h"
#include "serving_node/core/device.h"
#include "serving_node/core/emb_cache.h"
#include "serving_node/core/kv_cache.h"
#include "serving_node/core/model_runner.h"
#include "serving_node/core/popularity.h"
#include "serving_node/core/row_source.h"

namespace hlem::serving {

// One feature of a token: the table its ids index and how many rows that table has.
struct FeatureSpec {
  uint32_t table_id = 0;
  uint64_t rows = 0;
};

struct PipelineOptions {
  std::vector<FeatureSpec> features;  // F features per token, in this order
  uint32_t max_candidates = 512;
  uint32_t max_history = 4096;  // events in the window (< the model's max_positions)
  double trim_fraction = 0.1;   // the window start moves in steps of this share of max_history
  // Events one request may carry (full mode: the whole history; longer windows are trimmed, but
  // a request past this is INVALID_ARGUMENT).
  uint32_t max_request_events = 1 << 16;
  absl::Duration copy_timeout = absl::Seconds(10);  // waiting for the device (a stuck link)
  uint64_t max_copy_bytes = 1 << 20;  // largest single miss copy (runs of consecutive slots)
  int append_attempts = 3;            // Append conflicts with a concurrent request of the same user
  // Called with every deduplicated EMB lookup batch (one table's distinct rows), e.g.
  // ResidencyTracker::Record. Optional; must be thread-safe.
  std::function<void(uint32_t table_id, std::span<const uint64_t> rows)> on_lookup;
};

// Names a prefix of a client's full history (before window trimming): its length in events and
// the rolling hash (KvHashExtend) of the events' EventTokens. Clients treat it as opaque.
struct ClientPrefix {
  uint64_t len = 0;
  uint64_t hash = kKvHashSeed;
  bool operator==(const ClientPrefix&) const = default;
};

struct InferInput {
  uint64_t user = 0;
  // Feature ids, event-major: event j's feature f is history[j · F + f]; oldest event first.
  // Full mode: the whole history. Delta mode: only the events after `delta`.
  std::vector<uint64_t> history;
  std::vector<uint64_t> candidates;  // candidate c's feature f at candidates[c · F + f]
  bool expected_kv_resident = false;
  absl::Time deadline = absl::InfiniteFuture();  // on the pipeline's clock
  // Delta mode: the client's full history is this prefix followed by `history`. Served only when
  // the node's last answer for the user named exactly this prefix (InferOutput::next_prefix), the
  // user's K/V still cover it, and the window does not move.
  std::optional<ClientPrefix> delta;
  // The digital twin only (sim/workload/history_sketch.h): events after `delta` that `history`
  // leaves out, sketched by the twin instead of carried. Its history is events delta->len …
  // delta->len + omitted_events − 1, then `history`. The real node refuses a request with any.
  uint64_t omitted_events = 0;
};

struct InferOutput {
  std::vector<float> scores;  // candidate-major: scores[c · targets + t]
  uint32_t targets = 0;
  uint32_t cached_prefix_tokens = 0;  // history tokens whose K/V were reused
  uint32_t computed_tokens = 0;       // new history tokens + candidates
  uint32_t history_tokens = 0;        // in the window
  uint32_t trimmed_events = 0;        // left out by the window
  uint64_t emb_hits = 0;              // distinct rows served by the EMB cache
  uint64_t emb_misses = 0;            // distinct rows fetched
  bool stale_kv_hit = false;          // expected resident, no usable prefix
  ClientPrefix next_prefix;           // the client's full history including this request
  absl::Duration emb_seconds;         // lookups, fetches, copies, gather (all of the below)
  absl::Duration fetch_seconds;       //   fetching missed rows from the row source
  absl::Duration copy_seconds;        //   miss copies to the device, gather, feature sums
  absl::Duration compute_seconds;     // the model (its K/V writes into the pages included)
  absl::Duration kv_seconds;          // KV prefix lookup, slot reservation, commit
};

class Pipeline {
 public:
  // INVALID_ARGUMENT (naming the field) when there is no feature, a feature's table is unknown
  // to the EMB cache or its rows are not model-dim fp32, max_history does not fit the model's
  // positions, trim_fraction is outside (0, 1], or the KV cache's layout is not the model's.
  // `pool` is the pool as the model runner addresses it (CpuDevice::pool_data()); `sketch` may be
  // null. Everything is borrowed and must outlive the pipeline.
  static absl::StatusOr<std::unique_ptr<Pipeline>> Create(const PipelineOptions& options,
                                                          KvCache& kv, EmbCache& emb,
                                                          Device& device, std::byte* pool,
                                                          RowSource& source, ModelRunner& model,
                                                          PopularitySketch* sketch, Clock& clock);

  // INVALID_ARGUMENT (no or too many candidates, ragged feature ids), OUT_OF_RANGE (an id past
  // its table), DEADLINE_EXCEEDED (before any compute), RESOURCE_EXHAUSTED (no KV room: every
  // other user pinned), UNAVAILABLE (a fetch failed), ABORTED (the user's appends kept
  // conflicting), FAILED_PRECONDITION (delta mode and the node cannot serve the named prefix:
  // resend the full history), INTERNAL (the device or the model failed).
  absl::StatusOr<InferOutput> Infer(const InferInput& in);
  // Requests that arrived together, run through the model in one ModelRunner::Run: each is
  // prepared (steps 1-3) alone, so a bad or failing request gets its own error and the others
  // go on; a request whose user is already in the batch runs in a later round, after the
  // earlier one's K/V are committed (it then reuses them). results[i] answers batch[i].
  std::vector<absl::StatusOr<InferOutput>> InferBatch(std::span<const InferInput> batch);

  // The checks Infer makes before any work (candidates, feature ids, ranges), with its codes.
  absl::Status Check(const InferInput& in) const;

  const PipelineOptions& options() const { return options_; }
  uint32_t targets() const { return model_.targets(); }
  // Events left out of a full history of `events` events (the window start).
  uint64_t WindowStart(uint64_t events) const;

 private:
  Pipeline(const PipelineOptions& options, KvCache& kv, EmbCache& emb, Device& device,
           std::byte* pool, RowSource& source, ModelRunner& model, PopularitySketch* sketch,
           Clock& clock);
  struct Prepared;
  // Steps 1-3 of one request; on an error nothing stays pinned or reserved.
  absl::Status Prepare(const InferInput& in, Prepared* p);
  // Commits (or aborts) the request's append and unpins its user.
  void Release(Prepared& p, bool commit);
  class CopyWaiter;
  struct Admitted {  // rows of one table given slots, committed once their copies landed
    uint32_t table;
    std::vector<uint64_t> rows;
  };
  static absl::Status Settle(EmbCache& emb, const std::vector<Admitted>& admitted,
                             const absl::Status& copy_error);
  // Reserves EMB slots for a table's missed rows (fetched[miss_at[i]] holds miss_rows[i]) and
  // copies the reserved ones over the link as critical transfers; (*slot)[miss_at[i]] is the
  // pool offset a reserved row lands at (left kEmbMiss for a row the cache did not take).
  void CopyMisses(uint32_t table, std::span<const uint64_t> miss_rows,
                  std::span<const size_t> miss_at, std::span<const std::byte> fetched,
                  CopyWaiter* copies, std::vector<uint64_t>* slot, std::vector<Admitted>* admitted);
  // The model's input for the tokens of `ids` (F per token): each token's feature rows summed on
  // the device (Device::SumRows) into *sums, tokens × dim floats in device memory.
  absl::Status Embed(std::span<const uint64_t> ids, absl::Time deadline, InferOutput* info,
                     std::unique_ptr<DeviceBuffer>* sums);

  const PipelineOptions options_;
  KvCache& kv_;
  EmbCache& emb_;
  Device& device_;
  std::byte* const pool_;
  RowSource& source_;
  ModelRunner& model_;
  PopularitySketch* const sketch_;
  Clock& clock_;
  const uint32_t dim_;
  const uint32_t row_bytes_;

  // What the last answer for a user named, for delta mode: the client prefix, its window start,
  // and the K/V prefix it left cached. Dropped lazily (a delta request checks the KV cache).
  struct ClientState {
    ClientPrefix client;
    uint64_t first = 0;
    KvPrefix kv;
  };
  void RememberClient(uint64_t user, const ClientState& state);
  void ForgetClient(uint64_t user);
  absl::Mutex clients_mu_;  // lock order: clients_mu_ → KvCache
  absl::flat_hash_map<uint64_t, ClientState> clients_ ABSL_GUARDED_BY(clients_mu_);
};

// The KV identity of one event: a hash of its feature ids (what the rolling prefix hash chains).
uint64_t EventToken(std::span<const uint64_t> feature_ids);

// INVALID_ARGUMENT when a request has more events (history + omitted) or candidates than the
// options allow: CheckInferInput's count check, also run on a request before its ids are copied.
absl::Status CheckRequestCounts(const PipelineOptions& options, uint64_t events,
                                uint64_t candidates);

// Pipeline::Check's checks for these options (the simulator's executor makes them too).
// `omitted_ok`: the twin's executor takes InferInput::omitted_events; the real pipeline does not.
absl::Status CheckInferInput(const PipelineOptions& options, const InferInput& in,
                             bool omitted_ok = false);
// Pipeline::WindowStart for these options.
uint64_t WindowStart(const PipelineOptions& options, uint64_t events);

}  // namespace hlem::serving
