#pragma once
// The feature ids of hlem.v1 Events and Candidates as the wire holds them: one per feature table
// (GetNodeInfo.feature_tables), or none and the item id when the model has one table. Shared by
// the router's and the serving node's request decoding (common/feature_ids.h has the row check).

#include <cstdint>
#include <optional>
#include <span>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/feature_ids.h"
#include "google/protobuf/repeated_field.h"

namespace hlem {

// An entry's ids under the length rule (one per table, or none and the item id with one table,
// copied into `*item`, which the span then points at); nullopt when the entry breaks it.
template <typename Entry>
std::optional<std::span<const uint64_t>> EntryFeatureIds(const Entry& entry, size_t features,
                                                         uint64_t* item) {
  const auto& ids = entry.feature_ids();
  if (static_cast<size_t>(ids.size()) == features) {
    return std::span<const uint64_t>(ids.data(), features);
  }
  if (ids.empty() && features == 1) {
    *item = entry.item_id();
    return std::span<const uint64_t>(item, 1);
  }
  return std::nullopt;
}

// Checks every entry's count of ids (INVALID_ARGUMENT naming the entry), appending the ids in
// entry order to `out` when it is not null.
template <typename Entry>
absl::Status AppendFeatureIds(const google::protobuf::RepeatedPtrField<Entry>& entries,
                              size_t features, absl::string_view what, std::vector<uint64_t>* out) {
  if (out != nullptr) out->reserve(out->size() + entries.size() * features);
  for (int i = 0; i < entries.size(); ++i) {
    uint64_t item = 0;
    const std::optional<std::span<const uint64_t>> ids =
        EntryFeatureIds(entries[i], features, &item);
    if (!ids.has_value()) {
      return absl::InvalidArgumentError(absl::StrCat(
          what, "[", i, "].feature_ids: ", entries[i].feature_ids().size(), " ids; the model has ",
          features, " feature tables (GetNodeInfo.feature_tables)"));
    }
    if (out != nullptr) out->insert(out->end(), ids->begin(), ids->end());
  }
  return absl::OkStatus();
}

// Checks every entry's ids against their tables' rows (CheckEntryIdRows), in place. The entries'
// counts must have passed AppendFeatureIds.
template <typename Entry, typename Table>
absl::Status CheckFeatureIdRows(const google::protobuf::RepeatedPtrField<Entry>& entries,
                                std::span<const Table> tables, absl::string_view what) {
  for (int i = 0; i < entries.size(); ++i) {
    uint64_t item = 0;
    const std::optional<std::span<const uint64_t>> ids =
        EntryFeatureIds(entries[i], tables.size(), &item);
    if (!ids.has_value()) continue;  // AppendFeatureIds refuses it
    if (absl::Status st = CheckEntryIdRows(*ids, tables, what, static_cast<size_t>(i)); !st.ok()) {
      return st;
    }
  }
  return absl::OkStatus();
}

}  // namespace hlem
