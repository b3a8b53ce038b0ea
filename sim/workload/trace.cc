#include "sim/workload/trace.h"

#include <algorithm>
#include <cstring>
#include <filesystem>

#include "absl/strings/str_cat.h"

namespace hlem::sim {

namespace {

constexpr char kMagic[8] = {'H', 'L', 'E', 'M', 'T', 'R', 'C', '1'};
constexpr uint64_t kFnvPrime = 0x100000001b3ULL;
constexpr uint64_t kFnvBasis = 0xcbf29ce484222325ULL;

template <typename T>
void PutFixed(std::string* s, T v) {
  char b[sizeof(T)];
  std::memcpy(b, &v, sizeof(T));  // little-endian hosts only (x86-64, aarch64)
  s->append(b, sizeof(T));
}

void PutVarint(std::string* s, uint64_t v) {
  while (v >= 0x80) {
    s->push_back(static_cast<char>((v & 0x7f) | 0x80));
    v >>= 7;
  }
  s->push_back(static_cast<char>(v));
}

absl::Status Corrupt(absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat("trace: ", what));
}

}  // namespace

absl::StatusOr<std::unique_ptr<TraceWriter>> TraceWriter::Create(const std::string& path,
                                                                 const TraceHeader& header) {
  if (header.features.empty()) return absl::InvalidArgumentError("trace: no features");
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  if (!out) return absl::UnavailableError(absl::StrCat("trace: cannot create ", path));
  std::string h(kMagic, sizeof(kMagic));
  PutFixed<uint32_t>(&h, kTraceVersion);
  PutFixed<uint32_t>(&h, static_cast<uint32_t>(header.features.size()));
  PutFixed<uint64_t>(&h, header.seed);
  PutFixed<uint64_t>(&h, header.duration_ns);
  PutFixed<uint32_t>(&h, static_cast<uint32_t>(header.config_yaml.size()));
  h += header.config_yaml;
  for (const FeatureTable& f : header.features) {
    PutFixed<uint32_t>(&h, f.table_id);
    PutFixed<uint64_t>(&h, f.rows);
    PutFixed<uint32_t>(&h, static_cast<uint32_t>(f.name.size()));
    h += f.name;
  }
  h.push_back(header.generated_events ? 1 : 0);
  PutFixed<uint32_t>(&h, kGeneratorVersion);
  out.write(h.data(), static_cast<std::streamsize>(h.size()));
  std::unique_ptr<TraceWriter> w(
      new TraceWriter(std::move(out), header.features.size(), header.generated_events));
  w->Hash(h);  // version 2: the footer's hash covers the header too
  return w;
}

TraceWriter::~TraceWriter() = default;

void TraceWriter::Hash(const std::string& bytes) {
  for (char c : bytes) hash_ = (hash_ ^ static_cast<uint8_t>(c)) * kFnvPrime;
}

absl::Status TraceWriter::Append(const TraceRequest& r) {
  if (finished_) return absl::FailedPreconditionError("trace: already finished");
  if (r.omitted_events != 0 && !generated_) {
    return absl::InvalidArgumentError(absl::StrCat(
        "trace: request of user ", r.user,
        " leaves events out; only a trace of generated events may (its reader draws them)"));
  }
  if (r.new_events.size() % F_ != 0 || r.candidates.size() % F_ != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("trace: request of user ", r.user, ": ids not a multiple of ", F_));
  }
  if ((r.omitted_events + r.new_events.size() / F_) * F_ > kMaxRequestIds ||
      r.candidates.size() > kMaxRequestIds) {
    return absl::InvalidArgumentError(
        absl::StrCat("trace: request of user ", r.user, ": more than ", kMaxRequestIds, " ids"));
  }
  if (r.t_ns < last_t_) {
    return absl::InvalidArgumentError(
        absl::StrCat("trace: request at ", r.t_ns, " ns after one at ", last_t_, " ns"));
  }
  buf_.clear();
  buf_.push_back(1);
  PutVarint(&buf_, r.t_ns - last_t_);
  PutVarint(&buf_, r.user);
  PutVarint(&buf_, r.prior_events);
  PutVarint(&buf_, r.omitted_events + r.new_events.size() / F_);
  if (!generated_) {
    for (uint64_t id : r.new_events) PutVarint(&buf_, id);
  }
  PutVarint(&buf_, r.candidates.size() / F_);
  for (uint64_t id : r.candidates) PutVarint(&buf_, id);
  Hash(buf_);
  out_.write(buf_.data(), static_cast<std::streamsize>(buf_.size()));
  last_t_ = r.t_ns;
  ++count_;
  return absl::OkStatus();
}

