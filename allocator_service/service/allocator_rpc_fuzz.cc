// Fuzz target: the allocator's RPCs as they arrive on the wire. The first byte picks the method
// (GetStatus or ListDecisions); the rest is its serialized request, answered by the real service
// over an allocator that ran rounds against fake nodes. Every input gets an answer (OK or a
// status naming the field), never a crash, and a listing never exceeds its limit.
#include <cstddef>
#include <cstdint>
#include <deque>
#include <memory>
#include <vector>

#include "allocator_service/core/allocator_testing.h"
#include "allocator_service/service/allocator_service.h"

namespace {

using namespace hlem::allocator;  // NOLINT

struct Fixture {
  Fixture() {
    allocator = *Allocator::Create({.epoch = 7, .keep_decisions = 64}, nodes, clock, [this] {
      seen.emplace_back();
      return std::make_unique<testing::IndexController>(&seen.back());
    });
    for (const char* a : {"10.0.0.1:7001", "10.0.0.2:7001", "10.0.0.3:7001"}) {
      nodes.Add(a);
      allocator->AddNode({.address = a, .admin_address = std::string(a) + "-admin"});
    }
    for (int k = 1; k <= 8; ++k) {
      clock.AdvanceTo(absl::UnixEpoch() + absl::Seconds(5 * k) + absl::Milliseconds(1));
      allocator->RunRound();
    }
    service = std::make_unique<AllocatorServiceImpl>(
        *allocator, ServiceInfo{.controller = "index", .bounds = {0.1, 0.9}});
  }
  hlem::SimClock clock{absl::UnixEpoch()};
  testing::FakeNodes nodes{clock, absl::Seconds(5)};
  std::deque<std::vector<uint64_t>> seen;
  std::unique_ptr<Allocator> allocator;
  std::unique_ptr<AllocatorServiceImpl> service;
};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static Fixture* fixture = new Fixture();
  if (size == 0) return 0;
  const int body = static_cast<int>(size - 1);
  if (data[0] % 2 == 0) {
    hlem::v1::GetStatusRequest request;
    if (!request.ParseFromArray(data + 1, body)) return 0;
    hlem::v1::GetStatusResponse response;
    if (!fixture->service->GetStatus(nullptr, &request, &response).ok()) __builtin_trap();
    if (response.nodes_size() != 3) __builtin_trap();
  } else {
    hlem::v1::ListDecisionsRequest request;
    if (!request.ParseFromArray(data + 1, body)) return 0;
    hlem::v1::ListDecisionsResponse response;
    const grpc::Status status = fixture->service->ListDecisions(nullptr, &request, &response);
    const uint32_t limit = request.max_decisions() == 0 ? 100 : request.max_decisions();
    if (status.ok() && static_cast<uint32_t>(response.decisions_size()) > limit) __builtin_trap();
    if (!status.ok() && status.error_message().empty()) __builtin_trap();
  }
  return 0;
}
