#include "common/config.h"

#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace hlem {
namespace {

std::string Msg(const absl::Status& s) { return std::string(s.message()); }

using ::testing::AllOf;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

YAML::Node Parse(const std::string& text) {
  auto node = ParseYaml(text);
  EXPECT_TRUE(node.ok()) << node.status();
  return node.ok() ? *node : YAML::Node();
}

struct Table {
  std::string name;
  uint64_t rows = 0;
  int64_t dim = 64;
};

struct Shard {
  int64_t port = 0;
  double ratio = 0.5;
  bool pinned = false;
  std::string mode = "gather";
  absl::Duration timeout = absl::Seconds(1);
  uint64_t memory = 0;
  std::vector<Table> tables;
  std::vector<std::string> peers;
};

absl::Status ReadShard(const YAML::Node& root, Shard* s) {
  ConfigReader r(root, "");
  r.Map(
      "shard",
      [&](ConfigReader& shard) {
        shard.Int("port", &s->port, 0, 65535, /*required=*/true)
            .Double("ratio", &s->ratio, 0.0, 1.0)
            .Bool("pinned", &s->pinned)
            .Enum("mode", &s->mode, {"gather", "one_sided"})
            .Duration("timeout", &s->timeout, absl::Milliseconds(1), absl::Seconds(60))
            .Bytes("memory", &s->memory, 1, 1ull << 40)
            .StringList("peers", &s->peers)
            .List("tables", [&](ConfigReader& t, size_t i) {
              s->tables.resize(i + 1);
              t.String("name", &s->tables[i].name, /*required=*/true)
                  .UInt("rows", &s->tables[i].rows, 1, 1ull << 40, /*required=*/true)
                  .Int("dim", &s->tables[i].dim, 1, 4096);
            });
      },
      /*required=*/true);
  return r.Finish();
}

TEST(ConfigReaderTest, ReadsEveryKind) {
  Shard s;
  absl::Status st = ReadShard(Parse(R"(
shard:
  port: 7070
  ratio: 0.25
  pinned: yes
  mode: one_sided
  timeout: 1.5s
  memory: 64MiB
  peers: [a:1, b:2]
  tables:
    - {name: items, rows: 1000}
    - {name: users, rows: 0x10, dim: 128}
)"),
                              &s);
  ASSERT_TRUE(st.ok()) << st;
  EXPECT_EQ(s.port, 7070);
  EXPECT_DOUBLE_EQ(s.ratio, 0.25);
  EXPECT_TRUE(s.pinned);
  EXPECT_EQ(s.mode, "one_sided");
  EXPECT_EQ(s.timeout, absl::Milliseconds(1500));
  EXPECT_EQ(s.memory, 64ull << 20);
  EXPECT_THAT(s.peers, ElementsAre("a:1", "b:2"));
  ASSERT_EQ(s.tables.size(), 2u);
  EXPECT_EQ(s.tables[0].name, "items");
  EXPECT_EQ(s.tables[0].rows, 1000u);
  EXPECT_EQ(s.tables[0].dim, 64);  // default kept
  EXPECT_EQ(s.tables[1].rows, 16u);
  EXPECT_EQ(s.tables[1].dim, 128);
}

TEST(ConfigReaderTest, AbsentOptionalFieldsKeepDefaults) {
  Shard s;
  ASSERT_TRUE(ReadShard(Parse("shard: {port: 1, ratio: ~}"), &s).ok());
  EXPECT_DOUBLE_EQ(s.ratio, 0.5);
  EXPECT_EQ(s.mode, "gather");
  EXPECT_EQ(s.timeout, absl::Seconds(1));
  EXPECT_TRUE(s.tables.empty());
}

TEST(ConfigReaderTest, MissingRequiredFields) {
  Shard s;
  absl::Status st = ReadShard(Parse("other: 1"), &s);
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(Msg(st), HasSubstr("shard: required"));
  EXPECT_THAT(Msg(st), HasSubstr("other: unknown field; known: shard"));

  st = ReadShard(Parse("shard: {tables: [{rows: 5}]}"), &s);
  EXPECT_THAT(Msg(st), AllOf(HasSubstr("shard.port: required"),
                             HasSubstr("shard.tables[0].name: required")));
}

TEST(ConfigReaderTest, ReportsEveryErrorWithPathAndRange) {
  Shard s;
  absl::Status st = ReadShard(Parse(R"(
shard:
  port: abc
  ratio: 1.5
  pinned: maybe
  mode: fast
  timeout: 2m
  memory: lots
  tabels: []
  tables:
    - {name: a, rows: 1}
    - {name: b, rows: 0}
    - {name: c, rows: 1, dim: [1]}
)"),
                              &s);
  ASSERT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(Msg(st), testing::StartsWith("config: "));
  EXPECT_THAT(
      Msg(st),
      AllOf(HasSubstr("shard.port: expected an integer, got 'abc'"),
            HasSubstr("shard.ratio: must be in [0, 1], got 1.5"),
            HasSubstr("shard.pinned: expected a boolean (true/false), got 'maybe'"),
            HasSubstr("shard.mode: must be one of [gather, one_sided], got 'fast'"),
            HasSubstr("shard.timeout: must be in [1ms, 1m], got 2m"),
            HasSubstr("shard.memory: expected a byte size such as 4096, '64MiB' or '1GB', got "
                      "'lots'"),
            HasSubstr("shard.tables[1].rows: must be in [1, 1099511627776], got 0"),
            HasSubstr("shard.tables[2].dim: expected an integer, got a list"),
            HasSubstr("shard.tabels: unknown field; known: port, ratio, pinned, mode, timeout, "
                      "memory, peers, tables")));
  // Invalid values leave the defaults untouched.
  EXPECT_EQ(s.port, 0);
  EXPECT_DOUBLE_EQ(s.ratio, 0.5);
  EXPECT_EQ(s.mode, "gather");
}

TEST(ConfigReaderTest, NestedPathsAndUnknownKeysInLists) {
  YAML::Node root = Parse(R"(
a:
  b:
    - {c: 1}
    - {c: 2}
    - {c: -3, d: 4}
)");
  ConfigReader r(root, "");
  std::vector<int64_t> cs;
  r.Map("a", [&](ConfigReader& a) {
    a.List("b", [&](ConfigReader& item, size_t) {
      int64_t c = 0;
      item.Int("c", &c, 0, 10);
      cs.push_back(c);
    });
  });
  absl::Status st = r.Finish();
  EXPECT_EQ(Msg(st),
            "config: a.b[2].c: must be in [0, 10], got -3; a.b[2].d: unknown field; known: c");
  EXPECT_THAT(cs, ElementsAre(1, 2, 0));
}

TEST(ConfigReaderTest, WrongContainerTypes) {
  ConfigReader r(Parse("m: 5\nl: {x: 1}\ns: [1, [2]]\nitems: [3]"), "root");
  r.Map("m", [](ConfigReader& m) {
     int64_t x;
     m.Int("x", &x, 0, 1, /*required=*/true);  // silent: the map itself is already an error
   }).List("l", [](ConfigReader&, size_t) {});
  std::vector<std::string> s;
  r.StringList("s", &s);
  r.List("items", [](ConfigReader&, size_t) {});
  EXPECT_EQ(Msg(r.Finish()),
            "config: root.m: expected a map, got '5'; root.l: expected a list, got a map; "
            "root.s[1]: expected a string, got a list; root.items[0]: expected a map, got '3'");
  EXPECT_TRUE(s.empty());
}

TEST(ConfigReaderTest, NonMapRootIsAnError) {
  ConfigReader r(Parse("- 1\n- 2"), "");
  int64_t x = 7;
  r.Int("x", &x, 0, 10, /*required=*/true);
  EXPECT_EQ(Msg(r.Finish()), "config: <root>: expected a map, got a list");
  EXPECT_EQ(x, 7);
}

TEST(ConfigReaderTest, EmptyDocumentIsAnEmptyMap) {
  ConfigReader r(Parse(""), "");
  int64_t x = 7;
  r.Int("x", &x, 0, 10);
  EXPECT_TRUE(r.Finish().ok());
  EXPECT_EQ(x, 7);
}

TEST(ConfigReaderTest, Durations) {
  struct Case {
    std::string text;
    absl::Duration want;
  };
  for (const Case& c : std::vector<Case>{{"5s", absl::Seconds(5)},
                                         {"250ms", absl::Milliseconds(250)},
                                         {"1.5s", absl::Milliseconds(1500)},
                                         {"1m30s", absl::Seconds(90)},
                                         {"0", absl::ZeroDuration()}}) {
    absl::Duration d = absl::Hours(1);
    ConfigReader r(Parse("d: " + c.text), "");
    r.Duration("d", &d, absl::ZeroDuration(), absl::Minutes(10));
    EXPECT_TRUE(r.Finish().ok()) << c.text;
    EXPECT_EQ(d, c.want) << c.text;
  }
  absl::Duration d;
  ConfigReader r(Parse("d: 5"), "x");
  r.Duration("d", &d, absl::ZeroDuration(), absl::Minutes(10));
  EXPECT_THAT(Msg(r.Finish()),
              HasSubstr("x.d: expected a duration such as '250ms' or '5s', got '5'"));
}

TEST(ConfigReaderTest, ByteSizes) {
  struct Case {
    std::string text;
    uint64_t want;
  };
  for (const Case& c : std::vector<Case>{{"4096", 4096},
                                         {"512KiB", 512ull << 10},
                                         {"64MiB", 64ull << 20},
                                         {"2GiB", 2ull << 30},
                                         {"1GB", 1000000000},
                                         {"1.5GiB", 3ull << 29},
                                         {"16 B", 16},
                                         {"1TiB", 1ull << 40}}) {
    uint64_t n = 0;
    ConfigReader r(Parse("n: " + c.text), "");
    r.Bytes("n", &n, 0, UINT64_MAX);
    EXPECT_TRUE(r.Finish().ok()) << c.text;
    EXPECT_EQ(n, c.want) << c.text;
  }
  for (const std::string bad : {"-1", "12XB", "MiB", "99999999999TiB", "1.2.3KiB"}) {
    uint64_t n = 5;
    ConfigReader r(Parse("n: '" + bad + "'"), "");
    r.Bytes("n", &n, 0, UINT64_MAX);
    EXPECT_THAT(Msg(r.Finish()), HasSubstr("n: expected a byte size")) << bad;
    EXPECT_EQ(n, 5u) << bad;
  }
  uint64_t n = 0;
  ConfigReader r(Parse("n: 2GiB"), "pool");
  r.Bytes("n", &n, 1, 1ull << 30);
  EXPECT_THAT(Msg(r.Finish()), HasSubstr("pool.n: must be in [1, 1073741824], got 2147483648"));
}

TEST(ConfigReaderTest, IntegerEdgeCases) {
  int64_t i = 0;
  uint64_t u = 0;
  ConfigReader r(Parse("i: 9223372036854775808\nu: -5\nv: 1.5"), "");
  r.Int("i", &i, INT64_MIN, INT64_MAX).UInt("u", &u, 0, 10).UInt("v", &u, 0, 10);
  EXPECT_EQ(Msg(r.Finish()),
            "config: i: expected an integer, got '9223372036854775808'; u: must be in [0, 10], "
            "got -5; v: expected a non-negative integer, got '1.5'");
}

TEST(ConfigReaderTest, AddErrorAndHas) {
  ConfigReader r(Parse("lo: 5\nhi: 3\nnothing: ~"), "range");
  int64_t lo = 0, hi = 0;
  r.Int("lo", &lo, 0, 10).Int("hi", &hi, 0, 10);
  EXPECT_TRUE(r.Has("lo"));
  EXPECT_FALSE(r.Has("nothing"));
  EXPECT_FALSE(r.Has("missing"));
  if (lo > hi) r.AddError("hi", "must be >= range.lo");
  r.Map("nothing", [](ConfigReader&) { FAIL() << "absent map visited"; });
  EXPECT_EQ(Msg(r.Finish()), "config: range.hi: must be >= range.lo");
}

TEST(ConfigReaderTest, CallbackExceptionsBecomeErrors) {
  ConfigReader r(Parse("m: {x: abc}"), "");
  r.Map("m", [](ConfigReader& m) {
    (void)m.node()["x"].as<int>();  // throws YAML::TypedBadConversion
  });
  absl::Status st = r.Finish();
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(Msg(st), HasSubstr("m: invalid value:"));
}

TEST(ParseYamlTest, MalformedYamlNamesLineAndColumn) {
  auto node = ParseYaml("a: 1\nb: [1, 2\nc: 3\n");
  ASSERT_FALSE(node.ok());
  EXPECT_EQ(node.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(Msg(node.status()), testing::MatchesRegex("<text>:[34]:[0-9]+: .*"));
}

TEST(LoadYamlFileTest, MissingFileIsNotFound) {
  auto node = LoadYamlFile("/nonexistent/hlem.yaml");
  EXPECT_EQ(node.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(Msg(node.status()), HasSubstr("/nonexistent/hlem.yaml"));
}

TEST(LoadYamlFileTest, ParseErrorNamesFileAndLine) {
  std::string path = testing::TempDir() + "/config_test_bad.yaml";
  std::ofstream(path) << "ok: 1\nbad: a: b\n";
  auto node = LoadYamlFile(path);
  ASSERT_FALSE(node.ok());
  EXPECT_EQ(node.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(Msg(node.status()), HasSubstr(path + ":2:"));
  std::remove(path.c_str());
}

TEST(LoadYamlFileTest, LoadsAFile) {
  std::string path = testing::TempDir() + "/config_test_good.yaml";
  std::ofstream(path) << "shard:\n  port: 9\n";
  auto node = LoadYamlFile(path);
  ASSERT_TRUE(node.ok()) << node.status();
  Shard s;
  EXPECT_TRUE(ReadShard(*node, &s).ok());
  EXPECT_EQ(s.port, 9);
  std::remove(path.c_str());
}

}  // namespace
}  // namespace hlem
