#include "common/grpc_health_probe.h"

#include "absl/strings/str_cat.h"
#include "common/grpc_server.h"
#include "common/grpc_status.h"
#include "grpcpp/client_context.h"

namespace hlem {

std::shared_ptr<grpc::health::v1::Health::Stub> GrpcHealthProbe::Stub(const std::string& address) {
  absl::MutexLock lock(&mu_);
  auto& stub = stubs_[address];
  if (stub == nullptr) stub = grpc::health::v1::Health::NewStub(MakeChannel(address, channel_));
  return stub;
}

absl::Status GrpcHealthProbe::Check(const std::string& address, absl::Duration timeout) {
  grpc::ClientContext ctx;
  ctx.set_deadline(absl::ToChronoTime(absl::Now() + timeout));
  grpc::health::v1::HealthCheckResponse response;
  const grpc::Status st = Stub(address)->Check(&ctx, {}, &response);
  if (!st.ok()) {
    return absl::UnavailableError(
        absl::StrCat(address, ": health check failed: ", FromGrpcStatus(st).ToString()));
  }
  if (response.status() != grpc::health::v1::HealthCheckResponse::SERVING) {
    return absl::UnavailableError(
        absl::StrCat(address, ": ",
                     grpc::health::v1::HealthCheckResponse::ServingStatus_Name(response.status())));
  }
  return absl::OkStatus();
}

}  // namespace hlem
