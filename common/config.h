#pragma once
// YAML configuration into typed structs. Each service reads its file with LoadYamlFile() and walks
// it with a ConfigReader that checks types and ranges and collects every error, so one start-up
// reports all problems at once, each naming the field path and the allowed range:
//
//   ShardConfig cfg;
//   ConfigReader r(root, "shard");
//   r.UInt("rows", &cfg.rows, 1, 1ull << 40, /*required=*/true)
//    .Duration("timeout", &cfg.timeout, absl::Milliseconds(1), absl::Seconds(60))
//    .List("tables", [&](ConfigReader& t, size_t i) { ... });
//   RETURN_IF_ERROR(r.Finish());
//
// Fields that are absent (or null) keep the value already in *out: defaults live in the struct.
// Keys present in the YAML but never read are reported as unknown. yaml-cpp exceptions never leave
// this file. A ConfigReader is a single-use, single-threaded object.

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "yaml-cpp/yaml.h"

namespace hlem {

// NOT_FOUND when the file does not exist, INVALID_ARGUMENT "path:line:col: ..." on a parse error.
absl::StatusOr<YAML::Node> LoadYamlFile(const std::string& path);
// INVALID_ARGUMENT "<text>:line:col: ..." on a parse error.
absl::StatusOr<YAML::Node> ParseYaml(std::string_view text);

class ConfigReader {
 public:
  // `path` is the dotted path of `node` ("" for the root). A node that is neither a map nor
  // null/undefined is an error; reads from such a reader then do nothing.
  ConfigReader(const YAML::Node& node, std::string path);

  ConfigReader& Int(std::string_view key, int64_t* out, int64_t min, int64_t max,
                    bool required = false);
  ConfigReader& UInt(std::string_view key, uint64_t* out, uint64_t min, uint64_t max,
                     bool required = false);
  ConfigReader& Double(std::string_view key, double* out, double min, double max,
                       bool required = false);
  ConfigReader& Bool(std::string_view key, bool* out, bool required = false);
  ConfigReader& String(std::string_view key, std::string* out, bool required = false);
  ConfigReader& Enum(std::string_view key, std::string* out, std::vector<std::string> allowed,
                     bool required = false);
  // "5s", "250ms", "1.5s", "1m30s" (absl::ParseDuration); "0" is zero.
  ConfigReader& Duration(std::string_view key, absl::Duration* out, absl::Duration min,
                         absl::Duration max, bool required = false);
  // An integer, or a number with a unit: B, KiB, MiB, GiB, TiB (powers of 1024) or KB, MB, GB,
  // TB (powers of 1000), e.g. "64MiB", "1.5GiB", "1GB".
  ConfigReader& Bytes(std::string_view key, uint64_t* out, uint64_t min, uint64_t max,
                      bool required = false);
  // Nested map at "<path>.<key>"; fn is not called when the key is absent. Errors of the nested
  // reader (including its unknown keys) flow into this one.
  ConfigReader& Map(std::string_view key, const std::function<void(ConfigReader&)>& fn,
                    bool required = false);
  // Sequence of maps; fn(item, i) gets a reader at "<path>.<key>[i]".
  ConfigReader& List(std::string_view key, const std::function<void(ConfigReader&, size_t)>& fn,
                     bool required = false);
  // Sequence of scalars.
  ConfigReader& StringList(std::string_view key, std::vector<std::string>* out,
                           bool required = false);

  // Records "<path>.<key>: <message>" (or "<path>: <message>" for an empty key), e.g. for
  // cross-field checks.
  void AddError(std::string_view key, std::string_view message);
  const YAML::Node& node() const { return node_; }
  // True when the key is present with a non-null value. Does not mark the key as known.
  bool Has(std::string_view key) const;
  // OK, or INVALID_ARGUMENT "config: <err1>; <err2>; ..." including unknown keys.
  absl::Status Finish();
  const std::vector<std::string>& errors() const { return errors_; }

 private:
  // Marks `key` known and returns its node if present and non-null; otherwise records "required"
  // when asked and returns false.
  bool Lookup(std::string_view key, bool required, YAML::Node* value);
  // Scalar text of `value`, or records "expected <what>, got <kind>" and returns false.
  bool ScalarOf(std::string_view key, const YAML::Node& value, std::string_view what,
                std::string* text);
  std::string PathOf(std::string_view key) const;
  void CheckUnknownKeys();
  void Merge(ConfigReader& child);

  YAML::Node node_;
  std::string path_;
  bool usable_ = true;  // node_ is a map (or null); false after a type error on the node itself
  bool unknown_checked_ = false;
  std::vector<std::string> known_;  // keys read, in first-read order
  std::vector<std::string> errors_;
};

}  // namespace hlem
