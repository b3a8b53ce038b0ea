#pragma once
// HealthProbe over the standard gRPC health service (grpc.health.v1.Health/Check, the server's
// overall status), with one channel per address kept for later probes.

#include <memory>
#include <string>

#include "absl/container/flat_hash_map.h"
#include "absl/synchronization/mutex.h"
#include "common/grpc_server.h"
#include "common/membership.h"
#include "grpc/health/v1/health.grpc.pb.h"

namespace hlem {

class GrpcHealthProbe final : public HealthProbe {
 public:
  // The channels' TLS and token (plaintext by default: the health port, tests).
  explicit GrpcHealthProbe(ChannelOptions channel = {}) : channel_(std::move(channel)) {}
  // OK when the server answers SERVING; UNAVAILABLE with the reason otherwise.
  absl::Status Check(const std::string& address, absl::Duration timeout) override;

 private:
  std::shared_ptr<grpc::health::v1::Health::Stub> Stub(const std::string& address);
  const ChannelOptions channel_;
  absl::Mutex mu_;
  absl::flat_hash_map<std::string, std::shared_ptr<grpc::health::v1::Health::Stub>> stubs_
      ABSL_GUARDED_BY(mu_);
};

}  // namespace hlem
