#include "common/config.h"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <fstream>
#include <sstream>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/absl_compat.h"

namespace hlem {
namespace {

absl::StatusOr<YAML::Node> ParseNamed(std::string_view text, std::string_view name) {
  try {
    return YAML::Load(std::string(text));
  } catch (const YAML::Exception& e) {
    return absl::InvalidArgumentError(
        absl::StrCat(AsAbsl(name), ":", e.mark.line + 1, ":", e.mark.column + 1, ": ", e.msg));
  } catch (const std::exception& e) {
    return absl::InvalidArgumentError(absl::StrCat(AsAbsl(name), ": ", e.what()));
  }
}

// How a value is shown in "expected X, got Y".
std::string Describe(const YAML::Node& n) {
  switch (n.Type()) {
    case YAML::NodeType::Map:
      return "a map";
    case YAML::NodeType::Sequence:
      return "a list";
    case YAML::NodeType::Scalar:
      return absl::StrCat("'", n.Scalar(), "'");
    default:
      return "null";
  }
}

// Runs `body`; yaml-cpp (or anything else) throwing becomes an error on `key`.
template <typename Body>
void Guard(ConfigReader& r, std::string_view key, Body&& body) {
  try {
    body();
  } catch (const YAML::Exception& e) {
    r.AddError(key, absl::StrCat("invalid value: ", e.msg));
  } catch (const std::exception& e) {
    r.AddError(key, absl::StrCat("invalid value: ", e.what()));
  }
}

bool ParseInt64(absl::string_view s, int64_t* v) {
  if (absl::StartsWithIgnoreCase(s, "0x")) {
    uint64_t u;
    if (!absl::SimpleHexAtoi(s.substr(2), &u) || u > uint64_t{INT64_MAX}) return false;
    *v = static_cast<int64_t>(u);
    return true;
  }
  return absl::SimpleAtoi(s, v);
}

bool ParseUInt64(absl::string_view s, uint64_t* v) {
  if (absl::StartsWithIgnoreCase(s, "0x")) return absl::SimpleHexAtoi(s.substr(2), v);
  return !absl::StartsWith(s, "-") && absl::SimpleAtoi(s, v);
}

// YAML spells infinities and NaN with a leading dot.
bool ParseDouble(absl::string_view s, double* v) {
  std::string t = absl::AsciiStrToLower(s);
  if (t == ".inf" || t == "+.inf") t = "inf";
  if (t == "-.inf") t = "-inf";
  return absl::SimpleAtod(t, v) && !std::isnan(*v);
}

bool ParseBytes(absl::string_view s, uint64_t* out) {
  size_t i = 0;
  while (i < s.size() && (absl::ascii_isdigit(s[i]) || s[i] == '.')) ++i;
  absl::string_view number = s.substr(0, i);
  absl::string_view unit = absl::StripAsciiWhitespace(s.substr(i));
  if (number.empty()) return false;
  static constexpr std::pair<absl::string_view, uint64_t> kUnits[] = {
      {"", 1},
      {"B", 1},
      {"KiB", 1ull << 10},
      {"MiB", 1ull << 20},
      {"GiB", 1ull << 30},
      {"TiB", 1ull << 40},
      {"KB", 1000},
      {"MB", 1000 * 1000},
      {"GB", 1000 * 1000 * 1000},
      {"TB", 1000ull * 1000 * 1000 * 1000}};
  uint64_t mult = 0;
  for (const auto& [name, m] : kUnits) {
    if (absl::EqualsIgnoreCase(unit, name)) mult = m;
  }
  if (mult == 0) return false;
  if (number.find('.') == absl::string_view::npos) {
    uint64_t n;
    if (!absl::SimpleAtoi(number, &n) || n > UINT64_MAX / mult) return false;
    *out = n * mult;
    return true;
  }
  double d;
  if (!absl::SimpleAtod(number, &d)) return false;
  long double v = std::round(static_cast<long double>(d) * mult);
  if (!(v >= 0 && v < 18446744073709551616.0L)) return false;
  *out = static_cast<uint64_t>(v);
  return true;
}

template <typename T>
std::string RangeError(T min, T max, T got) {
  return absl::StrCat("must be in [", min, ", ", max, "], got ", got);
}

}  // namespace

absl::StatusOr<YAML::Node> ParseYaml(std::string_view text) { return ParseNamed(text, "<text>"); }

absl::StatusOr<YAML::Node> LoadYamlFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    int err = errno;
    std::string msg = absl::StrCat("cannot open config file ", path, ": ", std::strerror(err));
    return err == ENOENT ? absl::NotFoundError(msg) : absl::FailedPreconditionError(msg);
  }
  std::stringstream buf;
  buf << in.rdbuf();
  if (in.bad()) return absl::DataLossError(absl::StrCat("cannot read config file ", path));
  return ParseNamed(buf.str(), path);
}

