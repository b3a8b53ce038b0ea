// Fuzz target: trace files (hlem loadgen, hlem sim read them from users). Every input is opened
// and read to its end or its first error: a clear status, never a crash, a hang or an allocation
// the file's size does not justify.
#include <sys/mman.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <string>

#include "sim/workload/trace.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const int fd = memfd_create("trace", 0);
  if (fd < 0) return 0;
  size_t written = 0;
  while (written < size) {
    const ssize_t n = write(fd, data + written, size - written);
    if (n <= 0) break;
    written += static_cast<size_t>(n);
  }
  auto reader = hlem::sim::TraceReader::Open("/proc/self/fd/" + std::to_string(fd));
  if (reader.ok()) {
    hlem::sim::TraceRequest request;
    for (int i = 0; i < 100000; ++i) {
      absl::StatusOr<bool> more = (*reader)->Next(&request);
      if (!more.ok() || !*more) break;
    }
  }
  close(fd);
  return 0;
}
