#pragma once
// The one place where absl::Status meets grpc::Status, and absl::Time meets gRPC deadlines.
// Service shells convert at the boundary; cores never see gRPC types. Stateless, thread-safe.

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "grpcpp/client_context.h"
#include "grpcpp/server_context.h"
#include "grpcpp/support/status.h"

namespace hlem {

// Same code (the canonical codes are numerically identical) and message. Payloads are dropped.
grpc::Status ToGrpcStatus(const absl::Status& status);
// Codes outside the canonical range become UNKNOWN.
absl::Status FromGrpcStatus(const grpc::Status& status);

// The client's deadline for this call, or InfiniteFuture when it set none.
absl::Time DeadlineOf(const grpc::ServerContext& context);
// Sets the call deadline; InfiniteFuture leaves the call without one.
void SetDeadline(grpc::ClientContext& context, absl::Time deadline);

}  // namespace hlem
