// Checks the gRPC annotations and suppressions of TSan builds (cmake/tsan_annotations): run with
// the annotations preloaded and the suppressions given.
//   grpc_probe guarded: data handed to gRPC callbacks and completion-queue events only through
//     gRPC itself (written before the call starts, read in its callback or after cq.Next) and
//     back through absl::Notification; TSan must report nothing (without the annotations it
//     reports each hand-off).
//   grpc_probe client-race: the client writes what its callback reads after starting the call;
//     TSan must report it (the callback runs with libgrpc's frames below it, which the
//     suppressions must not hide).
//   grpc_probe server-race: concurrent handlers of the synchronous server bump one unguarded
//     counter; TSan must report it.
#include <grpcpp/grpcpp.h>

#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "echo.grpc.pb.h"

namespace {

int served = 0;  // unguarded: bumped by every handler in server-race mode

class EchoService final : public hlem::test::Echo::Service {
 public:
  explicit EchoService(bool race) : race_(race) {}
  grpc::Status Echo(grpc::ServerContext*, const hlem::test::EchoRequest* request,
                    hlem::test::EchoResponse* response) override {
    if (race_) ++served;
    absl::SleepFor(absl::Milliseconds(request->sleep_ms()));
    if (race_) ++served;
    response->set_message(request->message());
    return grpc::Status::OK;
  }

 private:
  const bool race_;
};

struct Shared {
  std::string sent;
  std::string seen;
};

// One call through the callback API; `shared.sent` is written before the call (or, with `race`,
// after it starts) and read by the callback.
bool CallbackCall(hlem::test::Echo::Stub* stub, bool race) {
  Shared shared;
  if (!race) shared.sent = "before";
  grpc::ClientContext context;
  hlem::test::EchoRequest request;
  request.set_message("cb");
  request.set_sleep_ms(race ? 50 : 0);
  hlem::test::EchoResponse response;
  absl::Notification done;
  bool ok = false;
  stub->async()->Echo(&context, &request, &response, [&](grpc::Status status) {
    ok = status.ok() && response.message() == "cb";
    shared.seen = shared.sent;
    done.Notify();
  });
  if (race) shared.sent = "after";
  done.WaitForNotification();
  return ok;
}

// One call through a completion queue; state written before the call is read after Next.
bool QueueCall(hlem::test::Echo::Stub* stub) {
  grpc::CompletionQueue cq;
  grpc::ClientContext context;
  hlem::test::EchoRequest request;
  request.set_message("cq");
  hlem::test::EchoResponse response;
  grpc::Status status;
  auto shared = std::make_unique<Shared>();
  shared->sent = "before";
  auto call = stub->AsyncEcho(&context, request, &cq);
  call->Finish(&response, &status, shared.get());
  void* tag = nullptr;
  bool ok = false;
  if (!cq.Next(&tag, &ok) || tag != shared.get()) return false;
  static_cast<Shared*>(tag)->seen = static_cast<Shared*>(tag)->sent;
  cq.Shutdown();
  while (cq.Next(&tag, &ok)) {
  }
  return ok && status.ok() && response.message() == "cq";
}

}  // namespace

int main(int argc, char** argv) {
  const std::string mode = argc > 1 ? argv[1] : "";
  if (mode != "guarded" && mode != "client-race" && mode != "server-race") {
    std::fprintf(stderr, "usage: %s guarded|client-race|server-race\n", argv[0]);
    return 2;
  }
  EchoService service(mode == "server-race");
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
  builder.RegisterService(&service);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (server == nullptr || port == 0) {
    std::fprintf(stderr, "grpc_probe: server did not start\n");
    return 1;
  }
  auto stub = hlem::test::Echo::NewStub(
      grpc::CreateChannel("127.0.0.1:" + std::to_string(port), grpc::InsecureChannelCredentials()));
  bool ok = true;
  if (mode == "guarded") {
    for (int i = 0; i < 20; ++i)
      ok = ok && CallbackCall(stub.get(), false) && QueueCall(stub.get());
  } else if (mode == "client-race") {
    ok = CallbackCall(stub.get(), true);
  } else {
    std::vector<std::thread> clients;
    for (int t = 0; t < 4; ++t) {
      clients.emplace_back([&stub] {
        grpc::ClientContext context;
        hlem::test::EchoRequest request;
        request.set_message("srv");
        request.set_sleep_ms(100);
        hlem::test::EchoResponse response;
        stub->Echo(&context, request, &response);
      });
    }
    for (std::thread& t : clients) t.join();
  }
  server->Shutdown();
  std::printf("grpc_probe %s: calls %s\n", mode.c_str(), ok ? "ok" : "FAILED");
  return ok ? 0 : 1;
}
