// Raises every explicit thread stack size in the process to at least kStackFloor.
//
// Why: a thread's stack must hold the static TLS of every library loaded at start-up, and
// pthread_create fails with EINVAL when it cannot. libtorch's dependencies bring about 100 KiB of
// static TLS (OpenBLAS 60 KiB, glog 30 KiB, libtorch_cpu 10 KiB), while Debian's civetweb 1.15
// (prometheus-cpp's /metrics server) asks for 100 KiB worker stacks at compile time, so in a
// binary that links libtorch the metrics server cannot start ("null context when constructing
// CivetServer"). Linked into such executables only (it interposes pthread_attr_setstacksize, which
// an executable's definition does for every library); larger requests pass unchanged. See
// docs/node.md.

#include <dlfcn.h>
#include <pthread.h>

#include <algorithm>
#include <cstddef>

namespace {
constexpr size_t kStackFloor = size_t{1} << 20;
using SetStackSize = int (*)(pthread_attr_t*, size_t);
}  // namespace

extern "C" int pthread_attr_setstacksize(pthread_attr_t* attr, size_t size) {
  static const SetStackSize next =
      reinterpret_cast<SetStackSize>(dlsym(RTLD_NEXT, "pthread_attr_setstacksize"));
  return next(attr, std::max(size, kStackFloor));
}
