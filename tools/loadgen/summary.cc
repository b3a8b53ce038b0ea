#include "tools/loadgen/summary.h"

#include <algorithm>
#include <cmath>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace hlem::loadgen {

namespace {

double Quantile(const std::vector<double>& sorted, double q) {
  if (sorted.empty()) return 0;
  const size_t i = static_cast<size_t>(std::ceil(q * static_cast<double>(sorted.size()))) - 1;
  return sorted[std::min(sorted.size() - 1, i)];
}

// What a Summary's quantiles and KV reuse are computed from: its OK answers' latencies and
// (cached, computed history) tokens.
struct Samples {
  std::vector<double> latencies_ms;
  uint64_t cached = 0, computed = 0;
};

void Finish(Summary* s, Samples* x) {
  std::vector<double>& latencies = x->latencies_ms;
  const uint64_t cached = x->cached, computed = x->computed;
  std::sort(latencies.begin(), latencies.end());
  s->p50_ms = Quantile(latencies, 0.5);
  s->p90_ms = Quantile(latencies, 0.9);
  s->p99_ms = Quantile(latencies, 0.99);
  s->slo_satisfaction =
      s->requests == 0 ? 0 : static_cast<double>(s->within_slo) / static_cast<double>(s->requests);
  s->throughput = s->seconds > 0 ? static_cast<double>(s->ok) / s->seconds : 0;
  s->kv_reuse = cached + computed == 0
                    ? 0
                    : static_cast<double>(cached) / static_cast<double>(cached + computed);
}

std::string CodeName(int code) {
  return code < 0 ? "NONE" : absl::StatusCodeToString(static_cast<absl::StatusCode>(code));
}

}  // namespace

std::vector<PhaseSpan> PhaseSpans(const std::vector<sim::Phase>& phases, double speed) {
  std::vector<PhaseSpan> spans;
  double at_s = 0;
  for (const sim::Phase& p : phases) {
    const double end_s = at_s + absl::ToDoubleSeconds(p.duration) / speed;
    spans.push_back({.name = sim::RegimeName(p.regime),
                     .start_ns = static_cast<uint64_t>(std::llround(at_s * 1e9)),
                     .end_ns = static_cast<uint64_t>(std::llround(end_s * 1e9))});
    at_s = end_s;
  }
  return spans;
}

absl::Status Check(const std::vector<Outcome>& outcomes) {
  for (size_t i = 0; i < outcomes.size(); ++i) {
    if (outcomes[i].code < 0) {
      return absl::InternalError(absl::StrCat("request ", i, " has no outcome"));
    }
  }
  return absl::OkStatus();
}

