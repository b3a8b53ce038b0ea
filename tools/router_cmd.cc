// `hlem router`: talk to a router. state prints its routing configuration and per-node view.

#include <chrono>
#include <cstdio>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "common/grpc_flags.h"
#include "common/grpc_server.h"
#include "grpcpp/client_context.h"
#include "hlem/v1/router.grpc.pb.h"
#include "tools/commands.h"

namespace hlem::tools {
namespace {

namespace v1 = ::hlem::v1;

int State(const std::string& address, const ClientSecurityFlags& security) {
  const absl::StatusOr<ChannelOptions> channel = ResolveChannelOptions(security, "--token-file");
  if (!channel.ok()) return Fail("router", "security", channel.status());
  auto stub = v1::Router::NewStub(MakeChannel(address, *channel));
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  v1::GetRoutingStateResponse s;
  const grpc::Status st = stub->GetRoutingState(&ctx, v1::GetRoutingStateRequest(), &s);
  if (!st.ok()) {
    std::fprintf(stderr, "hlem router: %s: %s\n", address.c_str(), st.error_message().c_str());
    return 1;
  }
  std::printf(
      "policy %s: w_kv %.3f w_emb %.3f w_load %.3f, tau %.2f, epsilon %.2f, K %u, "
      "all overloaded: %s; %llu cached profiles\n",
      s.policy().c_str(), s.w_kv(), s.w_emb(), s.w_load(), s.load_threshold(), s.affinity_bonus(),
      s.profile_top_k(), s.all_overloaded_rule().c_str(),
      static_cast<unsigned long long>(s.cached_profiles()));
  std::printf("%-10s %-22s %-11s %6s %6s %8s %8s %6s %9s\n", "node", "address", "view", "seq",
              "load", "users", "spec", "shards", "dispatch");
  for (const v1::NodeRoutingView& n : s.nodes()) {
    std::printf("%-10s %-22s %-11s %6llu %6.3f %8llu %8llu %6llu %9llu\n", n.node_id().c_str(),
                n.address().c_str(), v1::NodeView_Name(n.view()).c_str() + 10,
                static_cast<unsigned long long>(n.last_seq()), n.load(),
                static_cast<unsigned long long>(n.resident_users()),
                static_cast<unsigned long long>(n.speculative_users()),
                static_cast<unsigned long long>(n.resident_shards()),
                static_cast<unsigned long long>(n.dispatches()));
  }
  return 0;
}

}  // namespace

void RegisterRouterCommands(CLI::App& app, Run* run) {
  CLI::App* router = app.add_subcommand("router", "talk to a router");
  router->require_subcommand(1);
  auto address = std::make_shared<std::string>();
  auto* state = router->add_subcommand("state", "print the routing configuration and node views");
  state->add_option("--server", *address, "router gRPC address host:port")->required();
  auto security = std::make_shared<ClientSecurityFlags>();
  AddClientSecurityFlags(*state, security.get(), "--token-file",
                         "file holding the router's frontend bearer token");
  state->callback([=] { *run = [=] { return State(*address, *security); }; });
}

}  // namespace hlem::tools
