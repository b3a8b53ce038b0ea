#pragma once
// Status propagation macros in the style of abseil's internal ones.
//   RETURN_IF_ERROR(expr);              returns the status when it is not OK.
//   ASSIGN_OR_RETURN(lhs, expr);        lhs = value of a StatusOr, or returns its status.

#include "absl/status/status.h"
#include "absl/status/statusor.h"

#define HLEM_STATUS_CONCAT_INNER(a, b) a##b
#define HLEM_STATUS_CONCAT(a, b) HLEM_STATUS_CONCAT_INNER(a, b)

#define RETURN_IF_ERROR(expr)                    \
  do {                                           \
    ::absl::Status hlem_status_ = (expr);        \
    if (!hlem_status_.ok()) return hlem_status_; \
  } while (0)

#define ASSIGN_OR_RETURN(lhs, expr) \
  HLEM_ASSIGN_OR_RETURN_IMPL(HLEM_STATUS_CONCAT(hlem_statusor_, __LINE__), lhs, expr)

#define HLEM_ASSIGN_OR_RETURN_IMPL(statusor, lhs, expr)    \
  auto statusor = (expr);                                  \
  if (!statusor.ok()) return std::move(statusor).status(); \
  lhs = std::move(statusor).value()
