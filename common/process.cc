#include "common/process.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iterator>
#include <string>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace hlem {

absl::StatusOr<ChildProcess> ChildProcess::Start(const std::vector<std::string>& argv,
                                                 const std::string& log_path) {
  return Start(argv, log_path, Options{});
}

pid_t ChildProcess::Detach() {
  reaped_ = true;  // not ours to kill or reap any more
  return pid_;
}

absl::StatusOr<ChildProcess> ChildProcess::Start(const std::vector<std::string>& argv,
                                                 const std::string& log_path,
                                                 const Options& options) {
  if (argv.empty()) return absl::InvalidArgumentError("empty argv");
  std::vector<char*> args;
  for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  int log = open(log_path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (log < 0) return absl::PermissionDeniedError(absl::StrCat("cannot open ", log_path));
  pid_t pid = fork();
  if (pid < 0) {
    close(log);
    return absl::ResourceExhaustedError("fork failed");
  }
  if (pid == 0) {
    // Child: unblock the signals a parent (e.g. InstallShutdownSignals) may have blocked.
    sigset_t all;
    sigfillset(&all);
    sigprocmask(SIG_UNBLOCK, &all, nullptr);
    if (options.new_session) setsid();
    if (options.die_with_parent) {
      // Die with the parent (e.g. a test killed by a ctest timeout): no orphan servers holding
      // GiBs.
      prctl(PR_SET_PDEATHSIG, SIGKILL);
      if (getppid() == 1) _exit(127);
    }
    dup2(log, STDOUT_FILENO);
    dup2(log, STDERR_FILENO);
    execv(args[0], args.data());
    _exit(127);
  }
  close(log);
  ChildProcess child(pid);
  child.reaped_ = false;
  return child;
}

ChildProcess::ChildProcess(ChildProcess&& other) noexcept
    : pid_(other.pid_), reaped_(other.reaped_) {
  other.pid_ = -1;
  other.reaped_ = true;
}

ChildProcess& ChildProcess::operator=(ChildProcess&& other) noexcept {
  if (this != &other) {
    if (!reaped_) Stop(absl::ZeroDuration());
    pid_ = other.pid_;
    reaped_ = other.reaped_;
    other.pid_ = -1;
    other.reaped_ = true;
  }
  return *this;
}

ChildProcess::~ChildProcess() {
  if (!reaped_) {
    kill(pid_, SIGKILL);
    waitpid(pid_, nullptr, 0);
  }
}

bool ChildProcess::running() {
  if (reaped_) return false;
  int status = 0;
  pid_t r = waitpid(pid_, &status, WNOHANG);
  if (r == pid_) reaped_ = true;
  return !reaped_;
}

void ChildProcess::Signal(int signal) {
  if (!reaped_) kill(pid_, signal);
}

namespace {

// Whether /proc says the process is stopped (state T): also true for one stopped before, whose
// stop waitpid has already reported.
bool IsStopped(pid_t pid) {
  std::ifstream in(absl::StrCat("/proc/", pid, "/stat"));
  std::string stat((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const size_t comm_end = stat.rfind(')');  // the command name may hold spaces and parentheses
  return comm_end != std::string::npos && comm_end + 2 < stat.size() && stat[comm_end + 2] == 'T';
}

}  // namespace

absl::Status ChildProcess::Pause(absl::Duration timeout) {
  if (reaped_) return absl::FailedPreconditionError("process already reaped");
  if (kill(pid_, SIGSTOP) != 0) {
    return absl::InternalError(absl::StrCat("kill(", pid_, ", SIGSTOP): ", std::strerror(errno)));
  }
  const absl::Time deadline = absl::Now() + timeout;
  for (;;) {
    int status = 0;
    const pid_t r = waitpid(pid_, &status, WNOHANG | WUNTRACED);
    if (r < 0) {
      return absl::InternalError(absl::StrCat("waitpid(", pid_, "): ", std::strerror(errno)));
    }
    if (r == pid_ && !WIFSTOPPED(status)) {
      reaped_ = true;
      return absl::FailedPreconditionError(absl::StrCat("pid ", pid_, " exited before it stopped"));
    }
    if (r == pid_ || IsStopped(pid_)) return absl::OkStatus();
    if (absl::Now() >= deadline) {
      return absl::DeadlineExceededError(absl::StrCat("pid ", pid_, " did not stop"));
    }
    absl::SleepFor(absl::Milliseconds(1));
  }
}

absl::StatusOr<int> ChildProcess::Wait(absl::Duration timeout) {
  if (reaped_) return absl::FailedPreconditionError("process already reaped");
  absl::Time deadline = absl::Now() + timeout;
  for (;;) {
    int status = 0;
    pid_t r = waitpid(pid_, &status, WNOHANG);
    if (r == pid_) {
      reaped_ = true;
      return status;
    }
    if (absl::Now() >= deadline) {
      return absl::DeadlineExceededError(absl::StrCat("pid ", pid_, " still running"));
    }
    absl::SleepFor(absl::Milliseconds(5));
  }
}

int ChildProcess::Stop(absl::Duration grace) {
  if (reaped_) return 0;
  kill(pid_, SIGTERM);
  kill(pid_, SIGCONT);  // a paused process handles its SIGTERM only once it runs
  auto status = Wait(grace);
  if (status.ok()) return *status;
  kill(pid_, SIGKILL);
  int s = 0;
  waitpid(pid_, &s, 0);
  reaped_ = true;
  return s;
}

absl::StatusOr<int> WaitForPort(const std::string& ports_file, const std::string& key,
                                absl::Duration timeout, ChildProcess* process) {
  absl::Time deadline = absl::Now() + timeout;
  while (absl::Now() < deadline) {
    std::ifstream in(ports_file);
    std::string line;
    while (std::getline(in, line)) {
      if (line.rfind(key + "=", 0) == 0) {
        int port = 0;
        if (absl::SimpleAtoi(line.substr(key.size() + 1), &port) && port > 0) return port;
      }
    }
    if (process != nullptr && !process->running()) {
      return absl::UnavailableError(absl::StrCat("process exited before writing ", ports_file));
    }
    absl::SleepFor(absl::Milliseconds(10));
  }
  return absl::DeadlineExceededError(absl::StrCat("no '", key, "' in ", ports_file));
}

void WritePortsFile(const std::string& path,
                    std::initializer_list<std::pair<const char*, int>> ports) {
  if (path.empty()) return;
  const std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp);
    for (const auto& [key, port] : ports) out << key << "=" << port << "\n";
  }
  std::rename(tmp.c_str(), path.c_str());
}

}  // namespace hlem
