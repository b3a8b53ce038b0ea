#pragma once
// gRPC bootstrap shared by every binary: a public server (frontend-facing services, standard
// health checking, reflection) and an optional admin server on its own port (admin services are
// never registered on the public port), graceful shutdown on SIGTERM/SIGINT, and client channels
// with explicit message limits and keepalive.
//
//   int main() {
//     hlem::InstallShutdownSignals();             // first, before any thread exists
//     ... build cores and services ...
//     ASSIGN_OR_RETURN(auto server, hlem::GrpcServer::Create(opts, {&svc}, {&admin_svc}));
//     hlem::WaitForShutdownSignal(*server);      // drains, then returns
//   }
//
// GrpcServer is thread-safe. The services must outlive it. Do not call
// grpc::reflection::InitProtoReflectionServerBuilderPlugin(): reflection is set per server here.

#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/grpc_security.h"
#include "grpcpp/channel.h"
#include "grpcpp/server.h"

namespace hlem {

class HealthPortService;  // grpc_server.cc

struct GrpcServerOptions {
  std::string listen = "127.0.0.1:0";  // frontend-facing services; port 0 picks a free one
  std::string admin_listen;            // "" = no admin port; "127.0.0.1:0" allowed
  // "" = none. A plaintext port serving only grpc.health.v1.Health, for Kubernetes probes (which
  // cannot speak TLS) and load balancers: "" and every public service name report the public
  // port's status (NOT_SERVING while draining: readiness); kLivenessService stays SERVING until
  // the process stops (liveness: a draining process is alive).
  std::string health_listen;
  int max_message_bytes = 64 << 20;  // send, and receive unless max_receive_bytes is set
  // The largest request accepted, 0 = max_message_bytes. gRPC parses a whole request before the
  // handler checks its counts, so this is what bounds the memory one request can take: size it
  // from the service's limits (common/request_limits.h). Larger requests get RESOURCE_EXHAUSTED.
  int max_receive_bytes = 0;
  absl::Duration keepalive_time = absl::Seconds(30), keepalive_timeout = absl::Seconds(10);
  absl::Duration max_connection_age = absl::Minutes(30),
                 max_connection_age_grace = absl::Seconds(30);
  absl::Duration drain_timeout = absl::Seconds(10);  // in-flight RPCs are cancelled after it
  bool reflection = true;                            // on both ports
  // Most threads each server (public, admin, health) runs handlers on (gRPC's ResourceQuota).
  // Beyond them a new call is refused at once with RESOURCE_EXHAUSTED "Server Threadpool
  // Exhausted" instead of getting a thread of its own: a flood of calls cannot grow the process
  // without bound (gRPC's sync server has no limit of its own). 0 = unbounded.
  int max_threads = 256;
  // TLS on the public and admin ports (the health port stays plaintext). Validate() it first.
  TlsConfig tls;
};

// The health service name a liveness probe asks for on the health port.
inline constexpr char kLivenessService[] = "liveness";
// Every binary's --health-listen help text (GrpcServerOptions::health_listen).
inline constexpr char kHealthListenHelp[] =
    "plaintext gRPC health-only address for probes ('' = off): service '' = ready, 'liveness' = "
    "alive";

class GrpcServer {
 public:
  // Starts serving and marks every service SERVING. UNAVAILABLE naming the address when a port
  // cannot be bound (ports are bound exclusively: no SO_REUSEPORT sharing).
  static absl::StatusOr<std::unique_ptr<GrpcServer>> Create(
      const GrpcServerOptions& options, std::vector<grpc::Service*> public_services,
      std::vector<grpc::Service*> admin_services = {});
  ~GrpcServer();  // Shutdown()

  int port() const { return port_; }
  int admin_port() const { return admin_port_; }    // 0 when there is no admin server
  int health_port() const { return health_port_; }  // 0 when there is no health server

  // Health status of "" and of every service name, on both ports.
  void SetServing(bool serving);
  // Graceful and idempotent: marks NOT_SERVING, stops accepting, waits for in-flight RPCs up to
  // drain_timeout, cancels the rest, returns. Concurrent callers all return when it is done.
  void Shutdown();
  // Blocks until Shutdown() has completed.
  void Wait();

 private:
  struct Endpoint {
    std::unique_ptr<grpc::Server> server;
    std::vector<std::string> service_names;
  };
  explicit GrpcServer(const GrpcServerOptions& options);  // out of line: HealthPortService
  // `health` = nullptr: gRPC's default health service; otherwise that service alone (the
  // default one is off there: a server without methods of its own cannot start).
  static absl::StatusOr<Endpoint> Build(const GrpcServerOptions& options,
                                        const std::string& address,
                                        const std::vector<grpc::Service*>& services, int* port,
                                        HealthPortService* health = nullptr);

  const GrpcServerOptions options_;
  std::unique_ptr<HealthPortService> health_service_;  // outlives the servers below
  Endpoint public_, admin_, health_;
  int port_ = 0;
  int admin_port_ = 0;
  int health_port_ = 0;
  absl::Mutex mu_;
  enum class State { kServing, kDraining, kStopped };
  State state_ ABSL_GUARDED_BY(mu_) = State::kServing;
};

// Blocks SIGTERM and SIGINT in the calling thread (and so in every thread it later starts) and
// starts a thread that waits for them with sigwait. Idempotent.
void InstallShutdownSignals();
// Blocks until SIGTERM/SIGINT arrives or RequestShutdown() is called (installing the signal
// handling if needed). Once requested, it returns immediately forever after.
void WaitForShutdownSignal();
// The same, then server.Shutdown().
void WaitForShutdownSignal(GrpcServer& server);
// Wakes WaitForShutdownSignal() from any thread.
void RequestShutdown();

struct ChannelOptions {
  int max_message_bytes = 64 << 20;  // send and receive
  TlsConfig tls;                     // off: plaintext
  // Sent as 'authorization: Bearer <token>' on every call (null: none). Re-read as the file
  // changes.
  std::shared_ptr<const TokenFile> token;
};

// A channel with explicit send/receive limits, keepalive (30 s ping, 10 s timeout), the given TLS
// and bearer token.
std::shared_ptr<grpc::Channel> MakeChannel(const std::string& target,
                                           const ChannelOptions& options);
// Plaintext without a token: tests and the plaintext health port.
std::shared_ptr<grpc::Channel> MakeChannel(const std::string& target,
                                           int max_message_bytes = 64 << 20);

}  // namespace hlem