Report Summarize(const std::vector<Outcome>& outcomes, uint64_t window_ns, double slo_ms,
                 uint64_t warmup_ns, const std::vector<PhaseSpan>& phases) {
  Report r;
  r.warmup_ns = warmup_ns;
  for (const PhaseSpan& p : phases) {
    PhaseSummary ps{.span = p};
    ps.span.start_ns = std::max(p.start_ns, warmup_ns);
    ps.summary.seconds =
        static_cast<double>(ps.span.end_ns - std::min(ps.span.end_ns, ps.span.start_ns)) / 1e9;
    r.phases.push_back(std::move(ps));
  }
  std::vector<Samples> window_samples, phase_samples(phases.size());
  Samples all;
  uint64_t first = ~uint64_t{0}, last = 0;
  for (const Outcome& o : outcomes) {
    const uint64_t w = o.scheduled_ns / std::max<uint64_t>(1, window_ns);
    if (r.windows.size() <= w) {
      const size_t from = r.windows.size();
      r.windows.resize(w + 1);
      window_samples.resize(w + 1);
      for (size_t i = from; i <= w; ++i) {
        r.windows[i].window = i;
        r.windows[i].seconds = static_cast<double>(window_ns) / 1e9;
      }
    }
    // Requests scheduled in the warm-up count in their windows, not in the overall summary.
    const bool overall = o.scheduled_ns >= warmup_ns;
    size_t phase = r.phases.size();
    for (size_t i = 0; i < r.phases.size(); ++i) {
      const PhaseSpan& span = r.phases[i].span;
      if (o.scheduled_ns >= span.start_ns && o.scheduled_ns < span.end_ns) phase = i;
    }
    const std::pair<Summary*, Samples*> scope[3] = {
        {&r.windows[w], &window_samples[w]},
        overall ? std::pair{&r.overall, &all} : std::pair<Summary*, Samples*>{},
        phase < r.phases.size() ? std::pair{&r.phases[phase].summary, &phase_samples[phase]}
                                : std::pair<Summary*, Samples*>{}};
    if (overall) {
      first = std::min(first, o.scheduled_ns);
      last = std::max(last, o.sent_ns + o.latency_ns);
    }
    for (const auto& [s, x] : scope) {
      if (s == nullptr) continue;
      ++s->requests;
      ++s->codes[CodeName(o.code)];
    }
    if (o.code != 0) continue;
    const double ms = static_cast<double>(o.latency_ns) / 1e6;
    const bool within = ms <= slo_ms;
    const uint64_t history =
        o.computed_tokens > o.candidates ? o.computed_tokens - o.candidates : 0;  // new history
    for (const auto& [s, x] : scope) {
      if (s == nullptr) continue;
      ++s->ok;
      s->within_slo += within;
      s->stale_kv_hits += o.stale_kv_hit;
      x->latencies_ms.push_back(ms);
      x->cached += o.cached_prefix_tokens;
      x->computed += history;
    }
  }
  r.overall.seconds =
      r.overall.requests == 0 || last <= first ? 0 : static_cast<double>(last - first) / 1e9;
  for (size_t w = 0; w < r.windows.size(); ++w) Finish(&r.windows[w], &window_samples[w]);
  Finish(&r.overall, &all);
  for (size_t i = 0; i < r.phases.size(); ++i) Finish(&r.phases[i].summary, &phase_samples[i]);
  return r;
}

std::string OutcomesCsv(const std::vector<Outcome>& outcomes) {
  std::string out =
      "index,scheduled_s,sent_s,latency_ms,router_ms,node_ms,code,user,node,h_kv,h_emb,"
      "cached_prefix_tokens,computed_tokens,stale_kv_hit,retried,delta,resent,sent,queue_ms,"
      "lookup_ms,fetch_ms,copy_ms,compute_ms,kv_ms,candidates,emb_hits,emb_misses,message\n";
  auto ms = [](uint64_t ns) { return static_cast<double>(ns) / 1e6; };
  for (const Outcome& o : outcomes) {
    std::string message = o.message;
    std::replace(message.begin(), message.end(), '"', '\'');
    absl::StrAppendFormat(
        &out,
        "%d,%.6f,%.6f,%.3f,%.3f,%.3f,%s,%d,%s,%.0f,%.4f,%u,%u,%d,%d,%d,%d,%d,%.3f,%.3f,%.3f,%.3f,"
        "%.3f,%.3f,%u,%u,%u,\"%s\"\n",
        o.index, static_cast<double>(o.scheduled_ns) / 1e9, static_cast<double>(o.sent_ns) / 1e9,
        static_cast<double>(o.latency_ns) / 1e6, static_cast<double>(o.router_ns) / 1e6,
        static_cast<double>(o.node_ns) / 1e6, CodeName(o.code), o.user, o.node, o.h_kv, o.h_emb,
        o.cached_prefix_tokens, o.computed_tokens, o.stale_kv_hit, o.retried, o.delta, o.resent,
        o.sent, ms(o.stages.queue_ns), ms(o.stages.lookup_ns), ms(o.stages.fetch_ns),
        ms(o.stages.copy_ns), ms(o.stages.compute_ns), ms(o.stages.kv_ns), o.candidates, o.emb_hits,
        o.emb_misses, message);
  }
  return out;
}

