#pragma once
// Child processes for integration tests, benchmarks and the local cluster tool (hlem cluster):
// start a binary with arguments and a log file, signal it, wait for it. A ChildProcess kills
// (SIGKILL) and reaps its process when destroyed, so a failing test leaves no orphans. Not
// thread-safe.

#include <sys/types.h>

#include <initializer_list>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace hlem {

class ChildProcess {
 public:
  struct Options {
    // The child gets SIGKILL when this process dies (tests: no orphans after a crash).
    bool die_with_parent = true;
    // The child leads a new session (a daemon: a terminal's Ctrl-C does not reach it).
    bool new_session = false;
  };
  // argv[0] is the executable path. stdout and stderr go to log_path (appended).
  static absl::StatusOr<ChildProcess> Start(const std::vector<std::string>& argv,
                                            const std::string& log_path);
  static absl::StatusOr<ChildProcess> Start(const std::vector<std::string>& argv,
                                            const std::string& log_path, const Options& options);
  ChildProcess(ChildProcess&& other) noexcept;
  ChildProcess& operator=(ChildProcess&& other) noexcept;
  ChildProcess(const ChildProcess&) = delete;
  ChildProcess& operator=(const ChildProcess&) = delete;
  ~ChildProcess();

  pid_t pid() const { return pid_; }
  bool running();
  void Signal(int signal);
  // SIGSTOP, and waits (up to `timeout`) until every thread of the process has stopped: a signal
  // is delivered asynchronously, and a test that stalls a server must not race its last steps.
  absl::Status Pause(absl::Duration timeout = absl::Seconds(5));
  // Waits for exit up to `timeout`; returns the exit status (as from waitpid), or
  // DEADLINE_EXCEEDED if it is still running.
  absl::StatusOr<int> Wait(absl::Duration timeout);
  // SIGTERM, wait up to `grace`, then SIGKILL. Returns the wait status.
  int Stop(absl::Duration grace = absl::Seconds(10));
  // Lets the process run on after this object goes (neither killed nor reaped); returns its pid.
  pid_t Detach();

 private:
  explicit ChildProcess(pid_t pid) : pid_(pid) {}
  pid_t pid_ = -1;
  bool reaped_ = true;
};

// Polls for a "key=value" line file written atomically by a server (e.g. --ports-file) and returns
// the value of `key`; DEADLINE_EXCEEDED after `timeout`.
absl::StatusOr<int> WaitForPort(const std::string& ports_file, const std::string& key,
                                absl::Duration timeout, ChildProcess* process = nullptr);

// Writes the "key=value" lines WaitForPort reads (a server's --ports-file: grpc=, metrics=, ...)
// atomically: to a temporary file, then renamed over `path`. Nothing for an empty path.
void WritePortsFile(const std::string& path,
                    std::initializer_list<std::pair<const char*, int>> ports);

}  // namespace hlem
