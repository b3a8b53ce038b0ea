#pragma once
// Memory backed by transparent huge pages, for large tables read at random (the EMB index and
// entry store, the cpu device's arena, the shard's tables). With 4 KiB pages every random read of
// a table of hundreds of MB also misses the TLB; 2 MiB pages cut the page walks ~500-fold. The
// kernel honours the request when THP is `always` or `madvise` (Debian's default); with `never`
// the memory is ordinary and only the alignment remains.

#include <sys/mman.h>

#include <cstddef>
#include <cstdlib>
#include <memory>
#include <new>

namespace hlem {

inline constexpr size_t kHugePageBytes = size_t{2} << 20;

// Allocates `bytes` aligned to a huge page and advises the kernel to back them with huge pages
// when they span at least one; else plain operator new. nullptr when out of memory. Free with
// FreeHugePages(p, bytes).
inline void* AllocHugePages(size_t bytes) {
  if (bytes < kHugePageBytes) return ::operator new(bytes, std::nothrow);
  const size_t rounded = (bytes + kHugePageBytes - 1) / kHugePageBytes * kHugePageBytes;
  void* p = std::aligned_alloc(kHugePageBytes, rounded);
  if (p != nullptr) ::madvise(p, rounded, MADV_HUGEPAGE);  // advisory: failure is harmless
  return p;
}
inline void FreeHugePages(void* p, size_t bytes) {
  if (bytes < kHugePageBytes) {
    ::operator delete(p);
  } else {
    std::free(p);
  }
}

// A std allocator over AllocHugePages: containers that grow past 2 MiB get huge pages.
template <class T>
struct HugePageAllocator {
  using value_type = T;
  HugePageAllocator() = default;
  template <class U>
  HugePageAllocator(const HugePageAllocator<U>&) {}  // NOLINT: rebinding is implicit
  T* allocate(size_t n) {
    void* p = AllocHugePages(n * sizeof(T));
    if (p == nullptr) throw std::bad_alloc();
    return static_cast<T*>(p);
  }
  void deallocate(T* p, size_t n) { FreeHugePages(p, n * sizeof(T)); }
  template <class U>
  bool operator==(const HugePageAllocator<U>&) const {
    return true;
  }
};

// An array of `n` bytes on huge pages (uninitialised), freed on destruction.
struct HugePageDeleter {
  size_t bytes = 0;
  void operator()(std::byte* p) const { FreeHugePages(p, bytes); }
};
using HugePageBuffer = std::unique_ptr<std::byte[], HugePageDeleter>;
inline HugePageBuffer MakeHugePageBuffer(size_t bytes) {
  return HugePageBuffer(static_cast<std::byte*>(AllocHugePages(bytes)), HugePageDeleter{bytes});
}

}  // namespace hlem