std::string WindowsCsv(const Report& report) {
  std::string out =
      "window,requests,ok,p50_ms,p90_ms,p99_ms,slo_satisfaction,throughput,kv_reuse,"
      "stale_kv_hits,errors\n";
  for (const Summary& s : report.windows) {
    absl::StrAppendFormat(&out, "%d,%d,%d,%.3f,%.3f,%.3f,%.4f,%.2f,%.4f,%d,%d\n", s.window,
                          s.requests, s.ok, s.p50_ms, s.p90_ms, s.p99_ms, s.slo_satisfaction,
                          s.throughput, s.kv_reuse, s.stale_kv_hits, s.requests - s.ok);
  }
  return out;
}

std::string PhasesCsv(const Report& report) {
  std::string out =
      "phase,start_s,end_s,requests,ok,p50_ms,p90_ms,p99_ms,slo_satisfaction,throughput,kv_reuse,"
      "errors\n";
  for (const PhaseSummary& p : report.phases) {
    const Summary& s = p.summary;
    absl::StrAppendFormat(&out, "%s,%.3f,%.3f,%d,%d,%.3f,%.3f,%.3f,%.4f,%.2f,%.4f,%d\n",
                          p.span.name, static_cast<double>(p.span.start_ns) / 1e9,
                          static_cast<double>(p.span.end_ns) / 1e9, s.requests, s.ok, s.p50_ms,
                          s.p90_ms, s.p99_ms, s.slo_satisfaction, s.throughput, s.kv_reuse,
                          s.requests - s.ok);
  }
  return out;
}

std::string FormatReport(const Report& report, double slo_ms) {
  const Summary& o = report.overall;
  std::string out = absl::StrFormat(
      "requests %d, OK %d (%.2f %%), throughput %.1f/s over %.1f s\n"
      "latency of OK answers: p50 %.2f ms, p90 %.2f ms, p99 %.2f ms\n"
      "SLO %.0f ms satisfied: %.2f %% of requests (failures count as misses)\n"
      "KV reuse %.1f %% of history tokens; stale KV hits %d\ncodes:",
      o.requests, o.ok, o.requests == 0 ? 0.0 : 100.0 * o.ok / o.requests, o.throughput, o.seconds,
      o.p50_ms, o.p90_ms, o.p99_ms, slo_ms, 100 * o.slo_satisfaction, 100 * o.kv_reuse,
      o.stale_kv_hits);
  for (const auto& [code, n] : o.codes) absl::StrAppendFormat(&out, " %s %d", code, n);
  if (report.warmup_ns > 0) {
    absl::StrAppendFormat(&out, "\n(overall figures leave out the first %.1f s: warm-up)",
                          static_cast<double>(report.warmup_ns) / 1e9);
  }
  if (!report.phases.empty()) {
    absl::StrAppendFormat(&out, "\n%-8s %9s %8s %8s %9s %9s %8s %10s", "phase", "span_s",
                          "requests", "ok", "p50_ms", "p99_ms", "slo_%", "ok/s");
    for (const PhaseSummary& p : report.phases) {
      const Summary& s = p.summary;
      absl::StrAppendFormat(&out, "\n%-8s %4.0f-%-4.0f %8d %8d %9.2f %9.2f %8.2f %10.1f",
                            p.span.name, static_cast<double>(p.span.start_ns) / 1e9,
                            static_cast<double>(p.span.end_ns) / 1e9, s.requests, s.ok, s.p50_ms,
                            s.p99_ms, 100 * s.slo_satisfaction, s.throughput);
    }
  }
  absl::StrAppendFormat(&out, "\n%7s %8s %8s %9s %9s %9s %8s %8s\n", "window", "requests", "ok",
                        "p50_ms", "p90_ms", "p99_ms", "slo_%", "kv_%");
  for (const Summary& s : report.windows) {
    absl::StrAppendFormat(&out, "%7d %8d %8d %9.2f %9.2f %9.2f %8.2f %8.1f\n", s.window, s.requests,
                          s.ok, s.p50_ms, s.p90_ms, s.p99_ms, 100 * s.slo_satisfaction,
                          100 * s.kv_reuse);
  }
  return out;
}

}  // namespace hlem::loadgen