ConfigReader::ConfigReader(const YAML::Node& node, std::string path)
    : node_(node), path_(std::move(path)) {
  if (node_.IsDefined() && !node_.IsNull() && !node_.IsMap()) {
    usable_ = false;
    AddError("", absl::StrCat("expected a map, got ", Describe(node_)));
  }
}

std::string ConfigReader::PathOf(std::string_view key) const {
  if (key.empty()) return path_.empty() ? "<root>" : path_;
  return path_.empty() ? std::string(key) : absl::StrCat(path_, ".", AsAbsl(key));
}

void ConfigReader::AddError(std::string_view key, std::string_view message) {
  errors_.push_back(absl::StrCat(PathOf(key), ": ", AsAbsl(message)));
}

bool ConfigReader::Has(std::string_view key) const {
  if (!usable_ || !node_.IsMap()) return false;
  try {
    for (auto it = node_.begin(); it != node_.end(); ++it) {
      if (it->first.IsScalar() && it->first.Scalar() == key) return !it->second.IsNull();
    }
  } catch (const std::exception&) {
  }
  return false;
}

bool ConfigReader::Lookup(std::string_view key, bool required, YAML::Node* value) {
  if (!usable_) return false;
  if (std::find(known_.begin(), known_.end(), key) == known_.end()) known_.emplace_back(key);
  bool found = false;
  if (node_.IsMap()) {
    for (auto it = node_.begin(); it != node_.end(); ++it) {
      if (it->first.IsScalar() && it->first.Scalar() == key && !it->second.IsNull()) {
        *value = it->second;
        found = true;
        break;
      }
    }
  }
  if (!found && required) AddError(key, "required");
  return found;
}

bool ConfigReader::ScalarOf(std::string_view key, const YAML::Node& value, std::string_view what,
                            std::string* text) {
  if (!value.IsScalar()) {
    AddError(key, absl::StrCat("expected ", AsAbsl(what), ", got ", Describe(value)));
    return false;
  }
  *text = value.Scalar();
  return true;
}

ConfigReader& ConfigReader::Int(std::string_view key, int64_t* out, int64_t min, int64_t max,
                                bool required) {
  Guard(*this, key, [&] {
    YAML::Node v;
    std::string s;
    if (!Lookup(key, required, &v) || !ScalarOf(key, v, "an integer", &s)) return;
    int64_t n;
    if (!ParseInt64(s, &n))
      return AddError(key, absl::StrCat("expected an integer, got '", s, "'"));
    if (n < min || n > max) return AddError(key, RangeError(min, max, n));
    *out = n;
  });
  return *this;
}

ConfigReader& ConfigReader::UInt(std::string_view key, uint64_t* out, uint64_t min, uint64_t max,
                                 bool required) {
  Guard(*this, key, [&] {
    YAML::Node v;
    std::string s;
    if (!Lookup(key, required, &v) || !ScalarOf(key, v, "a non-negative integer", &s)) return;
    uint64_t n;
    int64_t negative;
    if (!ParseUInt64(s, &n)) {
      if (ParseInt64(s, &negative)) {
        return AddError(key, absl::StrCat("must be in [", min, ", ", max, "], got ", negative));
      }
      return AddError(key, absl::StrCat("expected a non-negative integer, got '", s, "'"));
    }
    if (n < min || n > max) return AddError(key, RangeError(min, max, n));
    *out = n;
  });
  return *this;
}

ConfigReader& ConfigReader::Double(std::string_view key, double* out, double min, double max,
                                   bool required) {
  Guard(*this, key, [&] {
    YAML::Node v;
    std::string s;
    if (!Lookup(key, required, &v) || !ScalarOf(key, v, "a number", &s)) return;
    double d;
    if (!ParseDouble(s, &d)) return AddError(key, absl::StrCat("expected a number, got '", s, "'"));
    if (d < min || d > max) return AddError(key, RangeError(min, max, d));
    *out = d;
  });
  return *this;
}

ConfigReader& ConfigReader::Bool(std::string_view key, bool* out, bool required) {
  Guard(*this, key, [&] {
    YAML::Node v;
    std::string s;
    if (!Lookup(key, required, &v) || !ScalarOf(key, v, "a boolean", &s)) return;
    for (absl::string_view t : {"true", "yes", "on"}) {
      if (absl::EqualsIgnoreCase(s, t)) return void(*out = true);
    }
    for (absl::string_view f : {"false", "no", "off"}) {
      if (absl::EqualsIgnoreCase(s, f)) return void(*out = false);
    }
    AddError(key, absl::StrCat("expected a boolean (true/false), got '", s, "'"));
  });
  return *this;
}

ConfigReader& ConfigReader::String(std::string_view key, std::string* out, bool required) {
  Guard(*this, key, [&] {
    YAML::Node v;
    std::string s;
    if (!Lookup(key, required, &v) || !ScalarOf(key, v, "a string", &s)) return;
    *out = std::move(s);
  });
  return *this;
}

