#include "TestGraphs.h"

#include "compiler/Partition/Error.h"
#include "compiler/Partition/PlanJson.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <filesystem>
#include <fstream>
#include <sstream>

using namespace pipec::partition;
using namespace pipec::partition::testing;

namespace {
struct Fixture {
  CostTable table = uniformChain(8, 1.0, 1000, 100000000);
  Topology topology = makeGpusTopology({2, 4}, *findDevicePreset("A100"), 1e12, 1e8);
  PartitionResult result;
  Fixture() {
    PartitionOptions o;
    o.microbatches = 8;
    result = partition(table, topology, o);
  }
};
} // namespace

TEST(PlanJson, PlanHasTopologyStagesPredictionsAndAScheduleSlot) {
  Fixture f;
  nlohmann::json plan = planToJson(f.table, f.topology, f.result);
  EXPECT_EQ(plan["format"], "pipec-plan");
  EXPECT_EQ(plan["topology"]["devices"], 8);
  EXPECT_EQ(plan["topology"]["levels"][1]["bandwidth_GBps"], 0.1);
  EXPECT_TRUE(plan["schedule"].is_object());
  EXPECT_TRUE(plan["schedule"].empty());
  ASSERT_EQ(plan["stages"].size(), f.result.stages.size());
  const nlohmann::json &s0 = plan["stages"][0];
  EXPECT_EQ(s0["first_op"], "op0");
  EXPECT_EQ(s0["ranks"].get<std::vector<int>>(), f.result.stages[0].ranks);
  EXPECT_EQ(plan["predictions"]["time_per_minibatch_s"], f.result.timePerMinibatch);
  EXPECT_EQ(plan["partition"]["microbatches"], 8);
  EXPECT_EQ(plan["partition"]["memory_limit_bytes"], int64_t(80) << 30);
}

TEST(PlanJson, StagesReadBackGiveTheSamePredictions) {
  Fixture f;
  std::stringstream text(planToJson(f.table, f.topology, f.result).dump());
  std::vector<StageSpec> specs = readStageSpecs(text, "plan.json", f.table);
  PartitionOptions o;
  o.microbatches = 8;
  PartitionResult again = evaluatePartition(f.table, f.topology, o, specs);
  EXPECT_DOUBLE_EQ(again.timePerMinibatch, f.result.timePerMinibatch);
  EXPECT_EQ(again.stages.size(), f.result.stages.size());
}

TEST(PlanJson, WritesPlanFile) {
  Fixture f;
  std::string dir = (std::filesystem::temp_directory_path() / "pipec_plan_json_test").string();
  std::filesystem::remove_all(dir);
  writePlanFile(planToJson(f.table, f.topology, f.result), dir + "/out");
  std::ifstream in(dir + "/out/plan.json");
  nlohmann::json back = nlohmann::json::parse(in);
  EXPECT_EQ(back["stages"].size(), f.result.stages.size());
  std::filesystem::remove_all(dir);
}

TEST(PlanJson, BadPartitionFiles) {
  CostTable t = uniformChain(4, 1, 1, 1);
  auto err = [&](const std::string &text) {
    std::istringstream in(text);
    try {
      readStageSpecs(in, "p.json", t);
    } catch (const Error &e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_EQ(err("{").rfind("p.json: malformed JSON", 0), 0u);
  EXPECT_EQ(err("{\"stages\": []}"), "p.json: expected an object with a non-empty \"stages\" array");
  EXPECT_EQ(err(R"({"stages": [{"first_op": "op0", "last_op": "nope"}]})"), "p.json: stages[0]: unknown op 'nope'");
  EXPECT_EQ(err(R"({"stages": [{"last_op": "op1"}]})"), "p.json: stages[0]: missing \"first_op\" (or \"first_op_index\")");
  EXPECT_EQ(err(R"({"stages": [{"first_op_index": 0, "last_op_index": 9}]})"),
            "p.json: stages[0]: \"last_op_index\" must be an op index below 4");
  EXPECT_EQ(err(R"({"stages": [{"first_op": "op0", "first_op_index": 1, "last_op": "op3"}]})"),
            "p.json: stages[0]: \"first_op\" and \"first_op_index\" disagree");
  EXPECT_EQ(err(R"({"stages": [{"first_op": "op0", "last_op": "op3", "replicas": 0}]})"),
            "p.json: stages[0]: \"replicas\" must be a positive integer");
  std::istringstream ok(R"({"stages": [{"first_op": "op0", "last_op_index": 1, "ranks": [3, 2]},
                                       {"first_op_index": 2, "last_op": "op3"}]})");
  std::vector<StageSpec> specs = readStageSpecs(ok, "p.json", t);
  ASSERT_EQ(specs.size(), 2u);
  EXPECT_EQ(specs[0].replicas, 2);
  EXPECT_EQ(specs[1].replicas, 1);
  EXPECT_EQ(specs[1].lastOp, 3);
}

TEST(PlanJson, TablePrintsStagesAndPredictions) {
  Fixture f;
  std::ostringstream os;
  printPlanTable(os, f.table, f.topology, f.result);
  std::string text = os.str();
  for (const char *needle : {"stage", "op0 .. ", "time per mini-batch", "throughput", "pipeline bubble",
                             "speedup over pure data parallelism on 8 devices"})
    EXPECT_NE(text.find(needle), std::string::npos) << needle << "\n" << text;
  // one row per stage
  size_t rows = 0;
  for (size_t k = 0; k < f.result.stages.size(); ++k)
    rows += text.find("\n" + std::to_string(k) + " ") != std::string::npos;
  EXPECT_EQ(rows, f.result.stages.size());
}
