#include "common/grpc_status.h"

#include <chrono>
#include <string>

namespace hlem {

grpc::Status ToGrpcStatus(const absl::Status& status) {
  if (status.ok()) return grpc::Status::OK;
  return grpc::Status(static_cast<grpc::StatusCode>(status.code()), std::string(status.message()));
}

absl::Status FromGrpcStatus(const grpc::Status& status) {
  if (status.ok()) return absl::OkStatus();
  int code = static_cast<int>(status.error_code());
  if (code < 0 || code > static_cast<int>(absl::StatusCode::kUnauthenticated)) {
    return absl::UnknownError(status.error_message());
  }
  return absl::Status(static_cast<absl::StatusCode>(code), status.error_message());
}

absl::Time DeadlineOf(const grpc::ServerContext& context) {
  // gRPC reports "no deadline" as time_point::max() (a far-future timespec for some transports);
  // anything beyond a century is treated the same.
  auto deadline = context.deadline();
  if (deadline == std::chrono::system_clock::time_point::max()) return absl::InfiniteFuture();
  absl::Time t = absl::FromChrono(deadline);
  if (t > absl::Now() + absl::Hours(24 * 365 * 100)) return absl::InfiniteFuture();
  return t;
}

void SetDeadline(grpc::ClientContext& context, absl::Time deadline) {
  if (deadline == absl::InfiniteFuture()) return;
  context.set_deadline(absl::ToChronoTime(deadline));
}

}  // namespace hlem
