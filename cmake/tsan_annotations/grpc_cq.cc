// TSan builds of the service shells only (scripts/tsan-services.sh): happens-before annotations
// for gRPC's completion queues, preloaded beside absl_sync.cc. libgrpc is not built with TSan,
// and it hands each operation's tag from the thread that started the operation to the thread
// that sees it complete through its own lock-free queues and thread pools, which TSan cannot
// see: every access to a call's state after its completion would look like a race. The C
// functions that take a tag release it (the starting thread's writes so far are published under
// the tag's address); the completion (grpc_cq_end_op, libgrpc's own, reached through its PLT)
// acquires and re-releases it on the completing thread; grpc_completion_queue_next and _pluck
// acquire it on the thread that takes the event. On a callback queue the tag is a functor that
// libgrpc may run on another of its threads: its run function is swapped for one that acquires
// the tag first and then restores and calls the original. These add exactly the edges that the
// completion queue makes; races inside libgrpc itself are not checked (suppressions.txt).
#include <grpc/grpc.h>
#include <sanitizer/tsan_interface.h>

#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <string>
#include <unordered_map>

#include "absl/status/status.h"
#include "cmake/tsan_annotations/next.h"

// libgrpc's internal completion: declared as in its src/core/lib/surface/completion_queue.h.
struct grpc_cq_completion;
void grpc_cq_end_op(grpc_completion_queue* cq, void* tag, absl::Status error,
                    void (*done)(void* done_arg, grpc_cq_completion* storage), void* done_arg,
                    grpc_cq_completion* storage, bool internal);

extern "C" {
void AnnotateIgnoreSyncBegin(const char* file, int line);
void AnnotateIgnoreSyncEnd(const char* file, int line);
void AnnotateIgnoreReadsBegin(const char* file, int line);
void AnnotateIgnoreReadsEnd(const char* file, int line);
void AnnotateIgnoreWritesBegin(const char* file, int line);
void AnnotateIgnoreWritesEnd(const char* file, int line);
}

namespace {

void Release(void* tag) {
  if (tag != nullptr) __tsan_release(tag);
}

void Acquire(void* tag) {
  if (tag != nullptr) __tsan_acquire(tag);
}

using Run = void (*)(grpc_completion_queue_functor*, int);

// The original run function of each functor in flight. Its lock and accesses are hidden from
// TSan: they would otherwise order every completion after every other.
class Runs {
 public:
  void Put(grpc_completion_queue_functor* f, Run run) {
    Hidden hidden;
    std::lock_guard<std::mutex> lock(mu_);
    runs_[f] = run;
  }
  Run Take(grpc_completion_queue_functor* f) {
    Hidden hidden;
    std::lock_guard<std::mutex> lock(mu_);
    auto it = runs_.find(f);
    if (it == runs_.end()) {
      std::fprintf(stderr, "hlem tsan annotations: functor %p run without a completion\n",
                   static_cast<void*>(f));
      std::abort();
    }
    const Run run = it->second;
    runs_.erase(it);
    return run;
  }

 private:
  struct Hidden {
    Hidden() {
      AnnotateIgnoreSyncBegin(__FILE__, __LINE__);
      AnnotateIgnoreReadsBegin(__FILE__, __LINE__);
      AnnotateIgnoreWritesBegin(__FILE__, __LINE__);
    }
    ~Hidden() {
      AnnotateIgnoreWritesEnd(__FILE__, __LINE__);
      AnnotateIgnoreReadsEnd(__FILE__, __LINE__);
      AnnotateIgnoreSyncEnd(__FILE__, __LINE__);
    }
  };
  std::mutex mu_;
  std::unordered_map<grpc_completion_queue_functor*, Run> runs_;
};

Runs& InFlight() {
  static Runs* runs = new Runs;
  return *runs;
}

void AnnotatedRun(grpc_completion_queue_functor* f, int ok) {
  __tsan_acquire(f);
  const Run run = InFlight().Take(f);
  f->functor_run = run;
  run(f, ok);
}

}  // namespace