absl::Status TraceWriter::Finish() {
  if (finished_) return absl::OkStatus();
  finished_ = true;
  std::string f(1, '\0');
  PutFixed<uint64_t>(&f, count_);
  PutFixed<uint64_t>(&f, hash_);
  out_.write(f.data(), static_cast<std::streamsize>(f.size()));
  out_.close();
  if (!out_) return absl::UnavailableError("trace: write failed");
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<TraceReader>> TraceReader::Open(const std::string& path) {
  if (!std::filesystem::exists(path)) {
    return absl::NotFoundError(absl::StrCat("trace: no file ", path));
  }
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::UnavailableError(absl::StrCat("trace: cannot open ", path));
  std::unique_ptr<TraceReader> r(new TraceReader(std::move(in)));
  r->hashing_ = true;  // version 2 hashes the header; version 1 starts over after it
  char magic[8];
  uint32_t version = 0, features = 0, config_len = 0;
  if (!r->Fixed(magic, 8) || std::memcmp(magic, kMagic, 8) != 0) {
    return Corrupt(absl::StrCat(path, " is not an HLEM trace (bad magic)"));
  }
  if (!r->Fixed(&version, 4) || version < 1 || version > kTraceVersion) {
    return Corrupt(
        absl::StrCat("version ", version, " (this build reads 1 to ", kTraceVersion, ")"));
  }
  TraceHeader& h = r->header_;
  h.version = version;
  if (!r->Fixed(&features, 4) || features == 0 || features > 1024 || !r->Fixed(&h.seed, 8) ||
      !r->Fixed(&h.duration_ns, 8) || !r->Fixed(&config_len, 4) || config_len > (64u << 20)) {
    return Corrupt("bad header");
  }
  h.config_yaml.resize(config_len);
  if (!r->Fixed(h.config_yaml.data(), config_len)) return Corrupt("truncated header");
  for (uint32_t f = 0; f < features; ++f) {
    FeatureTable t;
    uint32_t name_len = 0;
    if (!r->Fixed(&t.table_id, 4) || !r->Fixed(&t.rows, 8) || !r->Fixed(&name_len, 4) ||
        name_len > 4096) {
      return Corrupt("bad feature table");
    }
    t.name.resize(name_len);
    if (!r->Fixed(t.name.data(), name_len)) return Corrupt("truncated feature table");
    h.features.push_back(std::move(t));
  }
  if (version >= 2) {
    uint8_t events = 0;
    if (!r->Fixed(&events, 1) || events > 1) return Corrupt("bad events mode");
    h.generated_events = events == 1;
  }
  h.generator_version = 0;
  if (version >= 3 && !r->Fixed(&h.generator_version, 4)) return Corrupt("truncated header");
  r->hashing_ = false;
  if (version == 1) r->hash_ = kFnvBasis;
  if (h.generated_events && h.generator_version != 0 &&
      h.generator_version != static_cast<uint32_t>(kGeneratorVersion)) {
    return absl::FailedPreconditionError(absl::StrCat(
        "trace: ", path, " holds generated events of workload generator version ",
        h.generator_version, "; this build's generator is version ", kGeneratorVersion,
        " and would regenerate other events: write the trace again (hlem workload generate)"));
  }
  if (h.generated_events) {
    absl::StatusOr<WorkloadConfig> config = ParseWorkloadConfig(h.config_yaml);
    if (!config.ok()) {
      return Corrupt(
          absl::StrCat("generated events, but the header's generator config does not "
                       "read: ",
                       config.status().message()));
    }
    auto generator = WorkloadGenerator::Create(*config);
    if (!generator.ok()) {
      return Corrupt(absl::StrCat("generated events, but the header's generator: ",
                                  generator.status().message()));
    }
    const std::vector<FeatureTable>& tables = (*generator)->config().features;
    if (tables.size() != features || !std::equal(tables.begin(), tables.end(), h.features.begin(),
                                                 [](const FeatureTable& a, const FeatureTable& b) {
                                                   return a.table_id == b.table_id &&
                                                          a.rows == b.rows;
                                                 })) {
      return Corrupt("generated events, but the header's generator has other feature tables");
    }
    r->max_events_ = MaxEventsPerRequest(*config);
    r->events_ = std::move(*generator);
  }
  return r;
}

bool TraceReader::Byte(uint8_t* b) {
  if (pos_ == len_) {
    in_.read(buf_.data(), static_cast<std::streamsize>(buf_.size()));
    len_ = static_cast<size_t>(in_.gcount());
    pos_ = 0;
    if (len_ == 0) return false;
  }
  *b = static_cast<uint8_t>(buf_[pos_++]);
  if (hashing_) hash_ = (hash_ ^ *b) * kFnvPrime;
  return true;
}

bool TraceReader::Fixed(void* p, size_t n) {
  auto* out = static_cast<uint8_t*>(p);
  for (size_t i = 0; i < n; ++i) {
    if (!Byte(out + i)) return false;
  }
  return true;
}

bool TraceReader::Varint(uint64_t* v) {
  *v = 0;
  for (int shift = 0; shift < 64; shift += 7) {
    uint8_t b;
    if (!Byte(&b)) return false;
    *v |= static_cast<uint64_t>(b & 0x7f) << shift;
    if ((b & 0x80) == 0) return true;
  }
  return false;
}

absl::Status TraceReader::Ids(uint64_t n, std::vector<uint64_t>* out) {
  const size_t F = header_.features.size();
  if (absl::Status st = CheckIdCount(n); !st.ok()) return st;
  // Grown as the ids are read, not sized from the count: a corrupt count in a short file must not
  // allocate what the file's bytes (one at least per id) do not back.
  out->clear();
  out->reserve(std::min<uint64_t>(n * F, 1 << 16));
  for (uint64_t i = 0; i < n * F; ++i) {
    uint64_t id;
    if (!Varint(&id)) return Corrupt(absl::StrCat("record ", count_, ": truncated"));
    const FeatureTable& t = header_.features[i % F];
    if (id >= t.rows) {
      return Corrupt(absl::StrCat("record ", count_, ": id ", id, " past table ", t.name, " (",
                                  t.rows, " rows)"));
    }
    out->push_back(id);
  }
  return absl::OkStatus();
}

absl::Status TraceReader::CheckIdCount(uint64_t n) const {
  const size_t F = header_.features.size();
  if (n > kMaxRequestIds / F) {
    return Corrupt(absl::StrCat("record ", count_, ": ", n, " × ", F, " ids, more than the ",
                                kMaxRequestIds, " a request may carry"));
  }
  return absl::OkStatus();
}

absl::StatusOr<bool> TraceReader::Next(TraceRequest* out) {
  if (done_) return false;
  const uint64_t hash_before = hash_;
  hashing_ = true;
  uint8_t tag;
  if (!Byte(&tag)) return Corrupt(absl::StrCat("truncated after ", count_, " records (no footer)"));
  if (tag == 0) {
    hashing_ = false;
    uint64_t count = 0, hash = 0;
    if (!Fixed(&count, 8) || !Fixed(&hash, 8)) return Corrupt("truncated footer");
    if (count != count_) {
      return Corrupt(absl::StrCat("footer says ", count, " records, read ", count_));
    }
    if (hash != hash_before) return Corrupt("checksum mismatch");
    uint8_t extra;
    if (Byte(&extra)) return Corrupt("bytes after the footer");
    done_ = true;
    return false;
  }
  if (tag != 1) return Corrupt(absl::StrCat("record ", count_, ": bad tag ", int{tag}));
  uint64_t dt = 0, events = 0, candidates = 0;
  if (!Varint(&dt) || !Varint(&out->user) || !Varint(&out->prior_events) || !Varint(&events)) {
    return Corrupt(absl::StrCat("record ", count_, ": truncated"));
  }
  out->omitted_events = 0;
  if (events_ != nullptr) {
    if (events > max_events_) {
      return Corrupt(absl::StrCat("record ", count_, ": ", events,
                                  " events, more than the header's generator draws (", max_events_,
                                  ")"));
    }
    out->new_events.clear();
    if (omit_first_visits_ && out->prior_events == 0) {
      out->omitted_events = events;
    } else {
      events_->AppendEventsOf(out->user, out->prior_events, events, &out->new_events);
    }
  } else if (absl::Status st = Ids(events, &out->new_events); !st.ok()) {
    return st;
  }
  if (!Varint(&candidates)) return Corrupt(absl::StrCat("record ", count_, ": truncated"));
  if (absl::Status st = Ids(candidates, &out->candidates); !st.ok()) return st;
  hashing_ = false;
  last_t_ += dt;
  out->t_ns = last_t_;
  ++count_;
  return true;
}

absl::StatusOr<uint64_t> WriteTrace(WorkloadGenerator& generator, const std::string& path,
                                    bool generated_events) {
  const WorkloadConfig& c = generator.config();
  auto writer = TraceWriter::Create(path, {.seed = c.seed,
                                           .duration_ns = generator.duration_ns(),
                                           .config_yaml = WorkloadConfigYaml(c),
                                           .features = c.features,
                                           .generated_events = generated_events});
  if (!writer.ok()) return writer.status();
  TraceRequest r;
  while (generator.Next(
      &r, generated_events ? WorkloadGenerator::Events::kNone : WorkloadGenerator::Events::kAll)) {
    if (absl::Status st = (*writer)->Append(r); !st.ok()) return st;
  }
  if (absl::Status st = (*writer)->Finish(); !st.ok()) return st;
  return (*writer)->records();
}

}  // namespace hlem::sim
