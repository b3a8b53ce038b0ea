#include "common/membership.h"

#include <netdb.h>
#include <sys/socket.h>
#include <sys/types.h>

#include <arpa/inet.h>
#include <algorithm>
#include <thread>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

namespace hlem {
namespace {

// Peers a membership poll probes at once.
constexpr size_t kParallelProbes = 16;

}  // namespace

std::string StaticResolver::target() const { return absl::StrJoin(addresses_, ","); }

absl::StatusOr<std::unique_ptr<DnsResolver>> DnsResolver::Create(const std::string& target) {
  const size_t colon = target.rfind(':');
  int port = 0;
  if (colon == std::string::npos || colon == 0 ||
      !absl::SimpleAtoi(absl::string_view(target).substr(colon + 1), &port) || port < 1 ||
      port > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat("dns target '", target, "': want name:port with a port in [1, 65535]"));
  }
  return std::unique_ptr<DnsResolver>(new DnsResolver(target.substr(0, colon), port));
}

absl::StatusOr<std::vector<std::string>> DnsResolver::Resolve() {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* result = nullptr;
  if (const int rc = getaddrinfo(name_.c_str(), nullptr, &hints, &result); rc != 0) {
    return absl::UnavailableError(absl::StrCat("dns ", name_, ": ", gai_strerror(rc)));
  }
  std::vector<std::string> out;
  for (addrinfo* a = result; a != nullptr; a = a->ai_next) {
    char ip[INET6_ADDRSTRLEN] = {};
    if (a->ai_family == AF_INET) {
      inet_ntop(AF_INET, &reinterpret_cast<sockaddr_in*>(a->ai_addr)->sin_addr, ip, sizeof(ip));
      out.push_back(absl::StrCat(ip, ":", port_));
    } else if (a->ai_family == AF_INET6) {
      inet_ntop(AF_INET6, &reinterpret_cast<sockaddr_in6*>(a->ai_addr)->sin6_addr, ip, sizeof(ip));
      out.push_back(absl::StrCat("[", ip, "]:", port_));
    }
  }
  freeaddrinfo(result);
  std::sort(out.begin(), out.end());
  out.erase(std::unique(out.begin(), out.end()), out.end());
  if (out.empty()) return absl::UnavailableError(absl::StrCat("dns ", name_, ": no address"));
  return out;
}

absl::StatusOr<std::unique_ptr<AddressResolver>> MakeResolver(const std::string& spec) {
  absl::string_view s = spec;
  if (absl::ConsumePrefix(&s, "dns:")) {
    absl::ConsumePrefix(&s, "///");
    auto dns = DnsResolver::Create(std::string(s));
    if (!dns.ok()) return dns.status();
    return std::unique_ptr<AddressResolver>(std::move(*dns));
  }
  std::vector<std::string> addresses = absl::StrSplit(spec, ',', absl::SkipWhitespace());
  for (std::string& a : addresses) a = std::string(absl::StripAsciiWhitespace(a));
  if (addresses.empty()) return absl::InvalidArgumentError("no address");
  for (const std::string& a : addresses) {
    if (a.rfind(':') == std::string::npos) {
      return absl::InvalidArgumentError(absl::StrCat("address '", a, "': want host:port"));
    }
  }
  return std::unique_ptr<AddressResolver>(std::make_unique<StaticResolver>(std::move(addresses)));
}

absl::StatusOr<std::unique_ptr<Membership>> Membership::Create(const MembershipOptions& options,
                                                               AddressResolver& resolver,
                                                               HealthProbe& probe,
                                                               Listener listener) {
  if (options.interval <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("membership: interval must be > 0");
  }
  if (options.probe_timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("membership: probe_timeout must be > 0");
  }
  if (options.healthy_to_join == 0 || options.unhealthy_to_leave == 0) {
    return absl::InvalidArgumentError(
        "membership: healthy_to_join and unhealthy_to_leave must be >= 1");
  }
  return std::unique_ptr<Membership>(new Membership(options, resolver, probe, std::move(listener)));
}

Membership::~Membership() { Stop(); }

void Membership::Poll() {
  absl::MutexLock poll_lock(&poll_mu_);
  absl::StatusOr<std::vector<std::string>> resolved = resolver_.Resolve();
  std::vector<std::pair<std::string, bool>> changes;
  if (!resolved.ok()) {
    absl::MutexLock lock(&mu_);
    ++stats_.polls;
    ++stats_.resolve_failures;
    return;
  }
  // Probe outside the lock (probes block up to the timeout), up to kParallelProbes at once: one
  // after the other, every dead peer delayed the others' joins and leaves by a whole timeout.
  std::vector<absl::Status> health(resolved->size());
  for (size_t begin = 0; begin < resolved->size(); begin += kParallelProbes) {
    const size_t end = std::min(resolved->size(), begin + kParallelProbes);
    std::vector<std::thread> probes;
    for (size_t i = begin + 1; i < end; ++i) {
      probes.emplace_back(
          [&, i] { health[i] = probe_.Check((*resolved)[i], options_.probe_timeout); });
    }
    health[begin] = probe_.Check((*resolved)[begin], options_.probe_timeout);
    for (std::thread& t : probes) t.join();
  }
  {
    absl::MutexLock lock(&mu_);
    ++stats_.polls;
    // Members the resolution no longer names leave at once.
    std::vector<std::string> gone;
    for (const auto& [address, peer] : peers_) {
      if (std::find(resolved->begin(), resolved->end(), address) == resolved->end()) {
        gone.push_back(address);
      }
    }
    std::sort(gone.begin(), gone.end());
    for (const std::string& address : gone) {
      if (peers_[address].member) changes.emplace_back(address, false);
      peers_.erase(address);
    }
    for (size_t i = 0; i < resolved->size(); ++i) {
      const std::string& address = (*resolved)[i];
      Peer& peer = peers_[address];
      ++stats_.probes;
      if (health[i].ok()) {
        peer.failed = 0;
        ++peer.healthy;
        if (!peer.member && peer.healthy >= options_.healthy_to_join) {
          peer.member = true;
          changes.emplace_back(address, true);
        }
      } else {
        ++stats_.probe_failures;
        peer.healthy = 0;
        ++peer.failed;
        if (peer.member && peer.failed >= options_.unhealthy_to_leave) {
          peer.member = false;
          changes.emplace_back(address, false);
        }
      }
    }
  }
  for (const auto& [address, joined] : changes) {
    const bool taken = listener_(address, joined);
    absl::MutexLock lock(&mu_);
    if (!joined) {
      ++stats_.leaves;
    } else if (taken) {
      ++stats_.joins;
    } else {
      ++stats_.joins_refused;
      auto it = peers_.find(address);
      if (it != peers_.end()) {
        it->second.member = false;
        it->second.healthy = 0;
      }
    }
  }
}

void Membership::Start() {
  if (thread_ == nullptr) {
    thread_ = std::make_unique<PeriodicThread>(options_.interval, [this] { Poll(); });
  }
}

void Membership::Stop() { thread_.reset(); }

std::vector<std::string> Membership::Members() const {
  absl::MutexLock lock(&mu_);
  std::vector<std::string> out;
  for (const auto& [address, peer] : peers_) {
    if (peer.member) out.push_back(address);
  }
  std::sort(out.begin(), out.end());
  return out;
}

MembershipStats Membership::stats() const {
  absl::MutexLock lock(&mu_);
  return stats_;
}

}  // namespace hlem
