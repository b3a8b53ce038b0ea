#include "common/feature_ids.h"

#include <string>
#include <vector>

#include "common/feature_ids_proto.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "hlem/v1/serving_node.pb.h"

namespace hlem {
namespace {

using ::testing::HasSubstr;

struct Table {
  uint32_t table_id;
  uint64_t rows;
};

TEST(FeatureIdsTest, RowsNameTheFirstIdAtOrBeyondItsTable) {
  const std::vector<Table> tables = {{3, 10}, {7, 100}};
  const std::span<const Table> t = tables;
  EXPECT_TRUE(CheckIdRows(std::vector<uint64_t>{9, 99, 0, 0}, t, "history").ok());
  const absl::Status st = CheckIdRows(std::vector<uint64_t>{9, 99, 5, 100, 10, 0}, t, "history");
  EXPECT_EQ(st.code(), absl::StatusCode::kOutOfRange);
  EXPECT_EQ(st.message(), "history[1].feature_ids[1]: id 100 >= table 7's 100 rows");
  EXPECT_TRUE(CheckIdRows(std::vector<uint64_t>{}, t, "candidates").ok());
}

TEST(FeatureIdsTest, EntriesCarryOneIdPerTableOrTheItemIdWithOneTable) {
  google::protobuf::RepeatedPtrField<v1::Event> events;
  v1::Event* e = events.Add();
  e->set_item_id(42);
  std::vector<uint64_t> ids;
  ASSERT_TRUE(AppendFeatureIds(events, 1, "history", &ids).ok());
  EXPECT_EQ(ids, std::vector<uint64_t>{42});  // one table: the item id stands for the feature

  const std::vector<Table> one = {{0, 42}};
  absl::Status st = CheckFeatureIdRows(events, std::span<const Table>(one), "history");
  EXPECT_EQ(st.code(), absl::StatusCode::kOutOfRange) << st;
  EXPECT_THAT(std::string(st.message()), HasSubstr("history[0].feature_ids[0]: id 42"));

  // Two tables: two ids each; the item id does not stand in.
  google::protobuf::RepeatedPtrField<v1::Candidate> candidates;
  v1::Candidate* c = candidates.Add();
  c->add_feature_ids(1);
  c->add_feature_ids(2);
  candidates.Add()->set_item_id(5);
  st = AppendFeatureIds(candidates, 2, "candidates", nullptr);
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(st.message()), HasSubstr("candidates[1].feature_ids: 0 ids"));
  candidates.Mutable(1)->add_feature_ids(3);
  candidates.Mutable(1)->add_feature_ids(4);
  ids.clear();
  ASSERT_TRUE(AppendFeatureIds(candidates, 2, "candidates", &ids).ok());
  EXPECT_EQ(ids, (std::vector<uint64_t>{1, 2, 3, 4}));
  const std::vector<Table> two = {{0, 10}, {1, 4}};
  st = CheckFeatureIdRows(candidates, std::span<const Table>(two), "candidates");
  EXPECT_EQ(st.message(), "candidates[1].feature_ids[1]: id 4 >= table 1's 4 rows");
}

}  // namespace
}  // namespace hlem
