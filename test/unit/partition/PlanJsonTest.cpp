// plan.json, the table, and `pipec partition` end to end (one file: nlohmann/json
// is slow to compile, so it is included by as few test files as possible).

#include "TestGraphs.h"

#include "analysis/Partition/Error.h"
#include "analysis/Partition/PartitionCommand.h"
#include "analysis/Partition/PlanJson.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <cstdio>
#include <unistd.h>
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

TEST(PlanJson, PlanHasPipelineTopologyStagesAndPredictions) {
  Fixture f;
  nlohmann::json plan = planToJson(f.table, f.topology, f.result);
  EXPECT_EQ(plan["format"], "pipec-plan");
  EXPECT_EQ(plan["version"], 2);
  EXPECT_EQ(plan["topology"]["devices"], 8);
  EXPECT_EQ(plan["topology"]["levels"][1]["bandwidth_GBps"], 0.1);
  // Partition-only (pipec partition --out): no schedule, planner or runtime.
  EXPECT_FALSE(plan.contains("schedule"));
  EXPECT_FALSE(plan.contains("runtime"));
  ASSERT_EQ(plan["stages"].size(), f.result.stages.size());
  const nlohmann::json &s0 = plan["stages"][0];
  EXPECT_EQ(s0["first_op"], "op0");
  EXPECT_EQ(s0["ranks"].get<std::vector<int>>(), f.result.stages[0].ranks);
  EXPECT_EQ(plan["predictions"]["time_per_minibatch_s"], f.result.timePerMinibatch);
  // Each fact once: the micro-batch count and asynchronous flag in "pipeline" only.
  EXPECT_EQ(plan["pipeline"]["microbatches"], 8);
  EXPECT_EQ(plan["pipeline"]["asynchronous"], false);
  EXPECT_FALSE(plan["partition"].contains("microbatches"));
  EXPECT_FALSE(plan["partition"].contains("asynchronous"));
  // An 80 GiB GPU less the CUDA runtime's share (docs/partition.md).
  EXPECT_EQ(plan["partition"]["memory_limit_bytes"], (int64_t(80) << 30) - kGpuRuntimeBytes);
}

TEST(PlanJson, StagesReadBackGiveTheSamePredictions) {
  Fixture f;
  std::stringstream text(planToJson(f.table, f.topology, f.result).dump());
  std::vector<StageSpec> specs = readStageSpecs(text, "plan.json", f.table).stages;
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
            "p.json: stages[0]: \"replicas\" must be a positive integer at most 65536");
  std::istringstream ok(R"({"stages": [{"first_op": "op0", "last_op_index": 1, "ranks": [3, 2]},
                                       {"first_op_index": 2, "last_op": "op3"}]})");
  std::vector<StageSpec> specs = readStageSpecs(ok, "p.json", t).stages;
  ASSERT_EQ(specs.size(), 2u);
  EXPECT_EQ(specs[0].replicas, 2);
  EXPECT_EQ(specs[1].replicas, 1);
  EXPECT_EQ(specs[1].lastOp, 3);
}

