#include "common/grpc_status.h"

#include <chrono>

#include "gtest/gtest.h"

namespace hlem {
namespace {

TEST(GrpcStatusTest, EveryCanonicalCodeRoundTrips) {
  for (int code = 0; code <= 16; ++code) {
    absl::Status in(static_cast<absl::StatusCode>(code), code == 0 ? "" : "msg");
    grpc::Status g = ToGrpcStatus(in);
    EXPECT_EQ(static_cast<int>(g.error_code()), code);
    EXPECT_EQ(g.error_message(), code == 0 ? "" : "msg");
    EXPECT_EQ(FromGrpcStatus(g), in);
  }
  EXPECT_EQ(ToGrpcStatus(absl::ResourceExhaustedError("full")).error_code(),
            grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_EQ(FromGrpcStatus(grpc::Status(grpc::StatusCode::DEADLINE_EXCEEDED, "late")),
            absl::DeadlineExceededError("late"));
}

TEST(GrpcStatusTest, UnknownGrpcCodeBecomesUnknown) {
  // 20: above every code gRPC defines (0..16) yet a value grpc::StatusCode can hold (its range
  // is -32..31); 42 was undefined behaviour, as the UBSan build of the service tests showed.
  absl::Status s = FromGrpcStatus(grpc::Status(static_cast<grpc::StatusCode>(20), "odd"));
  EXPECT_EQ(s, absl::UnknownError("odd"));
}

TEST(GrpcStatusTest, SetDeadline) {
  absl::Time when = absl::FromUnixSeconds(2000000000);
  grpc::ClientContext with;
  SetDeadline(with, when);
  EXPECT_EQ(absl::FromChrono(with.deadline()), when);
  grpc::ClientContext without;
  SetDeadline(without, absl::InfiniteFuture());
  EXPECT_EQ(without.deadline(), std::chrono::system_clock::time_point::max());
}

}  // namespace
}  // namespace hlem