extern "C" {

grpc_call_error grpc_call_start_batch(grpc_call* call, const grpc_op* ops, size_t nops, void* tag,
                                      void* reserved) {
  static const auto next =
      hlem::tsan::Next<grpc_call_error (*)(grpc_call*, const grpc_op*, size_t, void*, void*)>(
          "grpc_call_start_batch");
  Release(tag);
  return next(call, ops, nops, tag, reserved);
}

grpc_call_error grpc_server_request_call(grpc_server* server, grpc_call** call,
                                         grpc_call_details* details,
                                         grpc_metadata_array* request_metadata,
                                         grpc_completion_queue* cq_bound_to_call,
                                         grpc_completion_queue* cq_for_notification,
                                         void* tag_new) {
  static const auto next = hlem::tsan::Next<grpc_call_error (*)(
      grpc_server*, grpc_call**, grpc_call_details*, grpc_metadata_array*, grpc_completion_queue*,
      grpc_completion_queue*, void*)>("grpc_server_request_call");
  Release(tag_new);
  return next(server, call, details, request_metadata, cq_bound_to_call, cq_for_notification,
              tag_new);
}

grpc_call_error grpc_server_request_registered_call(grpc_server* server, void* registered_method,
                                                    grpc_call** call, gpr_timespec* deadline,
                                                    grpc_metadata_array* request_metadata,
                                                    grpc_byte_buffer** optional_payload,
                                                    grpc_completion_queue* cq_bound_to_call,
                                                    grpc_completion_queue* cq_for_notification,
                                                    void* tag_new) {
  static const auto next = hlem::tsan::Next<grpc_call_error (*)(
      grpc_server*, void*, grpc_call**, gpr_timespec*, grpc_metadata_array*, grpc_byte_buffer**,
      grpc_completion_queue*, grpc_completion_queue*, void*)>(
      "grpc_server_request_registered_call");
  Release(tag_new);
  return next(server, registered_method, call, deadline, request_metadata, optional_payload,
              cq_bound_to_call, cq_for_notification, tag_new);
}

grpc_event grpc_completion_queue_next(grpc_completion_queue* cq, gpr_timespec deadline,
                                      void* reserved) {
  static const auto next =
      hlem::tsan::Next<grpc_event (*)(grpc_completion_queue*, gpr_timespec, void*)>(
          "grpc_completion_queue_next");
  const grpc_event event = next(cq, deadline, reserved);
  if (event.type == GRPC_OP_COMPLETE) Acquire(event.tag);
  return event;
}

grpc_event grpc_completion_queue_pluck(grpc_completion_queue* cq, void* tag, gpr_timespec deadline,
                                       void* reserved) {
  static const auto next =
      hlem::tsan::Next<grpc_event (*)(grpc_completion_queue*, void*, gpr_timespec, void*)>(
          "grpc_completion_queue_pluck");
  const grpc_event event = next(cq, tag, deadline, reserved);
  if (event.type == GRPC_OP_COMPLETE) Acquire(event.tag);
  return event;
}

}  // extern "C"

void grpc_cq_end_op(grpc_completion_queue* cq, void* tag, absl::Status error,
                    void (*done)(void* done_arg, grpc_cq_completion* storage), void* done_arg,
                    grpc_cq_completion* storage, bool internal) {
  using EndOp = void (*)(grpc_completion_queue*, void*, absl::Status,
                         void (*)(void*, grpc_cq_completion*), void*, grpc_cq_completion*, bool);
  using Type = grpc_cq_completion_type (*)(grpc_completion_queue*);
  static const EndOp next = [] {
    const std::string name = "_Z14grpc_cq_end_opP21grpc_completion_queuePvN" +
                             hlem::tsan::MangledAbsl() +
                             "6StatusEPFvS1_P18grpc_cq_completionES1_S6_b";
    return hlem::tsan::Next<EndOp>(name.c_str());
  }();
  static const Type type =
      hlem::tsan::Next<Type>("_Z27grpc_get_cq_completion_typeP21grpc_completion_queue");
  Acquire(tag);
  if (tag != nullptr && type(cq) == GRPC_CQ_CALLBACK) {
    auto* f = static_cast<grpc_completion_queue_functor*>(tag);
    InFlight().Put(f, f->functor_run);
    f->functor_run = &AnnotatedRun;
  }
  Release(tag);
  next(cq, tag, std::move(error), done, done_arg, storage, internal);
}
