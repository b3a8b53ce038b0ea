#pragma once
// Upper bounds on the wire size of hlem.v1 requests, to size a server's receive limit
// (GrpcServerOptions::max_receive_bytes) from the counts the service accepts.
//
// gRPC parses a whole request before the handler runs, so a handler's count checks come too late
// to bound memory: an empty Event costs 2 bytes on the wire but ~80 bytes of heap once parsed, so
// a 64 MiB request of them holds 33 M events and ~3 GB. With the receive limit sized here, what
// one request can make a server allocate is proportional to the most it would ever accept.

#include <algorithm>
#include <cstdint>
#include <limits>

namespace hlem {

// The most bytes a varint takes, and a length-delimited field's tag + length prefix (a tag below
// 16 is one byte, a length below 2^35 five).
inline constexpr int64_t kMaxVarintBytes = 10;
inline constexpr int64_t kMaxFieldHeaderBytes = 1 + 5;
// Room for a request's small fields (user id, request id, delta prefix, table id) and for fields a
// newer client adds, which protobuf keeps as unknown fields.
inline constexpr int64_t kRequestSlackBytes = 64 << 10;
// No receive limit below this: health checks, reflection and admin calls are small but must pass.
inline constexpr int64_t kMinReceiveBytes = 1 << 20;

// One hlem.v1.Event at most: its header, item_id, `features` packed feature ids (a model with one
// table may send one or none) and the timestamp (a fixed64 double). A Candidate is smaller.
constexpr int64_t MaxEventBytes(uint64_t features) {
  const int64_t ids = static_cast<int64_t>(std::clamp<uint64_t>(features, 1, 1 << 20));
  return kMaxFieldHeaderBytes + (1 + kMaxVarintBytes) + kMaxFieldHeaderBytes +
         ids * kMaxVarintBytes + (1 + 8);
}

// Clamped to [kMinReceiveBytes, INT_MAX] (gRPC's limits are ints).
constexpr int ReceiveLimit(int64_t bytes) {
  return static_cast<int>(std::clamp<int64_t>(bytes + kRequestSlackBytes, kMinReceiveBytes,
                                              std::numeric_limits<int>::max()));
}

// A Recommend or Infer request with at most `events` history events and `candidates` candidates
// of `features` feature ids each.
constexpr int MaxScoringRequestBytes(uint64_t events, uint64_t candidates, uint64_t features) {
  const int64_t per = MaxEventBytes(features);
  const int64_t most = std::numeric_limits<int64_t>::max() / 4 / per;
  return ReceiveLimit(per * static_cast<int64_t>(std::min<uint64_t>(events, most)) +
                      per * static_cast<int64_t>(std::min<uint64_t>(candidates, most)));
}

// A Lookup request with at most `rows` packed row ids.
constexpr int MaxLookupRequestBytes(uint64_t rows) {
  return ReceiveLimit(kMaxFieldHeaderBytes +
                      kMaxVarintBytes * static_cast<int64_t>(std::min<uint64_t>(rows, 1ull << 40)));
}

}  // namespace hlem
