#include "serving_node/core/device.h"

#include "absl/strings/str_cat.h"

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
  if (row_bytes == 0) return absl::InvalidArgumentError("GatherRows: row_bytes must be positive");
  if (pool_offsets.size() > dst_bytes / row_bytes) {
    return absl::InvalidArgumentError(absl::StrCat("GatherRows: ", pool_offsets.size(), " rows of ",
                                                   row_bytes, " bytes do not fit a buffer of ",
                                                   dst_bytes));
  }
  for (size_t i = 0; i < pool_offsets.size(); ++i) {
    if (pool_offsets[i] > pool_bytes || row_bytes > pool_bytes - pool_offsets[i]) {
      return absl::InvalidArgumentError(absl::StrCat("GatherRows: row ", i, " at offset ",
                                                     pool_offsets[i], " leaves the ", pool_bytes,
                                                     "-byte pool"));
    }
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
