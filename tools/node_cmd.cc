// `hlem node`: talk to serving nodes. info / state / set-alpha print or change one node; drive
// sends a closed-loop synthetic workload (returning users with growing histories) to a set of
// nodes and prints client-side latency and SLO figures with each node's window statistics. The
// full load generator and workload models are issue 6; `drive` is the smallest honest driver.

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "common/grpc_flags.h"
#include "common/grpc_server.h"
#include "common/rng.h"
#include "common/zipf.h"
#include "grpcpp/client_context.h"
#include "hlem/v1/router.grpc.pb.h"
#include "hlem/v1/serving_node.grpc.pb.h"
#include "tools/commands.h"

namespace hlem::tools {
namespace {

namespace v1 = ::hlem::v1;

std::unique_ptr<v1::ServingNode::Stub> NodeStub(const std::string& address,
                                                const ChannelOptions& channel) {
  return v1::ServingNode::NewStub(MakeChannel(address, channel));
}

// The command's channel from its security flags; nullopt after printing the error.
std::optional<ChannelOptions> Channel(const ClientSecurityFlags& f, const std::string& token_flag) {
  absl::StatusOr<ChannelOptions> channel = ResolveChannelOptions(f, token_flag);
  if (!channel.ok()) {
    Fail("node", "security", channel.status());
    return std::nullopt;
  }
  return *channel;
}

grpc::Status GetInfo(v1::ServingNode::Stub& stub, v1::NodeInfo* info) {
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  return stub.GetNodeInfo(&ctx, v1::GetNodeInfoRequest(), info);
}

int Report(const grpc::Status& s, const std::string& what) {
  std::fprintf(stderr, "hlem node: %s: %s: %s\n", what.c_str(),
               absl::StatusCodeToString(static_cast<absl::StatusCode>(s.error_code())).c_str(),
               s.error_message().c_str());
  return 1;
}

int PrintNodeInfo(const std::string& address, const ClientSecurityFlags& security) {
  const std::optional<ChannelOptions> channel = Channel(security, "");
  if (!channel) return 2;
  auto stub = NodeStub(address, *channel);
  v1::NodeInfo info;
  if (grpc::Status s = GetInfo(*stub, &info); !s.ok()) return Report(s, address);
  std::printf("node %s epoch %llu device %s (%s) admin port %u\n", info.node_id().c_str(),
              static_cast<unsigned long long>(info.incarnation_epoch()), info.device().c_str(),
              info.device_name().c_str(), info.admin_port());
  std::printf("model %s: %u layers, D %u, %u tasks; max history %u, max candidates %u\n",
              info.model_name().c_str(), info.model_layers(), info.model_dim(), info.num_tasks(),
              info.max_history_tokens(), info.max_candidates());
  std::printf("pool %llu MiB in %llu KiB pages (%u tokens each); SLO %.0f ms; window %.1f s\n",
              static_cast<unsigned long long>(info.pool_bytes() >> 20),
              static_cast<unsigned long long>(info.page_bytes() >> 10), info.page_tokens(),
              info.slo_seconds() * 1e3, info.window_duration_seconds());
  for (const v1::FeatureTable& t : info.feature_tables()) {
    std::printf("feature %u: table %u '%s', %llu rows of %u\n", t.index(), t.table_id(),
                t.name().c_str(), static_cast<unsigned long long>(t.rows()), t.dim());
  }
  return 0;
}

void PrintWindowHeader() {
  std::printf("%-10s %6s %6s %6s %6s %6s %6s %8s %8s %6s %6s\n", "node", "window", "reqs", "hot",
              "kv_hit", "emb_hit", "slo_v", "p50_ms", "p99_ms", "alpha", "load");
}
void PrintWindow(const std::string& node, const v1::WindowStats& w) {
  std::printf("%-10s %6llu %6llu %6.3f %6.3f %6.3f %6.3f %8.3f %8.3f %6.3f %6.3f\n", node.c_str(),
              static_cast<unsigned long long>(w.window_index()),
              static_cast<unsigned long long>(w.requests()), w.hot_user_ratio(), w.kv_hit_rate(),
              w.emb_hit_rate(), w.slo_violation_fraction(), w.p50_seconds() * 1e3,
              w.p99_seconds() * 1e3, w.alpha_effective(), w.load());
}

int State(const std::string& address, uint32_t windows, const ClientSecurityFlags& security) {
  const std::optional<ChannelOptions> channel = Channel(security, "");
  if (!channel) return 2;
  auto stub = NodeStub(address, *channel);
  grpc::ClientContext ctx;
  v1::GetStateRequest req;
  req.set_max_windows(windows);
  v1::GetStateResponse state;
  if (grpc::Status s = stub->GetState(&ctx, req, &state); !s.ok()) return Report(s, address);
  PrintWindowHeader();
  for (const v1::WindowStats& w : state.windows()) PrintWindow(state.node_id(), w);
  const v1::NodeGauges& g = state.current();
  std::printf(
      "now: load %.3f, queue %u, in-flight tokens %llu, alpha %.3f -> %.3f, KV %llu MiB "
      "(%llu users), EMB %llu MiB (%llu rows), free %llu MiB%s\n",
      g.load(), g.queue_depth(), static_cast<unsigned long long>(g.in_flight_tokens()),
      g.alpha_effective(), g.alpha_target(), static_cast<unsigned long long>(g.kv_bytes() >> 20),
      static_cast<unsigned long long>(g.kv_resident_users()),
      static_cast<unsigned long long>(g.emb_bytes() >> 20),
      static_cast<unsigned long long>(g.emb_resident_rows()),
      static_cast<unsigned long long>(g.free_bytes() >> 20), g.draining() ? ", draining" : "");
  return 0;
}

struct AlphaFlags {
  std::string admin;
  double alpha = 0.5;
  uint64_t epoch = 1, decision = 1;
  ClientSecurityFlags security;
};

int SetAlpha(const AlphaFlags& f) {
  const std::optional<ChannelOptions> channel = Channel(f.security, "--admin-token-file");
  if (!channel) return 2;
  auto stub = v1::ServingNodeAdmin::NewStub(MakeChannel(f.admin, *channel));
  grpc::ClientContext ctx;
  v1::SetAlphaRequest req;
  req.set_alpha(f.alpha);
  req.set_allocator_epoch(f.epoch);
  req.set_decision_id(f.decision);
  req.set_allocator_id("hlem-cli");
  v1::SetAlphaResponse resp;
  if (grpc::Status s = stub->SetAlpha(&ctx, req, &resp); !s.ok()) return Report(s, f.admin);
  std::printf(
      "alpha target %.3f effective %.3f (epoch %llu decision %llu)%s\n", resp.alpha_target(),
      resp.alpha_effective(), static_cast<unsigned long long>(resp.allocator_epoch()),
      static_cast<unsigned long long>(resp.decision_id()), resp.changed() ? "" : " unchanged");
  return 0;
}

struct DriveFlags {
  std::string servers;
  std::string router;  // when set: requests go through the router's Recommend
  uint64_t users = 2000;
  uint64_t requests = 2000;
  int concurrency = 2;
  uint32_t first_events = 64;
  uint32_t new_events = 8;
  uint32_t candidates = 64;
  double user_zipf = 1.0, item_zipf = 1.0;
  double deadline_ms = 500, slo_ms = 50;
  uint64_t seed = 1;
  ClientSecurityFlags security;
};

// One synthetic user: its feature-id history (F per event) and whether a node served it.
struct User {
  std::mutex mu;
  std::vector<uint64_t> history;
  bool served = false;
};

int Drive(const DriveFlags& f) {
  std::vector<std::string> addresses = absl::StrSplit(f.servers, ',', absl::SkipEmpty());
  if (addresses.empty()) {
    std::fprintf(stderr, "hlem node drive: --servers: none\n");
    return 2;
  }
  const std::optional<ChannelOptions> channel = Channel(f.security, "--token-file");
  if (!channel) return 2;
  std::unique_ptr<v1::Router::Stub> router;
  if (!f.router.empty()) router = v1::Router::NewStub(MakeChannel(f.router, *channel));
  if (f.users == 0 || f.requests == 0 || f.concurrency < 1 || f.candidates == 0) {
    std::fprintf(stderr,
                 "hlem node drive: --users, --requests, --concurrency and --candidates "
                 "must be > 0\n");
    return 2;
  }
  std::vector<std::unique_ptr<v1::ServingNode::Stub>> stubs;
  v1::NodeInfo info;
  for (const std::string& a : addresses) {
    stubs.push_back(NodeStub(a, ChannelOptions{.tls = channel->tls}));
    if (grpc::Status s = GetInfo(*stubs.back(), &info); !s.ok()) return Report(s, a);
  }
  const int features = info.feature_tables_size();
  std::vector<uint64_t> rows;
  for (const v1::FeatureTable& t : info.feature_tables()) rows.push_back(t.rows());
  const ZipfSampler item_zipf(rows[0], f.item_zipf);
  const ZipfSampler user_zipf(f.users, f.user_zipf);
  std::vector<User> users(f.users);

  std::atomic<uint64_t> issued{0};
  std::mutex results_mu;
  std::vector<double> latencies_ms;
  std::map<std::string, uint64_t> codes, nodes_used, reasons;
  uint64_t reused = 0, history_tokens = 0, stale = 0, answered = 0;
  const absl::Time start = absl::Now();
  auto worker = [&](int index) {
    Rng rng(f.seed * 1000003 + static_cast<uint64_t>(index));
    auto event = [&](std::vector<uint64_t>* out) {
      out->push_back(item_zipf(rng));
      for (int k = 1; k < features; ++k) out->push_back(rng() % rows[static_cast<size_t>(k)]);
    };
    while (issued.fetch_add(1) < f.requests) {
      // A popular user who is not in flight on another worker.
      uint64_t id = user_zipf(rng);
      std::unique_lock<std::mutex> held(users[id].mu, std::try_to_lock);
      for (int tries = 0; tries < 64 && !held.owns_lock(); ++tries) {
        id = user_zipf(rng);
        held = std::unique_lock<std::mutex>(users[id].mu, std::try_to_lock);
      }
      if (!held.owns_lock()) held.lock();
      User& u = users[id];
      const uint32_t add = u.history.empty() ? f.first_events : f.new_events;
      for (uint32_t e = 0; e < add; ++e) event(&u.history);
      v1::InferRequest req;
      req.set_user_id(id + 1);  // user ids start at 1 (0 means "no user" to the router)
      req.set_expected_kv_resident(u.served);
      for (size_t e = 0; e < u.history.size(); e += static_cast<size_t>(features)) {
        v1::Event* ev = req.add_history();
        for (int k = 0; k < features; ++k)
          ev->add_feature_ids(u.history[e + static_cast<size_t>(k)]);
      }
      for (uint32_t c = 0; c < f.candidates; ++c) {
        std::vector<uint64_t> ids;
        event(&ids);
        v1::Candidate* cand = req.add_candidates();
        for (uint64_t x : ids) cand->add_feature_ids(x);
      }
      grpc::ClientContext ctx;
      ctx.set_deadline(std::chrono::system_clock::now() +
                       std::chrono::microseconds(static_cast<int64_t>(f.deadline_ms * 1e3)));
      v1::InferResponse resp;
      v1::RecommendResponse routed;
      const absl::Time t0 = absl::Now();
      grpc::Status s;
      if (router != nullptr) {
        v1::RecommendRequest rec;
        rec.set_user_id(id + 1);
        rec.mutable_history()->Swap(req.mutable_history());
        rec.mutable_candidates()->Swap(req.mutable_candidates());
        s = router->Recommend(&ctx, rec, &routed);
      } else {
        s = stubs[(id + 1) % stubs.size()]->Infer(&ctx, req, &resp);
      }
      const double ms = absl::ToDoubleMilliseconds(absl::Now() - t0);
      if (s.ok()) u.served = true;
      std::lock_guard<std::mutex> lock(results_mu);
      ++answered;
      if (s.ok()) latencies_ms.push_back(ms);  // a failed request misses the SLO
      ++codes[absl::StatusCodeToString(static_cast<absl::StatusCode>(s.error_code()))];
      if (s.ok() && router != nullptr) {
        reused += routed.cached_prefix_tokens();
        history_tokens += routed.cached_prefix_tokens() + routed.computed_tokens() - f.candidates;
        stale += routed.stale_kv_hit();
        ++nodes_used[routed.node_id()];
        ++reasons[v1::RoutingReason_Name(routed.reason())];
      } else if (s.ok()) {
        reused += resp.cached_prefix_tokens();
        history_tokens += resp.history_tokens();
        stale += resp.stale_kv_hit();
        ++nodes_used[resp.node_id()];
      }
    }
  };
  std::vector<std::thread> threads;
  for (int i = 0; i < f.concurrency; ++i) threads.emplace_back(worker, i);
  for (std::thread& t : threads) t.join();
  const double seconds = absl::ToDoubleSeconds(absl::Now() - start);

  std::sort(latencies_ms.begin(), latencies_ms.end());
  const auto within = static_cast<size_t>(
      std::upper_bound(latencies_ms.begin(), latencies_ms.end(), f.slo_ms) - latencies_ms.begin());
  if (latencies_ms.empty()) latencies_ms.push_back(0);
  auto q = [&](double p) {
    return latencies_ms[std::min(
        latencies_ms.size() - 1,
        static_cast<size_t>(p * static_cast<double>(latencies_ms.size())))];
  };
  std::printf("drive: %llu requests in %.1f s (%.0f/s) to %zu nodes, %d in flight, %llu users\n",
              static_cast<unsigned long long>(answered), seconds,
              static_cast<double>(answered) / seconds, stubs.size(), f.concurrency,
              static_cast<unsigned long long>(f.users));
  std::printf(
      "latency of OK answers (client, gRPC): p50 %.2f ms, p90 %.2f ms, p99 %.2f ms; within SLO "
      "%.0f ms: "
      "%.1f %%\n",
      q(0.5), q(0.9), q(0.99), f.slo_ms,
      100.0 * static_cast<double>(within) / static_cast<double>(answered));
  std::printf("KV reuse: %.1f %% of history tokens; stale KV hits %llu; codes:",
              history_tokens == 0
                  ? 0.0
                  : 100.0 * static_cast<double>(reused) / static_cast<double>(history_tokens),
              static_cast<unsigned long long>(stale));
  for (const auto& [code, n] : codes) {
    std::printf(" %s %llu", code.c_str(), static_cast<unsigned long long>(n));
  }
  std::printf("\nnodes:");
  for (const auto& [node, n] : nodes_used) {
    std::printf(" %s %llu", node.c_str(), static_cast<unsigned long long>(n));
  }
  if (!reasons.empty()) {
    std::printf("; routing reasons:");
    for (const auto& [reason, n] : reasons) {
      std::printf(" %s %llu", reason.c_str(), static_cast<unsigned long long>(n));
    }
  }
  std::printf("\n");
  bool all_ok = codes.size() == 1 && codes.count("OK") == 1;
  return all_ok ? 0 : 1;
}

}  // namespace

void RegisterNodeCommands(CLI::App& app, Run* run) {
  CLI::App* node = app.add_subcommand("node", "talk to serving nodes");
  node->require_subcommand(1);

  auto address = std::make_shared<std::string>();
  auto security = std::make_shared<ClientSecurityFlags>();
  auto* info = node->add_subcommand("info", "print a node's GetNodeInfo");
  info->add_option("--server", *address, "serving gRPC address host:port")->required();
  AddTlsFlags(*info, &security->tls);
  info->callback([=] { *run = [=] { return PrintNodeInfo(*address, *security); }; });

  auto windows = std::make_shared<uint32_t>(12);
  auto* state = node->add_subcommand("state", "print a node's window statistics and gauges");
  state->add_option("--server", *address, "serving gRPC address host:port")->required();
  state->add_option("--windows", *windows, "closed windows to print");
  AddTlsFlags(*state, &security->tls);
  state->callback([=] { *run = [=] { return State(*address, *windows, *security); }; });

  auto a = std::make_shared<AlphaFlags>();
  auto* alpha = node->add_subcommand("set-alpha", "push an EMB share α to a node (admin port)");
  alpha->add_option("--admin", a->admin, "admin gRPC address host:port")->required();
  alpha->add_option("--alpha", a->alpha, "EMB share of the pool")->required();
  alpha->add_option("--epoch", a->epoch, "allocator epoch (> 0)");
  alpha->add_option("--decision", a->decision, "decision id within the epoch");
  AddClientSecurityFlags(*alpha, &a->security, "--admin-token-file",
                         "file holding the nodes' admin bearer token");
  alpha->callback([=] { *run = [=] { return SetAlpha(*a); }; });

  auto d = std::make_shared<DriveFlags>();
  auto* drive = node->add_subcommand(
      "drive", "closed-loop synthetic load: returning users with growing histories");
  drive
      ->add_option("--servers", d->servers,
                   "comma-separated serving addresses (node info; without --router user u goes "
                   "to node u mod n)")
      ->required();
  drive->add_option("--router", d->router,
                    "router address: send Recommend through it instead of Infer to the nodes");
  drive->add_option("--users", d->users, "user population");
  drive->add_option("--requests", d->requests, "requests in all");
  drive->add_option("--concurrency", d->concurrency, "requests in flight");
  drive->add_option("--first-events", d->first_events, "history events of a user's first visit");
  drive->add_option("--new-events", d->new_events, "events added per later visit");
  drive->add_option("--candidates", d->candidates, "candidates per request");
  drive->add_option("--user-zipf", d->user_zipf, "Zipf exponent of user popularity");
  drive->add_option("--item-zipf", d->item_zipf, "Zipf exponent of item popularity");
  drive->add_option("--deadline-ms", d->deadline_ms, "gRPC deadline per request");
  drive->add_option("--slo-ms", d->slo_ms, "latency SLO for the report");
  drive->add_option("--seed", d->seed, "seed of the workload");
  AddClientSecurityFlags(*drive, &d->security, "--token-file",
                         "file holding the router's frontend bearer token (with --router)");
  drive->callback([=] { *run = [=] { return Drive(*d); }; });
}

}  // namespace hlem::tools
