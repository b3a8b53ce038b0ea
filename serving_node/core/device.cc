#include "serving_node/core/device.h"

#include <memory>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"

namespace hlem::serving {

const char* CopyPurposeName(CopyPurpose purpose) {
  switch (purpose) {
    case CopyPurpose::kEmbMiss:
      return "emb_miss";
    case CopyPurpose::kEmbRefill:
      return "emb_refill";
    case CopyPurpose::kKv:
      return "kv";
    case CopyPurpose::kOther:
      return "other";
  }
  return "?";
}

namespace {

// Rows of `row_bytes` (> 0) at pool_offsets must lie in the pool; `op` names the call.
absl::Status CheckRowsInPool(const char* op, uint64_t pool_bytes,
                             std::span<const uint64_t> pool_offsets, uint32_t row_bytes) {
  if (row_bytes == 0) {
    return absl::InvalidArgumentError(absl::StrCat(op, ": row_bytes must be positive"));
  }
  for (size_t i = 0; i < pool_offsets.size(); ++i) {
    if (pool_offsets[i] > pool_bytes || row_bytes > pool_bytes - pool_offsets[i]) {
      return absl::InvalidArgumentError(absl::StrCat(op, ": row ", i, " at offset ",
                                                     pool_offsets[i], " leaves the ", pool_bytes,
                                                     "-byte pool"));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status CheckRows(uint64_t pool_bytes, std::span<const uint64_t> pool_offsets,
                       uint32_t row_bytes) {
  return CheckRowsInPool("CopyRowsToPool", pool_bytes, pool_offsets, row_bytes);
}

void Device::CopyRowsToPool(CopyClass cls, CopyPurpose purpose, const std::byte* src,
                            std::span<const uint64_t> pool_offsets, uint32_t row_bytes,
                            size_t max_copy_bytes, std::function<void(absl::Status)> done) {
  if (absl::Status st = CheckRows(pool_bytes(), pool_offsets, row_bytes); !st.ok()) {
    done(st);
    return;
  }
  // One done for every run: the first error wins; the last run to finish reports.
  struct Runs {
    absl::Mutex mu;
    size_t left ABSL_GUARDED_BY(mu) = 1;  // a guard until every run is issued
    absl::Status status ABSL_GUARDED_BY(mu);
    std::function<void(absl::Status)> done;
  };
  auto runs = std::make_shared<Runs>();
  runs->done = std::move(done);
  auto finish = [runs](absl::Status st) {
    bool last;
    {
      absl::MutexLock lock(&runs->mu);
      if (runs->status.ok()) runs->status = st;
      last = --runs->left == 0;
    }
    if (last) runs->done(runs->status);
  };
  const size_t n = pool_offsets.size();
  for (size_t begin = 0, i = 1; i <= n; ++i) {
    if (i < n && pool_offsets[i] == pool_offsets[i - 1] + row_bytes &&
        (i - begin) * row_bytes < max_copy_bytes) {
      continue;
    }
    {
      absl::MutexLock lock(&runs->mu);
      ++runs->left;
    }
    CopyToPool(cls, purpose, src + begin * row_bytes, pool_offsets[begin], (i - begin) * row_bytes,
               finish);
    begin = i;
  }
  finish(absl::OkStatus());
}

absl::Status CheckBufferRange(const char* op, const DeviceBuffer& buffer, size_t offset,
                              size_t bytes) {
  if (offset > buffer.size() || bytes > buffer.size() - offset) {
    return absl::InvalidArgumentError(absl::StrCat(op, ": ", bytes, " bytes at offset ", offset,
                                                   " leave the ", buffer.size(), "-byte buffer"));
  }
  return absl::OkStatus();
}

absl::Status CheckGather(uint64_t pool_bytes, std::span<const uint64_t> pool_offsets,
                         uint32_t row_bytes, size_t dst_bytes) {
  if (absl::Status st = CheckRowsInPool("GatherRows", pool_bytes, pool_offsets, row_bytes);
      !st.ok()) {
    return st;
  }
  if (pool_offsets.size() > dst_bytes / row_bytes) {
    return absl::InvalidArgumentError(absl::StrCat("GatherRows: ", pool_offsets.size(), " rows of ",
                                                   row_bytes, " bytes do not fit a buffer of ",
                                                   dst_bytes));
  }
  return absl::OkStatus();
}

absl::Status CheckSum(uint64_t pool_bytes, std::span<const uint64_t> sources, uint32_t per_token,
                      uint32_t dim, size_t extra_bytes, size_t dst_bytes) {
  if (per_token == 0 || dim == 0) {
    return absl::InvalidArgumentError("SumRows: per_token and dim must be positive");
  }
  if (sources.empty() || sources.size() % per_token != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("SumRows: ", sources.size(), " sources are not whole tokens of ", per_token));
  }
  const uint64_t row_bytes = uint64_t{dim} * sizeof(float);
  for (size_t i = 0; i < sources.size(); ++i) {
    const bool in_buffer = (sources[i] & kRowInBuffer) != 0;
    const uint64_t offset = sources[i] & ~kRowInBuffer;
    const uint64_t limit = in_buffer ? extra_bytes : pool_bytes;
    if (offset % sizeof(float) != 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("SumRows: source ", i, " at offset ", offset, " is not 4-byte aligned"));
    }
    if (offset > limit || row_bytes > limit - offset) {
      return absl::InvalidArgumentError(absl::StrCat("SumRows: source ", i, " at offset ", offset,
                                                     " leaves the ", limit, "-byte ",
                                                     in_buffer ? "extra buffer" : "pool"));
    }
  }
  const uint64_t tokens = sources.size() / per_token;
  if (tokens > dst_bytes / row_bytes) {
    return absl::InvalidArgumentError(absl::StrCat("SumRows: ", tokens, " sums of ", row_bytes,
                                                   " bytes do not fit a buffer of ", dst_bytes));
  }
  return absl::OkStatus();
}

absl::Status CheckScatter(uint64_t pool_bytes, const KvGeometry& g,
                          std::span<const uint64_t> page_offsets, std::span<const uint32_t> slots,
                          size_t src_bytes) {
  if (page_offsets.size() != slots.size()) {
    return absl::InvalidArgumentError(absl::StrCat("ScatterKv: ", page_offsets.size(),
                                                   " page offsets but ", slots.size(), " slots"));
  }
  if (g.token_bytes() == 0 || g.page_tokens == 0 ||
      uint64_t{g.page_tokens} * g.token_bytes() > g.page_bytes) {
    return absl::InvalidArgumentError("ScatterKv: the geometry holds no token per page");
  }
  if (page_offsets.size() > src_bytes / g.token_bytes()) {
    return absl::InvalidArgumentError(absl::StrCat("ScatterKv: ", page_offsets.size(),
                                                   " tokens of ", g.token_bytes(),
                                                   " bytes exceed a source of ", src_bytes));
  }
  for (size_t t = 0; t < slots.size(); ++t) {
    if (slots[t] >= g.page_tokens) {
      return absl::InvalidArgumentError(absl::StrCat("ScatterKv: token ", t, " slot ", slots[t],
                                                     " is past the page's ", g.page_tokens));
    }
    if (page_offsets[t] > pool_bytes || g.page_bytes > pool_bytes - page_offsets[t]) {
      return absl::InvalidArgumentError(absl::StrCat("ScatterKv: token ", t, " page at offset ",
                                                     page_offsets[t], " leaves the ", pool_bytes,
                                                     "-byte pool"));
    }
  }
  return absl::OkStatus();
}

}  // namespace hlem::serving
