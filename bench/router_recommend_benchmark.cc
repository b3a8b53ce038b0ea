// What the router adds to a request (issue 5; docs/perf/router.md): Recommend through the router
// service to a serving node, against the same Infer sent to the node directly, at history lengths
// of 512 and 15 000 events (two features: ≈ 300 KB on the wire at 15 000) and in delta mode (8 new
// events). Everything in one process over loopback gRPC; the "node" is a stub service that answers
// at once, so the difference is the router's own cost: parsing, the shard profile, the decision,
// re-serialising the request and the extra hop. `cpu_us` is the process's CPU time per request
// (getrusage, all threads: client, router and node).

#include <benchmark/benchmark.h>
#include <sys/resource.h>

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/clock.h"
#include "common/grpc_server.h"
#include "common/rng.h"
#include "common/zipf.h"
#include "grpcpp/client_context.h"
#include "hlem/v1/router.grpc.pb.h"
#include "hlem/v1/serving_node.grpc.pb.h"
#include "router/core/cluster.h"
#include "router/service/router_service.h"

namespace hlem::router {
namespace {

namespace v1 = ::hlem::v1;

// A serving node that scores every candidate 0.5 at once.
class InstantNode final : public v1::ServingNode::Service {
  grpc::Status Infer(grpc::ServerContext*, const v1::InferRequest* req,
                     v1::InferResponse* resp) override {
    for (int c = 0; c < req->candidates_size(); ++c) resp->add_scores(0.5f);
    resp->set_num_tasks(1);
    resp->set_node_id("instant");
    return grpc::Status::OK;
  }
};

double CpuSeconds() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return static_cast<double>(u.ru_utime.tv_sec + u.ru_stime.tv_sec) +
         static_cast<double>(u.ru_utime.tv_usec + u.ru_stime.tv_usec) * 1e-6;
}

struct Rig {
  Rig() {
    auto node_server = GrpcServer::Create({.listen = "127.0.0.1:0"}, {&node});
    node_server_ = std::move(*node_server);
    node_stub = v1::ServingNode::NewStub(
        MakeChannel(absl::StrCat("127.0.0.1:", node_server_->port()), 256 << 20));
    ClusterOptions o;
    o.features = {{0, 4096}, {1, 64}};
    cluster = *Cluster::Create(o, clock);
    const int index = *cluster->AddNode("instant", "");
    cluster->Reset(index, {.epoch = 1, .seq = 0, .load = {.load = 0.1}});
    service = std::make_unique<RouterServiceImpl>(
        RouterServiceOptions{.max_history_events = 1 << 16}, *cluster);
    service->SetNodeStub(
        index, std::shared_ptr<v1::ServingNode::Stub>(v1::ServingNode::NewStub(
                   MakeChannel(absl::StrCat("127.0.0.1:", node_server_->port()), 256 << 20))));
    auto router_server = GrpcServer::Create(
        {.listen = "127.0.0.1:0", .max_message_bytes = 256 << 20}, {service.get()});
    router_server_ = std::move(*router_server);
    router_stub = v1::Router::NewStub(
        MakeChannel(absl::StrCat("127.0.0.1:", router_server_->port()), 256 << 20));
  }
  RealClock clock;
  InstantNode node;
  std::unique_ptr<GrpcServer> node_server_;
  std::unique_ptr<v1::ServingNode::Stub> node_stub;
  std::unique_ptr<Cluster> cluster;
  std::unique_ptr<RouterServiceImpl> service;
  std::unique_ptr<GrpcServer> router_server_;
  std::unique_ptr<v1::Router::Stub> router_stub;
};

Rig& TheRig() {
  static Rig* rig = new Rig();
  return *rig;
}

template <typename Request>
void Fill(Request* r, int events, uint64_t user) {
  Rng rng(user);
  ZipfSampler items(1 << 24, 1.0);
  r->set_user_id(user);
  for (int e = 0; e < events; ++e) {
    v1::Event* ev = r->add_history();
    ev->add_feature_ids(items(rng));
    ev->add_feature_ids(rng() % 1000);
  }
  for (int c = 0; c < 64; ++c) {
    v1::Candidate* cand = r->add_candidates();
    cand->add_feature_ids(items(rng));
    cand->add_feature_ids(rng() % 1000);
  }
}

void Report(benchmark::State& state, double cpu_start, const std::string& bytes_of) {
  state.counters["cpu_us"] = benchmark::Counter((CpuSeconds() - cpu_start) * 1e6 /
                                                static_cast<double>(state.iterations()));
  state.SetLabel(bytes_of);
}

void BM_DirectInfer(benchmark::State& state) {
  Rig& rig = TheRig();
  v1::InferRequest req;
  Fill(&req, static_cast<int>(state.range(0)), 7);
  const double cpu = CpuSeconds();
  for (auto _ : state) {
    grpc::ClientContext ctx;
    v1::InferResponse resp;
    if (!rig.node_stub->Infer(&ctx, req, &resp).ok()) state.SkipWithError("infer failed");
  }
  Report(state, cpu, absl::StrCat(req.ByteSizeLong() / 1024, " KiB"));
}

void BM_Recommend(benchmark::State& state) {
  Rig& rig = TheRig();
  v1::RecommendRequest req;
  Fill(&req, static_cast<int>(state.range(0)), 8);
  const double cpu = CpuSeconds();
  for (auto _ : state) {
    grpc::ClientContext ctx;
    v1::RecommendResponse resp;
    if (!rig.router_stub->Recommend(&ctx, req, &resp).ok()) state.SkipWithError("failed");
  }
  Report(state, cpu, absl::StrCat(req.ByteSizeLong() / 1024, " KiB"));
}

// Delta mode: the user's profile is cached; each request carries 8 new events.
void BM_RecommendDelta(benchmark::State& state) {
  Rig& rig = TheRig();
  v1::RecommendRequest full;
  Fill(&full, static_cast<int>(state.range(0)), 9);
  {
    grpc::ClientContext ctx;
    v1::RecommendResponse resp;
    if (!rig.router_stub->Recommend(&ctx, full, &resp).ok()) state.SkipWithError("failed");
  }
  v1::RecommendRequest delta;
  Fill(&delta, 8, 9);
  delta.mutable_delta()->set_length(static_cast<uint32_t>(state.range(0)));
  delta.mutable_delta()->set_hash(1);  // the stub node does not check it
  const double cpu = CpuSeconds();
  for (auto _ : state) {
    grpc::ClientContext ctx;
    v1::RecommendResponse resp;
    if (!rig.router_stub->Recommend(&ctx, delta, &resp).ok()) state.SkipWithError("failed");
  }
  Report(state, cpu, absl::StrCat(delta.ByteSizeLong() / 1024, " KiB"));
}

BENCHMARK(BM_DirectInfer)
    ->ArgName("events")
    ->Arg(512)
    ->Arg(15000)
    ->Unit(benchmark::kMicrosecond)
    ->UseRealTime();
BENCHMARK(BM_Recommend)
    ->ArgName("events")
    ->Arg(512)
    ->Arg(15000)
    ->Unit(benchmark::kMicrosecond)
    ->UseRealTime();
BENCHMARK(BM_RecommendDelta)
    ->ArgName("events")
    ->Arg(15000)
    ->Unit(benchmark::kMicrosecond)
    ->UseRealTime();

}  // namespace
}  // namespace hlem::router

BENCHMARK_MAIN();
