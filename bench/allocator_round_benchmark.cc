// One allocator round over gRPC against fake serving nodes (issue 7: a full round for 256 nodes —
// poll, decide, push — in ≤ 200 ms). One in-process gRPC server plays every node: it listens on
// one loopback port per node (so the allocator keeps one channel per node, as against real nodes)
// and answers GetState with 8 closed windows, the newest one new every round, and SetAlpha as a
// node does. The allocator is the real one (Allocator + GrpcNodeApi, the recovery controller
// around a static α so every node is decided and pushed every round). Reported: the round's wall
// time (Google Benchmark's time per iteration) and the p50/p99 of the rounds beside it.
// `--nodes N` (default 256).

#include <benchmark/benchmark.h>
#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/strings/str_cat.h"
#include "allocator_service/core/allocator.h"
#include "allocator_service/service/grpc_nodes.h"
#include "common/clock.h"
#include "hlem/v1/serving_node.grpc.pb.h"

namespace hlem::allocator {
namespace {

uint32_t g_nodes = 256;

// Every fake node's GetState: windows [round − 7, round], the newest advancing each round.
class FakeServing final : public hlem::v1::ServingNode::Service {
 public:
  std::atomic<uint64_t> round{0};
  grpc::Status GetState(grpc::ServerContext*, const hlem::v1::GetStateRequest*,
                        hlem::v1::GetStateResponse* response) override {
    const uint64_t r = round.load();
    response->set_node_id("fake");
    response->set_incarnation_epoch(1);
    for (uint64_t i = r >= 7 ? r - 7 : 0; i <= r; ++i) {
      hlem::v1::WindowStats* w = response->add_windows();
      w->set_window_index(i);
      w->set_requests(500);
      w->set_hot_user_ratio(0.3);
      w->set_alpha_effective(0.5);
      w->set_p99_seconds(0.02 + 0.001 * static_cast<double>(i % 5));
      w->set_slo_seconds(0.025);
      w->set_p99_norm_cap(4);
    }
    return grpc::Status::OK;
  }
};

class FakeAdmin final : public hlem::v1::ServingNodeAdmin::Service {
 public:
  grpc::Status SetAlpha(grpc::ServerContext*, const hlem::v1::SetAlphaRequest* request,
                        hlem::v1::SetAlphaResponse* response) override {
    response->set_alpha_target(request->alpha());
    response->set_alpha_effective(request->alpha());
    response->set_allocator_epoch(request->allocator_epoch());
    response->set_decision_id(request->decision_id());
    response->set_changed(true);
    response->set_incarnation_epoch(1);
    return grpc::Status::OK;
  }
};

void BM_AllocatorRound(benchmark::State& state) {
  FakeServing serving;
  FakeAdmin admin;
  grpc::ServerBuilder builder;
  std::vector<int> ports(g_nodes);
  for (uint32_t i = 0; i < g_nodes; ++i) {
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &ports[i]);
  }
  builder.RegisterService(&serving);
  builder.RegisterService(&admin);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (server == nullptr) {
    state.SkipWithError("cannot start the fake nodes' server");
    return;
  }
  GrpcNodeApi api;
  RealClock& clock = RealClock::Get();
  auto allocator = *Allocator::Create({.epoch = 1, .allocator_id = "bench"}, api, clock,
                                      [] { return *MakeRecovery(MakeStatic(0.5)); });
  for (int port : ports) {
    const std::string a = absl::StrCat("127.0.0.1:", port);
    allocator->AddNode({.address = a, .admin_address = a});
  }
  allocator->RunRound();  // connect every channel
  std::vector<double> ms;
  size_t decided = 0;
  for (auto _ : state) {
    serving.round.fetch_add(1);
    const auto t0 = std::chrono::steady_clock::now();
    const RoundStats r = allocator->RunRound();
    ms.push_back(
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
    decided += r.decisions;
    if (r.polled_ok != g_nodes || r.push_failed != 0) {
      state.SkipWithError("a fake node did not answer");
      break;
    }
  }
  server->Shutdown();
  if (ms.empty()) return;
  std::sort(ms.begin(), ms.end());
  state.counters["nodes"] = g_nodes;
  state.counters["round_p50_ms"] = ms[ms.size() / 2];
  state.counters["round_p99_ms"] = ms[std::min(ms.size() - 1, ms.size() * 99 / 100)];
  state.counters["decisions_per_round"] =
      static_cast<double>(decided) / static_cast<double>(ms.size());
}
BENCHMARK(BM_AllocatorRound)->Unit(benchmark::kMillisecond)->UseRealTime();

}  // namespace
}  // namespace hlem::allocator

int main(int argc, char** argv) {
  std::vector<char*> rest;
  for (int i = 0; i < argc; ++i) {
    if (std::string_view(argv[i]) == "--nodes" && i + 1 < argc) {
      hlem::allocator::g_nodes = static_cast<uint32_t>(std::max(1, std::atoi(argv[++i])));
    } else {
      rest.push_back(argv[i]);
    }
  }
  int n = static_cast<int>(rest.size());
  benchmark::Initialize(&n, rest.data());
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