TEST(PlanJson, OpOrderOfAnAntichainCutRoundTrips) {
  // A diamond a -> {b, c} -> d: stages {a, c} and {b, d} are contiguous only in
  // the order a, c, b, d, which the plan writes as "op_order".
  CostTable t = uniformChain(4, 1, 1000, 10);
  t.ops[2].producers = {"op0"};
  t.ops[3].producers = {"op1", "op2"};
  Topology topo = flatTopology(2, 1e9);
  PartitionOptions o;
  o.memoryLimitBytes = -1;
  PartitionResult r = evaluatePartition(t, topo, o, {{0, 1, 1, {}}, {2, 3, 1, {}}}, {0, 2, 1, 3});
  EXPECT_EQ(r.opOrder, (std::vector<int>{0, 2, 1, 3}));
  EXPECT_NO_THROW(r.verify(t, topo));
  nlohmann::json plan = planToJson(t, topo, r);
  EXPECT_EQ(plan["op_order"], (nlohmann::json{"op0", "op2", "op1", "op3"}));
  EXPECT_EQ(plan["stages"][0]["last_op"], "op2");
  EXPECT_EQ(plan["stages"][1]["first_op"], "op1");
  std::istringstream in(plan.dump());
  StageSpecs back = readStageSpecs(in, "plan.json", t);
  EXPECT_EQ(back.opOrder, r.opOrder);
  PartitionResult again = evaluatePartition(t, topo, o, back.stages, back.opOrder);
  EXPECT_DOUBLE_EQ(again.timePerMicrobatch, r.timePerMicrobatch);
  // The cut after {a, c} carries a's output (read by b) and c's (read by d).
  EXPECT_EQ(r.stages[0].sendBytes, 2000);
  // An order that puts an op before its producer is refused, naming both.
  std::istringstream bad(R"({"op_order": ["op0", "op3", "op1", "op2"], "stages": [{"first_op": "op0", "last_op": "op2"}]})");
  try {
    readStageSpecs(bad, "p.json", t);
    ADD_FAILURE() << "no error";
  } catch (const Error &e) {
    EXPECT_EQ(std::string(e.what()), "p.json: \"op_order\": op 'op3' reads 'op1', which comes later (the ops are not in a "
                                     "topological order)");
  }
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

//===- pipec partition ----------------------------------------------------===//

namespace {

/// Runs `pipec partition ARGS` capturing stdout and stderr.
struct CmdRun {
  int rc;
  std::string out, err;
};
/// As pipec's command line runs it (tools/pipec/PartitionOptions.cpp): the
/// flags through the settings' declarations (applyPartitionTokens; a bad
/// value: exit 2), --costs into costsFile, then runPartitionCommand. Parsing
/// the command line with llvm::cl is tested by test/driver/cli.test.
CmdRun run(std::vector<std::string> args) {
  PartitionCliOptions o;
  std::vector<std::string> flags;
  for (size_t i = 0; i < args.size(); ++i) {
    if (args[i] == "--costs" && i + 1 < args.size())
      o.costsFile = args[++i];
    else if (args[i].rfind("--costs=", 0) == 0)
      o.costsFile = args[i].substr(8);
    else
      flags.push_back(args[i]);
  }
  std::ostringstream out, err;
  try {
    applyPartitionTokens(o, flags);
  } catch (const Error &e) {
    return {2, "", std::string("pipec partition: error: ") + e.what() + "\n"};
  }
  int rc = runPartitionCommand(o, out, err);
  return {rc, out.str(), err.str()};
}

struct TempDir {
  std::filesystem::path path;
  TempDir() {
    path = std::filesystem::temp_directory_path() / ("pipec_cmd_test_" + std::to_string(::getpid()));
    std::filesystem::create_directories(path);
  }
  ~TempDir() { std::filesystem::remove_all(path); }
  std::string write(const std::string &name, const std::string &text) {
    std::ofstream((path / name).string()) << text;
    return (path / name).string();
  }
};

std::string costsCsv() {
  std::ostringstream os;
  writeCostTableCsv(os, uniformChain(12, 0.01, 4000000, 200000000));
  return os.str();
}

} // namespace

TEST(PartitionCommand, PrintsTableAndWritesPlan) {
  TempDir d;
  std::string costs = d.write("costs.csv", costsCsv());
  CmdRun r = run({"--costs", costs, "--gpus", "2x4", "--device", "A100", "--microbatches", "4",
               "--out", (d.path / "out").string()});
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_NE(r.out.find("time per mini-batch"), std::string::npos) << r.out;
  ASSERT_TRUE(std::filesystem::exists(d.path / "out" / "plan.json"));
  // --partition with the written plan reproduces the predictions
  CmdRun again = run({"--costs", costs, "--gpus", "2x4", "--device", "A100", "--microbatches", "4",
                   "--partition", (d.path / "out" / "plan.json").string(), "--json"});
  ASSERT_EQ(again.rc, 0) << again.err;
  nlohmann::json summary = nlohmann::json::parse(again.out);
  std::ifstream planFile(d.path / "out" / "plan.json");
  nlohmann::json plan = nlohmann::json::parse(planFile);
  EXPECT_EQ(summary["partition"]["source"], "given");
  EXPECT_DOUBLE_EQ(summary["time_per_minibatch_s"].get<double>(),
                   plan["predictions"]["time_per_minibatch_s"].get<double>());
}

TEST(PartitionCommand, ClusterFileAndFlags) {
  TempDir d;
  std::string costs = d.write("costs.csv", costsCsv());
  std::string cluster = d.write("c.json", R"({"device": "V100", "levels": [
      {"name": "nvlink", "fanout": 2, "bandwidth_GBps": 150},
      {"name": "rack", "fanout": 2, "bandwidth_GBps": 10},
      {"name": "spine", "fanout": 2, "bandwidth_GBps": 5}]})");
  CmdRun r = run({"--costs=" + costs, "--cluster", cluster, "--stages=3", "--no-replication", "--async",
               "--recompute", "--memory-limit", "16GiB", "--json"});
  ASSERT_EQ(r.rc, 0) << r.err;
  nlohmann::json s = nlohmann::json::parse(r.out);
  EXPECT_EQ(s["stages"].size(), 3u);
  EXPECT_EQ(s["partition"]["asynchronous"], true);
  EXPECT_EQ(s["partition"]["memory_limit_bytes"], int64_t(16) << 30);
}

