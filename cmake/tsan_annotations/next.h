// TSan builds only (cmake/tsan_annotations): finds the definition that a preloaded function
// interposes, the next one in the dynamic linker's search order.
#pragma once

#include <dlfcn.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "absl/base/options.h"

namespace hlem::tsan {

#define HLEM_TSAN_STR2(x) #x
#define HLEM_TSAN_STR(x) HLEM_TSAN_STR2(x)

// absl's namespace as it appears in a mangled name, its inline namespace included
// ("4absl7debian3" on Debian 12).
inline std::string MangledAbsl() {
  const char* ns = HLEM_TSAN_STR(ABSL_OPTION_INLINE_NAMESPACE_NAME);
  return "4absl" + std::to_string(std::strlen(ns)) + ns;
}

template <typename F>
F Next(const char* symbol) {
  void* f = dlsym(RTLD_NEXT, symbol);
  if (f == nullptr) {
    std::fprintf(stderr, "hlem tsan annotations: %s not found\n", symbol);
    std::abort();
  }
  return reinterpret_cast<F>(f);
}

}  // namespace hlem::tsan
