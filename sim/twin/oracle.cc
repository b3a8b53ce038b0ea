#include "sim/twin/oracle.h"

#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <optional>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"

namespace hlem::sim {
namespace {

double Round(double a, double step) { return std::round(a / step) * step; }

// The candidates of [from, to] on a grid of `step`, clipped to [lo, hi].
std::vector<double> Grid(double from, double to, double step, double lo, double hi) {
  std::vector<double> out;
  const double a = std::max(lo, from), b = std::min(hi, to);
  for (int64_t i = static_cast<int64_t>(std::ceil(a / step - 1e-9));
       static_cast<double>(i) * step <= b + 1e-9; ++i) {
    out.push_back(Round(static_cast<double>(i) * step, 1e-6));
  }
  return out;
}

// Evaluates α in a forked child: returns the child's reward through a pipe.
struct Child {
  pid_t pid = -1;
  int fd = -1;
  double alpha = 0;
};

Child Fork(Twin& twin, double alpha, absl::Duration from, absl::Duration to,
           const OracleOptions& o) {
  int fds[2];
  if (pipe(fds) != 0) return {};
  std::fflush(nullptr);  // a child must not flush the parent's buffered output again
  const pid_t pid = fork();
  if (pid < 0) {
    close(fds[0]);
    close(fds[1]);
    return {};
  }
  if (pid == 0) {
    close(fds[0]);
    twin.SealSource();  // the trace file's offset is shared with the parent
    WindowScore score{.reward = std::nan("")};
    if (twin.SetAlpha(alpha).ok()) {
      twin.RunUntil(to);
      for (absl::Duration t = to; !twin.AnsweredBefore(to) && t < to + o.drain;) {
        t += absl::Milliseconds(100);
        twin.RunUntil(t);
      }
      if (twin.AnsweredBefore(to)) score = ScoreWindow(twin.outcomes(), from, to, o.slo);
    }
    const ssize_t n = write(fds[1], &score, sizeof score);
    _exit(n == sizeof score ? 0 : 1);  // no destructors, no atexit: the parent owns everything
  }
  close(fds[1]);
  return {pid, fds[0], alpha};
}

absl::StatusOr<WindowScore> Collect(const Child& c) {
  WindowScore score{.reward = std::nan("")};
  ssize_t n;
  do {
    n = read(c.fd, &score, sizeof score);
  } while (n < 0 && errno == EINTR);
  close(c.fd);
  int status = 0;
  waitpid(c.pid, &status, 0);
  if (n != sizeof score || !WIFEXITED(status) || WEXITSTATUS(status) != 0 ||
      std::isnan(score.reward)) {
    return absl::InternalError(absl::StrCat("the child evaluating alpha ", c.alpha, " failed"));
  }
  return score;
}

}  // namespace

double WindowReward(const std::vector<TwinOutcome>& outcomes, absl::Duration from,
                    absl::Duration to, absl::Duration slo) {
  return ScoreWindow(outcomes, from, to, slo).reward;
}

WindowScore ScoreWindow(const std::vector<TwinOutcome>& outcomes, absl::Duration from,
                        absl::Duration to, absl::Duration slo) {
  const auto lo = static_cast<uint64_t>(absl::ToInt64Nanoseconds(from));
  const auto hi = static_cast<uint64_t>(absl::ToInt64Nanoseconds(to));
  const auto slo_ns = static_cast<uint64_t>(absl::ToInt64Nanoseconds(slo));
  std::vector<uint64_t> latencies;  // a failed request counts as never answered
  uint64_t satisfied = 0;
  for (const TwinOutcome& o : outcomes) {
    if (o.sent_ns < lo) continue;
    if (o.sent_ns >= hi) break;
    const bool ok = o.code == absl::StatusCode::kOk;
    latencies.push_back(ok ? o.latency_ns : UINT64_MAX);
    satisfied += ok && o.latency_ns <= slo_ns;
  }
  if (latencies.empty()) return {};
  const size_t k = std::min(latencies.size() - 1,
                            static_cast<size_t>(0.99 * static_cast<double>(latencies.size())));
  std::nth_element(latencies.begin(), latencies.begin() + static_cast<std::ptrdiff_t>(k),
                   latencies.end());
  const bool failed = latencies[k] == UINT64_MAX;
  return {.reward = Reward(static_cast<double>(satisfied) / static_cast<double>(latencies.size()),
                           failed ? absl::InfiniteDuration()
                                  : absl::Nanoseconds(static_cast<int64_t>(latencies[k])),
                           slo),
          .p99_ms = failed ? std::numeric_limits<double>::infinity()
                           : static_cast<double>(latencies[k]) / 1e6};
}

double Reward(double slo_satisfied, absl::Duration p99, absl::Duration slo) {
  const double norm = std::min(absl::FDivDuration(p99, slo), kRewardP99Cap);
  return slo_satisfied - std::max(0.0, norm - 1.0);
}

std::string FormatWindowOracle(const WindowOracle& w) {
  std::string out =
      absl::StrFormat("%d %a %a %a %a %d %d", w.window, w.alpha_star, w.reward_star, w.p99_star_ms,
                      w.alpha_followed, w.unimodal ? 1 : 0, w.curve.size());
  for (const CurvePoint& p : w.curve)
    absl::StrAppendFormat(&out, " %a %a %a", p.alpha, p.reward, p.p99_ms);
  return out;
}

absl::StatusOr<WindowOracle> ParseWindowOracle(const std::string& text) {
  const std::vector<std::string> f = absl::StrSplit(text, ' ', absl::SkipEmpty());
  auto number = [&](size_t i, double* v) {
    if (i >= f.size()) return false;
    char* end = nullptr;
    *v = std::strtod(f[i].c_str(), &end);
    return end != f[i].c_str() && *end == '\0';
  };
  WindowOracle w;
  double window = 0, unimodal = 0, points = 0;
  if (!number(0, &window) || !number(1, &w.alpha_star) || !number(2, &w.reward_star) ||
      !number(3, &w.p99_star_ms) || !number(4, &w.alpha_followed) || !number(5, &unimodal) ||
      !number(6, &points) || !(window >= 0 && window == std::floor(window)) ||
      !(points >= 0 && points == std::floor(points) && points <= static_cast<double>(f.size())) ||
      f.size() != 7 + 3 * static_cast<size_t>(points)) {
    return absl::InvalidArgumentError(
        absl::StrCat("a searched window: expected 7 numbers and 3 per curve point, got \"",
                     text.substr(0, 80), "\""));
  }
  w.window = static_cast<uint64_t>(window);
  w.unimodal = unimodal != 0;
  w.curve.resize(static_cast<size_t>(points));
  for (size_t i = 0; i < w.curve.size(); ++i) {
    CurvePoint& p = w.curve[i];
    if (!number(7 + 3 * i, &p.alpha) || !number(8 + 3 * i, &p.reward) ||
        !number(9 + 3 * i, &p.p99_ms)) {
      return absl::InvalidArgumentError(
          absl::StrCat("a searched window: curve point ", i, " is not three numbers"));
    }
  }
  return w;
}

absl::Status CheckOptions(const OracleOptions& o) {
  if (!(o.coarse_step > 0 && o.fine_step > 0 && o.finest_step > 0 && o.lo <= o.hi) ||
      o.window <= absl::ZeroDuration() || o.parallel < 1) {
    return absl::InvalidArgumentError("oracle: bad grid, window or parallelism");
  }
  return absl::OkStatus();
}

absl::StatusOr<WindowOracle> SearchAlphaStar(Twin& twin, uint64_t window, absl::Duration from,
                                             absl::Duration to, double prefer,
                                             const OracleOptions& o) {
  if (absl::Status st = CheckOptions(o); !st.ok()) return st;
  if (to <= from) return absl::InvalidArgumentError("oracle: empty window");
  // Every request a child may see, read by the parent before it forks.
  twin.Prefetch(to + o.drain + absl::Seconds(1));
  WindowOracle result{.window = window};
  // Evaluates the candidates not evaluated yet, `parallel` children at a time.
  auto evaluate = [&](const std::vector<double>& alphas) -> absl::Status {
    std::vector<double> todo;
    for (double a : alphas) {
      const bool seen = std::any_of(result.curve.begin(), result.curve.end(),
                                    [&](const auto& p) { return std::abs(p.alpha - a) < 1e-9; });
      if (!seen) todo.push_back(a);
    }
    for (size_t i = 0; i < todo.size(); i += static_cast<size_t>(o.parallel)) {
      std::vector<Child> children;
      for (size_t j = i; j < std::min(todo.size(), i + static_cast<size_t>(o.parallel)); ++j) {
        Child c = Fork(twin, todo[j], from, to, o);
        if (c.pid < 0) return absl::InternalError(absl::StrCat("fork: ", std::strerror(errno)));
        children.push_back(c);
      }
      absl::Status first;
      for (const Child& c : children) {
        absl::StatusOr<WindowScore> r = Collect(c);
        if (!r.ok() && first.ok()) first = r.status();
        if (r.ok()) result.curve.push_back({c.alpha, r->reward, r->p99_ms});
      }
      if (!first.ok()) return first;
    }
    std::sort(result.curve.begin(), result.curve.end(),
              [](const CurvePoint& a, const CurvePoint& b) { return a.alpha < b.alpha; });
    return absl::OkStatus();
  };
  // What α* maximises: the reward; among rewards within kRewardTie of the best (when every
  // candidate meets the SLO the reward saturates and says nothing), the lower window P99; among
  // equal P99s (a window too short for the caches to tell some αs apart), the α nearest
  // `prefer`: no move without a gain. objective() ranks by the first two, for the unimodality
  // check.
  auto top = [&] {
    double t = -1e300;
    for (const CurvePoint& p : result.curve) t = std::max(t, p.reward);
    return t;
  };
  auto objective = [&](const CurvePoint& p, double best_reward) {
    return p.reward >= best_reward - kRewardTie ? 1e12 - p.p99_ms : p.reward;
  };
  auto best = [&] {
    const double t = top();
    double best_value = -1e300;
    for (const CurvePoint& p : result.curve) best_value = std::max(best_value, objective(p, t));
    const CurvePoint* pick = nullptr;
    for (const CurvePoint& p : result.curve) {
      if (objective(p, t) >= best_value - 1e-9 &&
          (pick == nullptr || std::abs(p.alpha - prefer) < std::abs(pick->alpha - prefer))) {
        pick = &p;
      }
    }
    return *pick;
  };
  if (absl::Status st = evaluate(Grid(o.lo, o.hi, o.coarse_step, o.lo, o.hi)); !st.ok()) return st;
  int maxima = 0;
  const double coarse_top = top();
  for (size_t i = 0; i < result.curve.size(); ++i) {
    const double r = objective(result.curve[i], coarse_top);
    const bool left = i == 0 || r > objective(result.curve[i - 1], coarse_top) + 1e-12;
    const bool right =
        i + 1 == result.curve.size() || r >= objective(result.curve[i + 1], coarse_top) - 1e-12;
    // A plateau counts once: its left end.
    maxima += left && right;
  }
  result.unimodal = maxima <= 1;
  const double coarse_best = best().alpha;
  absl::Status st = result.unimodal
                        ? evaluate(Grid(coarse_best - o.coarse_step, coarse_best + o.coarse_step,
                                        o.fine_step, o.lo, o.hi))
                        : evaluate(Grid(o.lo, o.hi, o.fine_step, o.lo, o.hi));
  if (!st.ok()) return st;
  const double fine_best = best().alpha;
  st = evaluate(Grid(fine_best - o.fine_step, fine_best + o.fine_step, o.finest_step, o.lo, o.hi));
  if (!st.ok()) return st;
  const CurvePoint star = best();
  result.alpha_star = star.alpha;
  result.reward_star = star.reward;
  result.p99_star_ms = star.p99_ms;
  return result;
}

absl::StatusOr<std::vector<WindowOracle>> WindowAlphaStar(
    Twin& twin, const OracleOptions& o,
    const std::function<double(uint64_t window, double alpha_star)>& follow) {
  if (absl::Status st = CheckOptions(o); !st.ok()) return st;
  std::vector<WindowOracle> out;
  double current = twin.options().alpha;
  for (uint64_t w = 0; !twin.done(); ++w) {
    const absl::Duration from = o.window * static_cast<int64_t>(w), to = from + o.window;
    twin.RunUntil(from);
    absl::StatusOr<WindowOracle> found = SearchAlphaStar(twin, w, from, to, current, o);
    if (!found.ok()) return found.status();
    WindowOracle result = *std::move(found);
    result.alpha_followed = follow(w, result.alpha_star);
    if (absl::Status set = twin.SetAlpha(result.alpha_followed); !set.ok()) return set;
    current = result.alpha_followed;
    out.push_back(std::move(result));
    twin.RunUntil(to);
  }
  return out;
}

absl::StatusOr<Tracked> TrackControlled(
    Twin& twin, std::function<bool(TraceRequest*)> next,
    const std::function<std::unique_ptr<allocator::Controller>()>& make,
    const ControlOptions& control, const OracleOptions& oracle) {
  if (absl::Status st = CheckOptions(oracle); !st.ok()) return st;
  absl::StatusOr<ControlLoop> loop = ControlLoop::Create(twin, make, control);
  if (!loop.ok()) return loop.status();
  if (absl::Status st = twin.Start(std::move(next)); !st.ok()) return st;
  Tracked out;
  std::vector<TrackedWindow> windows;
  // The cache's key: what the search depends on beyond the caller's inputs; every α applied so
  // far (out.decisions[0, applied) written into `alphas`).
  const std::string grid = absl::StrFormat(
      " search=%a:%a:%a:%a:%a drain=%d window=%d slo=%d", oracle.lo, oracle.hi, oracle.coarse_step,
      oracle.fine_step, oracle.finest_step, absl::ToInt64Nanoseconds(oracle.drain),
      absl::ToInt64Nanoseconds(oracle.window), absl::ToInt64Nanoseconds(oracle.slo));
  std::string alphas;
  size_t applied = 0;
  for (int64_t k = 1; !twin.done(); ++k) {
    const absl::Duration from = control.window * k + control.delay, to = from + control.window;
    twin.RunUntil(from);
    if (k % std::max<uint32_t>(oracle.search_every, 1) != 0) {
      if (absl::Status st = loop->Decide(&out.decisions); !st.ok()) return st;
      continue;
    }
    double current = 0;  // the nodes' mean α_{t−1}
    for (double a : loop->alphas()) current += a / static_cast<double>(loop->alphas().size());
    std::string key;
    std::optional<WindowOracle> found;
    if (oracle.cache != nullptr) {
      for (; applied < out.decisions.size(); ++applied) {
        const ControlRecord& d = out.decisions[applied];
        absl::StrAppendFormat(&alphas, "%d:%d:%a;", d.window, d.node, d.alpha);
      }
      key = absl::StrCat(oracle.cache_key, grid, " t=", k, " alphas=", alphas);
      found = oracle.cache->Find(key);
    }
    absl::StatusOr<WindowOracle> star;
    if (found.has_value()) {
      // As the search would have: the parent reads the trace ahead (the same requests follow).
      twin.Prefetch(to + oracle.drain + absl::Seconds(1));
      star = *std::move(found);
    } else {
      star = SearchAlphaStar(twin, static_cast<uint64_t>(k), from, to, current, oracle);
      if (star.ok() && oracle.cache != nullptr) oracle.cache->Store(key, *star);
    }
    if (!star.ok()) return star.status();
    if (absl::Status st = loop->Decide(&out.decisions); !st.ok()) return st;
    TrackedWindow w{.window = static_cast<uint64_t>(k),
                    .alpha_star = star->alpha_star,
                    .reward_star = star->reward_star,
                    .p99_star_ms = star->p99_star_ms,
                    .unimodal = star->unimodal,
                    .alphas = loop->alphas(),
                    .curve = std::move(star->curve)};
    for (double a : w.alphas)
      w.gap += std::abs(a - w.alpha_star) / static_cast<double>(w.alphas.size());
    windows.push_back(std::move(w));
  }
  if (absl::Status st = twin.Finish(); !st.ok()) return st;
  for (TrackedWindow& w : windows) {
    const absl::Duration from = control.window * static_cast<int64_t>(w.window) + control.delay;
    const auto lo = static_cast<uint64_t>(absl::ToInt64Nanoseconds(from));
    const auto hi = static_cast<uint64_t>(absl::ToInt64Nanoseconds(from + control.window));
    for (const TwinOutcome& o : twin.outcomes()) w.requests += o.sent_ns >= lo && o.sent_ns < hi;
    if (w.requests == 0) continue;  // after the trace's end
    const WindowScore score = ScoreWindow(twin.outcomes(), from, from + control.window, oracle.slo);
    w.reward = score.reward;
    w.p99_ms = score.p99_ms;
    out.windows.push_back(std::move(w));
  }
  return out;
}

}  // namespace hlem::sim