TEST(PartitionCommand, BadInputsFailWithAMessage) {
  TempDir d;
  std::string costs = d.write("costs.csv", costsCsv());
  // rc 2: a flag's value is malformed or out of range (a usage error);
  // rc 1: the files, or the flags together, are bad input (docs/errors.md).
  struct Case {
    std::vector<std::string> args;
    std::string message;
    int rc;
  } cases[] = {
      {{"--costs", costs, "--gpus", "0x8"}, "--gpus '0x8'", 2},
      {{"--costs", costs, "--gpus", "2x"}, "--gpus '2x'", 2},
      {{"--costs", costs, "--gpus", "2x8", "--device", "Z80"}, "--device: unknown device 'Z80'", 2},
      {{"--costs", costs}, "missing --gpus NxG or --cluster FILE", 1},
      {{"--costs", costs, "--gpus", "2x8", "--cluster", costs}, "not both", 1},
      {{"--costs", costs, "--cluster", d.write("bad.json", "{levels")}, "malformed JSON", 1},
      {{"--costs", costs, "--gpus", "1x2", "--memory-limit", "100MB"}, "more than the limit", 1},
      {{"--costs", costs, "--gpus", "1x2", "--memory-limit", "lots"}, "--memory-limit 'lots'", 2},
      {{"--costs", costs, "--gpus", "1x2", "--inter-bw", "-5"}, "--inter-bw '-5'", 2},
      {{"--costs", costs, "--gpus", "1x2", "--stages", "0"}, "--stages 0: must be between 1 and 65536", 2},
      {{"--costs", d.write("bad.csv", "name,type\n"), "--gpus", "1x2"}, "missing column 'fwd_s'", 1},
      {{"--costs", "/nonexistent.csv", "--gpus", "1x2"}, "cannot open cost table", 1},
      {{"--costs", costs, "--gpus", "1x2", "--partition", d.write("p.json", "{}")}, "non-empty \"stages\"", 1},
  };
  for (const Case &c : cases) {
    CmdRun r = run(c.args);
    EXPECT_EQ(r.rc, c.rc) << c.message;
    EXPECT_NE(r.err.find(c.message), std::string::npos) << "expected '" << c.message << "' in: " << r.err;
    EXPECT_EQ(r.err.rfind("pipec partition: error: ", 0), 0u) << r.err;
  }
  CmdRun usage = run({"--gpus", "2x8"});
  EXPECT_EQ(usage.rc, 2);
  EXPECT_NE(usage.err.find("missing --costs"), std::string::npos);
  PartitionCliOptions o;
  EXPECT_THROW(applyPartitionFlag(o, "--frobnicate", "1"), Error);
}

TEST(PartitionCommand, FlagValuesFillTheOptions) {
  // The command line itself is llvm::cl's (test/driver/cli.test); each value
  // goes through applyPartitionFlag, shared with the pipec-partition pass.
  PartitionCliOptions o;
  applyPartitionFlag(o, "--gpus", "4x4");
  applyPartitionFlag(o, "--memory-limit", "8GiB");
  applyPartitionFlag(o, "--json", "");
  applyPartitionFlag(o, "--recompute", "");
  EXPECT_EQ(o.gpus, "4x4");
  EXPECT_EQ(o.options.memoryLimitBytes, int64_t(8) << 30);
  EXPECT_TRUE(o.json);
  EXPECT_EQ(o.recomputeMode, pipec::RecomputeMode::All);
  EXPECT_EQ(o.topology().totalDevices(), 16);
  EXPECT_THROW(applyPartitionFlag(o, "--gpus", "4x"), Error);
  EXPECT_THROW(applyPartitionFlag(o, "--recompute", "sometimes"), Error);
}
