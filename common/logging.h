#pragma once
// Logging set-up. Every component logs through its own named spdlog logger (GetLogger("router"));
// all of them share one set of sinks chosen by InitLogging() (stderr by default, or a file), so
// the sinks can be set once in main after the loggers were created by static or early code.
// Messages start with an event name and carry key=value fields:
//   log->warn("shard_unreachable addr={} error={}", addr, status.ToString());
// GetLogger, InitLogging and LogRateLimiter are thread-safe.

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/clock.h"
#include "spdlog/spdlog.h"

namespace hlem {

struct LoggingOptions {
  std::string level = "info";  // trace, debug, info, warn, error, critical, off
  std::string file;            // "" = stderr; otherwise appended to
  bool json = false;           // one JSON object per line: ts, level, logger, msg
};

// Re-targets every logger (existing and future) to the sinks described by `options` and sets the
// level. INVALID_ARGUMENT for an unknown level or a log file that cannot be opened.
absl::Status InitLogging(const LoggingOptions& options);

// The logger of `component`, created on first use and shared afterwards.
std::shared_ptr<spdlog::logger> GetLogger(std::string_view component);

// Logs "check_failed <message>" at critical level on `component`'s logger and aborts: for broken
// invariants (a bug, never bad input).
[[noreturn]] void CheckFailed(std::string_view component, std::string_view message);

// Lets one message through per `period` and counts the rest:
//   if (limiter.Allow()) log->warn("queue_full suppressed={}", limiter.suppressed());
class LogRateLimiter {
 public:
  LogRateLimiter(Clock& clock, absl::Duration period) : clock_(clock), period_(period) {}
  // True for the first call and then at most once per period.
  bool Allow();
  // Calls refused between the latest allowed call and the one before it.
  uint64_t suppressed();

 private:
  Clock& clock_;
  const absl::Duration period_;
  absl::Mutex mu_;
  absl::Time next_allowed_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
  uint64_t refused_ ABSL_GUARDED_BY(mu_) = 0;       // since the latest allowed call
  uint64_t last_refused_ ABSL_GUARDED_BY(mu_) = 0;  // before the latest allowed call
};

}  // namespace hlem
