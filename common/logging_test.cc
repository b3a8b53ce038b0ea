#include "common/logging.h"

#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace hlem {
namespace {

std::string Msg(const absl::Status& s) { return std::string(s.message()); }

using ::testing::HasSubstr;
using ::testing::MatchesRegex;

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

TEST(LoggingTest, InvalidLevelIsRejectedByName) {
  absl::Status st = InitLogging({.level = "verbose"});
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(Msg(st), HasSubstr("'verbose'"));
}

TEST(LoggingTest, UnwritableFileIsRejected) {
  // spdlog creates missing directories, so make the parent a regular file.
  std::string parent = testing::TempDir() + "/logging_test_not_a_dir";
  std::ofstream(parent) << "x";
  std::string path = parent + "/hlem.log";
  absl::Status st = InitLogging({.file = path});
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(Msg(st), HasSubstr(path));
  std::remove(parent.c_str());
}

TEST(LoggingTest, OneLoggerPerComponentEvenAcrossThreads) {
  std::vector<std::shared_ptr<spdlog::logger>> got(8);
  std::vector<std::thread> threads;
  for (int i = 0; i < 8; ++i) {
    threads.emplace_back([&got, i] { got[i] = GetLogger("logging_test_shared"); });
  }
  for (auto& t : threads) t.join();
  for (const auto& l : got) EXPECT_EQ(l.get(), got[0].get());
  EXPECT_EQ(got[0]->name(), "logging_test_shared");
  EXPECT_NE(GetLogger("logging_test_other").get(), got[0].get());
}

TEST(LoggingTest, TextAndJsonFilesWithLevelFiltering) {
  std::string path = testing::TempDir() + "/logging_test.log";
  std::remove(path.c_str());
  auto early = GetLogger("router");  // created before InitLogging: must follow the new sinks
  ASSERT_TRUE(InitLogging({.level = "warn", .file = path}).ok());
  early->info("hidden_event x=1");
  early->warn("queue_full depth={}", 3);
  ASSERT_TRUE(InitLogging({.level = "debug", .file = path, .json = true}).ok());
  GetLogger("shard")->debug("say \"hi\"\tnow");
  spdlog::info("default_logger_event");
  GetLogger("shard")->flush();
  spdlog::default_logger()->flush();
  std::string text = ReadFile(path);
  EXPECT_THAT(text, ::testing::Not(HasSubstr("hidden_event")));
  std::vector<std::string> lines;
  std::stringstream s(text);
  for (std::string line; std::getline(s, line);) lines.push_back(line);
  ASSERT_EQ(lines.size(), 3u) << text;
  EXPECT_THAT(lines[0], MatchesRegex("[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9:.]+ W router "
                                     "queue_full depth=3"));
  EXPECT_THAT(lines[1], MatchesRegex(R"(\{"ts":"[0-9T:.-]+","level":"debug","logger":"shard",)"
                                     R"("msg":"say \\"hi\\"\\tnow"\})"));
  EXPECT_THAT(lines[2], HasSubstr(R"("logger":"hlem","msg":"default_logger_event")"));
  ASSERT_TRUE(InitLogging({}).ok());
  std::remove(path.c_str());
}

TEST(LogRateLimiterTest, OnePerPeriodAndCountsTheRest) {
  SimClock clock;
  LogRateLimiter limiter(clock, absl::Seconds(10));
  EXPECT_TRUE(limiter.Allow());
  EXPECT_EQ(limiter.suppressed(), 0u);
  for (int i = 0; i < 5; ++i) EXPECT_FALSE(limiter.Allow());
  clock.AdvanceBy(absl::Seconds(9));
  EXPECT_FALSE(limiter.Allow());
  clock.AdvanceBy(absl::Seconds(1));
  EXPECT_TRUE(limiter.Allow());
  EXPECT_EQ(limiter.suppressed(), 6u);
  clock.AdvanceBy(absl::Seconds(10));
  EXPECT_TRUE(limiter.Allow());
  EXPECT_EQ(limiter.suppressed(), 0u);
}

}  // namespace
}  // namespace hlem
