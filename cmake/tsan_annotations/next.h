// TSan builds only (cmake/tsan_annotations): finds the definition that a preloaded function
// interposes, the next one in the dynamic linker's search order.
#pragma once

#include <dlfcn.h>

#include <cstdio>
#include <cstdlib>

namespace hlem::tsan {

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
