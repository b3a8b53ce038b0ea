#include "common/grpc_server.h"

#include <pthread.h>
#include <signal.h>

#include <algorithm>
#include <climits>
#include <mutex>
#include <thread>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/ext/health_check_service_server_builder_option.h"
#include "grpcpp/ext/proto_server_reflection_plugin.h"
#include "grpcpp/health_check_service_interface.h"
#include "grpcpp/impl/server_builder_option.h"
#include "grpcpp/impl/server_builder_plugin.h"
#include "grpcpp/impl/server_initializer.h"
#include "grpcpp/resource_quota.h"
#include "grpcpp/security/credentials.h"
#include "grpcpp/security/server_credentials.h"
#include "grpcpp/server_builder.h"
#include "grpcpp/support/client_interceptor.h"

namespace hlem {
namespace {

int Millis(absl::Duration d) {
  return static_cast<int>(std::clamp<int64_t>(absl::ToInt64Milliseconds(d), 0, INT_MAX));
}

// grpc::Service does not expose its name; a plugin sees the server's service list.
class ServiceNamesPlugin : public grpc::ServerBuilderPlugin {
 public:
  explicit ServiceNamesPlugin(std::vector<std::string>* out) : out_(out) {}
  std::string name() override { return "hlem_service_names"; }
  void InitServer(grpc::ServerInitializer*) override {}
  void Finish(grpc::ServerInitializer* si) override { *out_ = *si->GetServiceList(); }
  void ChangeArguments(const std::string&, void*) override {}

 private:
  std::vector<std::string>* out_;
};

// Linking grpc++_reflection installs reflection on every server through a global plugin list;
// this option makes it per server: removes it, or adds it exactly once.
class PluginsOption : public grpc::ServerBuilderOption {
 public:
  PluginsOption(bool reflection, std::vector<std::string>* names)
      : reflection_(reflection), names_(names) {}
  void UpdateArguments(grpc::ChannelArguments*) override {}
  void UpdatePlugins(std::vector<std::unique_ptr<grpc::ServerBuilderPlugin>>* plugins) override {
    auto reflection = std::make_unique<grpc::reflection::ProtoServerReflectionPlugin>();
    std::string reflection_name = reflection->name();
    std::erase_if(*plugins, [&](const auto& p) { return p->name() == reflection_name; });
    if (reflection_) plugins->push_back(std::move(reflection));
    plugins->push_back(std::make_unique<ServiceNamesPlugin>(names_));
  }

 private:
  bool reflection_;
  std::vector<std::string>* names_;
};

}  // namespace

// grpc.health.v1.Health/Check alone, for the health port (Watch: UNIMPLEMENTED; probes use Check).
class HealthPortService final : public grpc::health::v1::Health::Service {
 public:
  grpc::Status Check(grpc::ServerContext*, const grpc::health::v1::HealthCheckRequest* request,
                     grpc::health::v1::HealthCheckResponse* response) override {
    absl::MutexLock lock(&mu_);
    const auto it = status_.find(request->service());
    if (it == status_.end()) return grpc::Status(grpc::StatusCode::NOT_FOUND, "unknown service");
    response->set_status(it->second ? grpc::health::v1::HealthCheckResponse::SERVING
                                    : grpc::health::v1::HealthCheckResponse::NOT_SERVING);
    return grpc::Status::OK;
  }
  void Set(const std::string& service, bool serving) {
    absl::MutexLock lock(&mu_);
    status_[service] = serving;
  }

