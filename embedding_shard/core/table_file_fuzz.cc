// Fuzz target: the table file header decoder (outside input: files given to a shard).
#include <cstddef>
#include <cstdint>
#include <span>

#include "embedding_shard/core/table_file.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto header = hlem::shard::ParseTableFileHeader(
      std::span<const std::byte>(reinterpret_cast<const std::byte*>(data), size));
  if (header.ok() && header->data_bytes != header->spec.total_bytes()) __builtin_trap();
  return 0;
}
