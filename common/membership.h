#pragma once
// Which peers a service talks to, as joins and leaves: a static address list (one machine) or a
// DNS name that resolves to many addresses (a Kubernetes headless service), with health checking.
// No RPC here: the resolver and the health probe are small interfaces (DNS and the gRPC health
// service in the binaries, fakes in tests). The router follows the serving nodes with it; the
// allocator reuses it.
//
// Poll() (every `interval` on its own thread after Start(), or called directly):
//   1. resolve the target; a failed resolution changes nothing (a DNS hiccup must not empty the
//      cluster);
//   2. probe every resolved address; one that is not a member joins after `healthy_to_join`
//      consecutive healthy probes; a member leaves after `unhealthy_to_leave` consecutive failed
//      probes, or at once when the resolution no longer names it (and may join again later);
//   3. tell the listener about the changes, in order, outside the lock, from the polling thread;
//      a listener that cannot take a joining peer (it answered health checks but not the
//      service's own handshake) returns false, and the peer joins again on a later poll.
// Thread-safe.

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/periodic.h"

namespace hlem {

// Turns the configured target into the peers' addresses ("host:port").
class AddressResolver {
 public:
  virtual ~AddressResolver() = default;
  virtual absl::StatusOr<std::vector<std::string>> Resolve() = 0;
  virtual std::string target() const = 0;
};

// A fixed list.
class StaticResolver final : public AddressResolver {
 public:
  explicit StaticResolver(std::vector<std::string> addresses) : addresses_(std::move(addresses)) {}
  absl::StatusOr<std::vector<std::string>> Resolve() override { return addresses_; }
  std::string target() const override;

 private:
  const std::vector<std::string> addresses_;
};

// "name:port" → every IPv4 and IPv6 address of the name (getaddrinfo), as "ip:port" / "[ip]:port",
// sorted. UNAVAILABLE when the name does not resolve.
class DnsResolver final : public AddressResolver {
 public:
  // INVALID_ARGUMENT unless `target` is "name:port" with a port in [1, 65535].
  static absl::StatusOr<std::unique_ptr<DnsResolver>> Create(const std::string& target);
  absl::StatusOr<std::vector<std::string>> Resolve() override;
  std::string target() const override { return name_ + ":" + std::to_string(port_); }

 private:
  DnsResolver(std::string name, int port) : name_(std::move(name)), port_(port) {}
  const std::string name_;
  const int port_;
};

// "dns:///name:port" (or "dns:name:port") → DnsResolver; otherwise a comma-separated static list.
// INVALID_ARGUMENT for an empty list or a bad DNS target.
absl::StatusOr<std::unique_ptr<AddressResolver>> MakeResolver(const std::string& spec);

class HealthProbe {
 public:
  virtual ~HealthProbe() = default;
  // OK when the peer at `address` serves; any error otherwise. Called from several threads at
  // once (a poll probes its peers in parallel).
  virtual absl::Status Check(const std::string& address, absl::Duration timeout) = 0;
};

struct MembershipOptions {
  absl::Duration interval = absl::Seconds(2);
  absl::Duration probe_timeout = absl::Seconds(1);
  uint32_t healthy_to_join = 1;
  uint32_t unhealthy_to_leave = 3;
};

struct MembershipStats {
  uint64_t polls = 0, resolve_failures = 0, probes = 0, probe_failures = 0, joins = 0, leaves = 0;
  uint64_t joins_refused = 0;
};

class Membership {
 public:
  // (address, joined): true for a join, false for a leave. The return value counts for joins
  // only: false refuses the peer for now.
  using Listener = std::function<bool(const std::string& address, bool joined)>;

  // INVALID_ARGUMENT for a non-positive interval or probe timeout, or a zero threshold.
  static absl::StatusOr<std::unique_ptr<Membership>> Create(const MembershipOptions& options,
                                                            AddressResolver& resolver,
                                                            HealthProbe& probe, Listener listener);
  ~Membership();  // Stop()

  void Poll();
  // Poll now and then every interval on a thread, until Stop().
  void Start();
  void Stop();

  std::vector<std::string> Members() const;  // sorted
  MembershipStats stats() const;
  const MembershipOptions& options() const { return options_; }
  std::string target() const { return resolver_.target(); }

 private:
  struct Peer {
    bool member = false;
    uint32_t healthy = 0, failed = 0;  // consecutive probes
  };
  Membership(const MembershipOptions& options, AddressResolver& resolver, HealthProbe& probe,
             Listener listener)
      : options_(options), resolver_(resolver), probe_(probe), listener_(std::move(listener)) {}

  const MembershipOptions options_;
  AddressResolver& resolver_;
  HealthProbe& probe_;
  const Listener listener_;
  absl::Mutex poll_mu_;  // one Poll at a time, so the listener sees changes in order
  mutable absl::Mutex mu_;
  absl::flat_hash_map<std::string, Peer> peers_ ABSL_GUARDED_BY(mu_);
  MembershipStats stats_ ABSL_GUARDED_BY(mu_);
  std::unique_ptr<PeriodicThread> thread_;
};

}  // namespace hlem
