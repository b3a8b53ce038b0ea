#include "common/logging.h"

#include <cstdlib>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "common/absl_compat.h"
#include "spdlog/pattern_formatter.h"
#include "spdlog/sinks/basic_file_sink.h"
#include "spdlog/sinks/dist_sink.h"
#include "spdlog/sinks/stdout_color_sinks.h"

namespace hlem {
namespace {

constexpr char kTextPattern[] = "%Y-%m-%dT%H:%M:%S.%e %L %n %v";
constexpr char kJsonPattern[] =
    R"({"ts":"%Y-%m-%dT%H:%M:%S.%e","level":"%l","logger":"%n","msg":"%*"})";

// %* in the JSON pattern: the message, escaped as a JSON string body.
class JsonEscapedMessage : public spdlog::custom_flag_formatter {
 public:
  void format(const spdlog::details::log_msg& msg, const std::tm&,
              spdlog::memory_buf_t& dest) override {
    for (char c : msg.payload) {
      switch (c) {
        case '"':
          dest.append(std::string_view("\\\""));
          break;
        case '\\':
          dest.append(std::string_view("\\\\"));
          break;
        case '\n':
          dest.append(std::string_view("\\n"));
          break;
        case '\t':
          dest.append(std::string_view("\\t"));
          break;
        default:
          if (static_cast<unsigned char>(c) < 0x20) {
            std::string esc = absl::StrCat("\\u00", absl::Hex(c, absl::kZeroPad2));
            dest.append(std::string_view(esc));
          } else {
            dest.push_back(c);
          }
      }
    }
  }
  std::unique_ptr<custom_flag_formatter> clone() const override {
    return std::make_unique<JsonEscapedMessage>();
  }
};

std::unique_ptr<spdlog::formatter> MakeFormatter(bool json) {
  auto f = std::make_unique<spdlog::pattern_formatter>();
  if (json) f->add_flag<JsonEscapedMessage>('*');
  f->set_pattern(json ? kJsonPattern : kTextPattern);
  return f;
}

// The process-wide sinks and loggers (log sinks are one of the two allowed singletons).
struct LogState {
  absl::Mutex mu;
  std::shared_ptr<spdlog::sinks::dist_sink_mt> sink;
  spdlog::level::level_enum level ABSL_GUARDED_BY(mu) = spdlog::level::info;
  absl::flat_hash_map<std::string, std::shared_ptr<spdlog::logger>> loggers ABSL_GUARDED_BY(mu);
};

LogState& State() {
  static LogState* state = [] {
    auto* s = new LogState();
    auto stderr_sink = std::make_shared<spdlog::sinks::stderr_color_sink_mt>();
    stderr_sink->set_formatter(MakeFormatter(false));
    s->sink = std::make_shared<spdlog::sinks::dist_sink_mt>(
        std::vector<std::shared_ptr<spdlog::sinks::sink>>{stderr_sink});
    return s;
  }();
  return *state;
}

std::shared_ptr<spdlog::logger> NewLogger(LogState& st, std::string name)
    ABSL_EXCLUSIVE_LOCKS_REQUIRED(st.mu) {
  auto logger = std::make_shared<spdlog::logger>(name, st.sink);
  logger->set_level(st.level);
  logger->flush_on(spdlog::level::warn);
  st.loggers.emplace(std::move(name), logger);
  return logger;
}

}  // namespace

absl::Status InitLogging(const LoggingOptions& options) {
  spdlog::level::level_enum level = spdlog::level::from_str(options.level);
  if (level == spdlog::level::off && options.level != "off") {
    return absl::InvalidArgumentError(
        absl::StrCat("logging.level: unknown level '", options.level,
                     "'; allowed: trace, debug, info, warn, error, critical, off"));
  }
  std::shared_ptr<spdlog::sinks::sink> out;
  if (options.file.empty()) {
    out = std::make_shared<spdlog::sinks::stderr_color_sink_mt>();
  } else {
    try {
      out = std::make_shared<spdlog::sinks::basic_file_sink_mt>(options.file, /*truncate=*/false);
    } catch (const std::exception& e) {
      return absl::InvalidArgumentError(
          absl::StrCat("logging.file: cannot open '", options.file, "': ", e.what()));
    }
  }
  out->set_formatter(MakeFormatter(options.json));

  LogState& st = State();
  std::shared_ptr<spdlog::logger> fallback;
  {
    absl::MutexLock lock(&st.mu);
    st.sink->set_sinks({out});
    st.level = level;
    for (auto& [name, logger] : st.loggers) logger->set_level(level);
    auto it = st.loggers.find("hlem");
    fallback = it != st.loggers.end() ? it->second : NewLogger(st, "hlem");
  }
  // Code that calls spdlog::info() directly lands in the same sinks.
  spdlog::set_default_logger(fallback);
  return absl::OkStatus();
}

std::shared_ptr<spdlog::logger> GetLogger(std::string_view component) {
  LogState& st = State();
  absl::MutexLock lock(&st.mu);
  auto it = st.loggers.find(AsAbsl(component));
  if (it != st.loggers.end()) return it->second;
  return NewLogger(st, std::string(component));
}

void CheckFailed(std::string_view component, std::string_view message) {
  std::shared_ptr<spdlog::logger> log = GetLogger(component);
  log->critical("check_failed {}", message);
  log->flush();
  std::abort();
}

bool LogRateLimiter::Allow() {
  absl::Time now = clock_.Now();
  absl::MutexLock lock(&mu_);
  if (now < next_allowed_) {
    ++refused_;
    return false;
  }
  next_allowed_ = now + period_;
  last_refused_ = refused_;
  refused_ = 0;
  return true;
}

uint64_t LogRateLimiter::suppressed() {
  absl::MutexLock lock(&mu_);
  return last_refused_;
}

}  // namespace hlem
