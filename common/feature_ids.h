#pragma once
// Feature ids of a request's entries (history events, candidates): each entry carries one id per
// feature table, in the tables' order, and each id must be below its table's rows. The checks
// every service makes (router, serving node, the twin's node), so that they refuse the same
// requests with the same messages. The protobuf side (an entry's ids as the wire holds them) is
// in common/feature_ids_proto.h.

#include <algorithm>
#include <cstdint>
#include <span>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"

namespace hlem {

// OUT_OF_RANGE naming the first of entry `index`'s ids (one per table of `tables`, in order) at
// or beyond its table's rows, as "<what>[<index>].feature_ids[<f>]: id … >= table …'s … rows".
// `Table` is any type with `table_id` and `rows` members.
template <typename Table>
absl::Status CheckEntryIdRows(std::span<const uint64_t> ids, std::span<const Table> tables,
                              absl::string_view what, size_t index) {
  for (size_t f = 0; f < ids.size() && f < tables.size(); ++f) {
    if (ids[f] >= tables[f].rows) {
      return absl::OutOfRangeError(absl::StrCat(what, "[", index, "].feature_ids[", f, "]: id ",
                                                ids[f], " >= table ", tables[f].table_id, "'s ",
                                                tables[f].rows, " rows"));
    }
  }
  return absl::OkStatus();
}

// The same over entries laid out one after another (tables.size() ids each), the first failure.
template <typename Table>
absl::Status CheckIdRows(std::span<const uint64_t> ids, std::span<const Table> tables,
                         absl::string_view what) {
  const size_t F = tables.size();
  if (F == 0) return absl::OkStatus();
  for (size_t e = 0; e * F < ids.size(); ++e) {
    if (absl::Status st =
            CheckEntryIdRows(ids.subspan(e * F, std::min(F, ids.size() - e * F)), tables, what, e);
        !st.ok()) {
      return st;
    }
  }
  return absl::OkStatus();
}

}  // namespace hlem