 private:
  absl::Mutex mu_;
  absl::flat_hash_map<std::string, bool> status_ ABSL_GUARDED_BY(mu_);
};

absl::StatusOr<GrpcServer::Endpoint> GrpcServer::Build(const GrpcServerOptions& options,
                                                       const std::string& address,
                                                       const std::vector<grpc::Service*>& services,
                                                       int* port, HealthPortService* health) {
  if (address.empty()) return absl::InvalidArgumentError("grpc: empty listen address");
  grpc::EnableDefaultHealthCheckService(true);
  Endpoint endpoint;
  grpc::ServerBuilder builder;
  *port = 0;
  // The health port (health != nullptr) is plaintext: probes cannot speak TLS.
  builder.AddListeningPort(
      address,
      health != nullptr ? grpc::InsecureServerCredentials() : MakeServerCredentials(options.tls),
      port);
  builder.SetMaxReceiveMessageSize(options.max_receive_bytes > 0 ? options.max_receive_bytes
                                                                 : options.max_message_bytes);
  builder.SetMaxSendMessageSize(options.max_message_bytes);
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_TIME_MS, Millis(options.keepalive_time));
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, Millis(options.keepalive_timeout));
  builder.AddChannelArgument(GRPC_ARG_MAX_CONNECTION_AGE_MS, Millis(options.max_connection_age));
  builder.AddChannelArgument(GRPC_ARG_MAX_CONNECTION_AGE_GRACE_MS,
                             Millis(options.max_connection_age_grace));
  // Clients (MakeChannel) ping every 30 s, also between calls: do not treat that as abuse.
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
  builder.AddChannelArgument(GRPC_ARG_HTTP2_MIN_RECV_PING_INTERVAL_WITHOUT_DATA_MS, 10000);
  builder.SetOption(std::make_unique<PluginsOption>(options.reflection, &endpoint.service_names));
  if (options.max_threads > 0) {
    grpc::ResourceQuota quota(absl::StrCat("hlem:", address));
    quota.SetMaxThreads(options.max_threads);
    builder.SetResourceQuota(quota);
  }
  for (grpc::Service* service : services) builder.RegisterService(service);
  if (health != nullptr) {
    builder.SetOption(std::make_unique<grpc::HealthCheckServiceServerBuilderOption>(nullptr));
    builder.RegisterService(health);
  }
  endpoint.server = builder.BuildAndStart();
  if (endpoint.server == nullptr || *port == 0) {
    if (endpoint.server != nullptr) endpoint.server->Shutdown();
    return absl::UnavailableError(absl::StrCat("grpc: cannot listen on ", address));
  }
  return endpoint;
}

absl::StatusOr<std::unique_ptr<GrpcServer>> GrpcServer::Create(
    const GrpcServerOptions& options, std::vector<grpc::Service*> public_services,
    std::vector<grpc::Service*> admin_services) {
  std::unique_ptr<GrpcServer> server(new GrpcServer(options));
  auto pub = Build(options, options.listen, public_services, &server->port_);
  if (!pub.ok()) return pub.status();
  server->public_ = std::move(*pub);
  if (!options.admin_listen.empty()) {
    auto admin = Build(options, options.admin_listen, admin_services, &server->admin_port_);
    if (!admin.ok()) return admin.status();  // ~GrpcServer stops the public server
    server->admin_ = std::move(*admin);
  }
  if (!options.health_listen.empty()) {
    GrpcServerOptions health_options = options;
    health_options.reflection = false;
    server->health_service_ = std::make_unique<HealthPortService>();
    auto health = Build(health_options, options.health_listen, {}, &server->health_port_,
                        server->health_service_.get());
    if (!health.ok()) return health.status();
    server->health_ = std::move(*health);
    server->health_service_->Set(kLivenessService, true);
  }
  server->SetServing(true);
  GetLogger("grpc")->info("grpc_listening port={} admin_port={} health_port={}", server->port_,
                          server->admin_port_, server->health_port_);
  return server;
}

GrpcServer::GrpcServer(const GrpcServerOptions& options) : options_(options) {}

GrpcServer::~GrpcServer() { Shutdown(); }

void GrpcServer::SetServing(bool serving) {
  for (Endpoint* e : {&public_, &admin_}) {
    if (e->server == nullptr) continue;
    grpc::HealthCheckServiceInterface* health = e->server->GetHealthCheckService();
    if (health == nullptr) continue;
    for (const std::string& name : e->service_names) health->SetServingStatus(name, serving);
    health->SetServingStatus(serving);
  }
  // The health port reports the public services (it serves none of its own).
  if (health_service_ != nullptr) {
    for (const std::string& name : public_.service_names) health_service_->Set(name, serving);
    health_service_->Set("", serving);
  }
}

void GrpcServer::Shutdown() {
  {
    absl::MutexLock lock(&mu_);
    if (state_ != State::kServing) {
      mu_.Await(absl::Condition(
          +[](State* s) { return *s == State::kStopped; }, &state_));
      return;
    }
    state_ = State::kDraining;
  }
  SetServing(false);
  auto deadline = absl::ToChronoTime(absl::Now() + options_.drain_timeout);
  std::thread admin_drain;
  if (admin_.server != nullptr) {
    admin_drain = std::thread([this, deadline] { admin_.server->Shutdown(deadline); });
  }
  if (public_.server != nullptr) public_.server->Shutdown(deadline);
  if (admin_drain.joinable()) admin_drain.join();
  // Last, so probes see NOT_SERVING (readiness) and the liveness service until the drain is over.
  if (health_.server != nullptr) health_.server->Shutdown(absl::ToChronoTime(absl::Now()));
  absl::MutexLock lock(&mu_);
  state_ = State::kStopped;
}

