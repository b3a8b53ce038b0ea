// A binary of its own: the signals must be blocked before any thread starts, so this installs
// them during static initialisation, before gtest or gRPC create threads.
#include <signal.h>
#include <unistd.h>

#include "common/grpc_server.h"
#include "gtest/gtest.h"

namespace hlem {
namespace {

const bool kSignalsInstalled = (InstallShutdownSignals(), true);

TEST(ShutdownSignalTest, SigtermShutsTheServerDown) {
  ASSERT_TRUE(kSignalsInstalled);
  auto server = GrpcServer::Create(GrpcServerOptions{}, {});
  ASSERT_TRUE(server.ok()) << server.status();
  absl::Time start = absl::Now();
  ASSERT_EQ(kill(getpid(), SIGTERM), 0);
  WaitForShutdownSignal(**server);  // would hang (test timeout) if the signal were lost
  (*server)->Wait();                // returns only after Shutdown completed
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
  // Once requested, later waits return at once.
  WaitForShutdownSignal();
}

}  // namespace
}  // namespace hlem