ConfigReader& ConfigReader::Enum(std::string_view key, std::string* out,
                                 std::vector<std::string> allowed, bool required) {
  Guard(*this, key, [&] {
    YAML::Node v;
    std::string s;
    if (!Lookup(key, required, &v) || !ScalarOf(key, v, "a string", &s)) return;
    if (std::find(allowed.begin(), allowed.end(), s) == allowed.end()) {
      return AddError(
          key, absl::StrCat("must be one of [", absl::StrJoin(allowed, ", "), "], got '", s, "'"));
    }
    *out = std::move(s);
  });
  return *this;
}

ConfigReader& ConfigReader::Duration(std::string_view key, absl::Duration* out, absl::Duration min,
                                     absl::Duration max, bool required) {
  Guard(*this, key, [&] {
    YAML::Node v;
    std::string s;
    if (!Lookup(key, required, &v) || !ScalarOf(key, v, "a duration", &s)) return;
    absl::Duration d;
    if (!absl::ParseDuration(s, &d)) {
      return AddError(key,
                      absl::StrCat("expected a duration such as '250ms' or '5s', got '", s, "'"));
    }
    if (d < min || d > max) {
      return AddError(key,
                      absl::StrCat("must be in [", absl::FormatDuration(min), ", ",
                                   absl::FormatDuration(max), "], got ", absl::FormatDuration(d)));
    }
    *out = d;
  });
  return *this;
}

ConfigReader& ConfigReader::Bytes(std::string_view key, uint64_t* out, uint64_t min, uint64_t max,
                                  bool required) {
  Guard(*this, key, [&] {
    YAML::Node v;
    std::string s;
    if (!Lookup(key, required, &v) || !ScalarOf(key, v, "a byte size", &s)) return;
    uint64_t n;
    if (!ParseBytes(s, &n)) {
      return AddError(
          key, absl::StrCat("expected a byte size such as 4096, '64MiB' or '1GB', got '", s, "'"));
    }
    if (n < min || n > max) return AddError(key, RangeError(min, max, n));
    *out = n;
  });
  return *this;
}

ConfigReader& ConfigReader::Map(std::string_view key, const std::function<void(ConfigReader&)>& fn,
                                bool required) {
  Guard(*this, key, [&] {
    YAML::Node v;
    if (!Lookup(key, required, &v)) return;
    ConfigReader child(v, PathOf(key));
    Guard(child, "", [&] { fn(child); });
    Merge(child);
  });
  return *this;
}

ConfigReader& ConfigReader::List(std::string_view key,
                                 const std::function<void(ConfigReader&, size_t)>& fn,
                                 bool required) {
  Guard(*this, key, [&] {
    YAML::Node v;
    if (!Lookup(key, required, &v)) return;
    if (!v.IsSequence()) return AddError(key, absl::StrCat("expected a list, got ", Describe(v)));
    for (size_t i = 0; i < v.size(); ++i) {
      ConfigReader child(v[i], absl::StrCat(PathOf(key), "[", i, "]"));
      Guard(child, "", [&] { fn(child, i); });
      Merge(child);
    }
  });
  return *this;
}

ConfigReader& ConfigReader::StringList(std::string_view key, std::vector<std::string>* out,
                                       bool required) {
  Guard(*this, key, [&] {
    YAML::Node v;
    if (!Lookup(key, required, &v)) return;
    if (!v.IsSequence()) {
      return AddError(key, absl::StrCat("expected a list of strings, got ", Describe(v)));
    }
    std::vector<std::string> items(v.size());
    bool ok = true;
    for (size_t i = 0; i < v.size(); ++i) {
      ok &= ScalarOf(absl::StrCat(AsAbsl(key), "[", i, "]"), v[i], "a string", &items[i]);
    }
    if (ok) *out = std::move(items);
  });
  return *this;
}

void ConfigReader::CheckUnknownKeys() {
  if (unknown_checked_ || !usable_ || !node_.IsMap()) return;
  unknown_checked_ = true;
  std::string known = known_.empty() ? "(none)" : absl::StrJoin(known_, ", ");
  Guard(*this, "", [&] {
    for (auto it = node_.begin(); it != node_.end(); ++it) {
      std::string name = it->first.IsScalar() ? it->first.Scalar() : Describe(it->first);
      if (std::find(known_.begin(), known_.end(), name) == known_.end()) {
        AddError(name, absl::StrCat("unknown field; known: ", known));
      }
    }
  });
}

void ConfigReader::Merge(ConfigReader& child) {
  child.CheckUnknownKeys();
  for (std::string& e : child.errors_) errors_.push_back(std::move(e));
  child.errors_.clear();
}

absl::Status ConfigReader::Finish() {
  CheckUnknownKeys();
  if (errors_.empty()) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat("config: ", absl::StrJoin(errors_, "; ")));
}

}  // namespace hlem