void GrpcServer::Wait() {
  absl::MutexLock lock(&mu_);
  mu_.Await(absl::Condition(
      +[](State* s) { return *s == State::kStopped; }, &state_));
}

namespace {

struct ShutdownRequest {
  absl::Mutex mu;
  bool requested ABSL_GUARDED_BY(mu) = false;
};

ShutdownRequest& Request() {
  static ShutdownRequest* request = new ShutdownRequest();
  return *request;
}

}  // namespace

void InstallShutdownSignals() {
  static std::once_flag once;
  std::call_once(once, [] {
    sigset_t signals;
    sigemptyset(&signals);
    sigaddset(&signals, SIGTERM);
    sigaddset(&signals, SIGINT);
    pthread_sigmask(SIG_BLOCK, &signals, nullptr);
    // With the signals blocked everywhere, this thread receives them synchronously, so it may
    // lock and log like any other thread.
    std::thread([signals] {
      for (;;) {
        int sig = 0;
        if (sigwait(&signals, &sig) != 0) continue;
        GetLogger("grpc")->info("shutdown_signal signal={}", sig);
        RequestShutdown();
      }
    }).detach();
  });
}

void WaitForShutdownSignal() {
  InstallShutdownSignals();
  ShutdownRequest& r = Request();
  absl::MutexLock lock(&r.mu);
  r.mu.Await(absl::Condition(&r.requested));
}

void WaitForShutdownSignal(GrpcServer& server) {
  WaitForShutdownSignal();
  GetLogger("grpc")->info("shutdown_begin");
  server.Shutdown();
  GetLogger("grpc")->info("shutdown_done");
}

void RequestShutdown() {
  ShutdownRequest& r = Request();
  absl::MutexLock lock(&r.mu);
  r.requested = true;
}

namespace {

// Adds the bearer token to every call's initial metadata.
class BearerTokenInterceptor final : public grpc::experimental::Interceptor {
 public:
  explicit BearerTokenInterceptor(const TokenFile* token) : token_(token) {}
  void Intercept(grpc::experimental::InterceptorBatchMethods* methods) override {
    if (methods->QueryInterceptionHookPoint(
            grpc::experimental::InterceptionHookPoints::PRE_SEND_INITIAL_METADATA)) {
      methods->GetSendInitialMetadata()->emplace("authorization",
                                                 absl::StrCat("Bearer ", token_->Get()));
    }
    methods->Proceed();
  }

 private:
  const TokenFile* token_;
};

class BearerTokenInterceptorFactory final
    : public grpc::experimental::ClientInterceptorFactoryInterface {
 public:
  explicit BearerTokenInterceptorFactory(std::shared_ptr<const TokenFile> token)
      : token_(std::move(token)) {}
  grpc::experimental::Interceptor* CreateClientInterceptor(
      grpc::experimental::ClientRpcInfo*) override {
    return new BearerTokenInterceptor(token_.get());
  }

 private:
  std::shared_ptr<const TokenFile> token_;
};

}  // namespace

std::shared_ptr<grpc::Channel> MakeChannel(const std::string& target,
                                           const ChannelOptions& options) {
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(options.max_message_bytes);
  args.SetMaxSendMessageSize(options.max_message_bytes);
  args.SetInt(GRPC_ARG_KEEPALIVE_TIME_MS, 30000);
  args.SetInt(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, 10000);
  args.SetInt(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
  AddTlsChannelArguments(options.tls, &args);
  std::shared_ptr<grpc::ChannelCredentials> credentials = MakeChannelCredentials(options.tls);
  if (options.token == nullptr) return grpc::CreateCustomChannel(target, credentials, args);
  std::vector<std::unique_ptr<grpc::experimental::ClientInterceptorFactoryInterface>> interceptors;
  interceptors.push_back(std::make_unique<BearerTokenInterceptorFactory>(options.token));
  return grpc::experimental::CreateCustomChannelWithInterceptors(target, credentials, args,
                                                                 std::move(interceptors));
}

std::shared_ptr<grpc::Channel> MakeChannel(const std::string& target, int max_message_bytes) {
  return MakeChannel(target, ChannelOptions{.max_message_bytes = max_message_bytes});
}

}  // namespace hlem
