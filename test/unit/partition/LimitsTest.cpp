// Bounds on the partitioner's inputs (docs/security.md): topology sizes, cost
// values, JSON nesting, files that are not regular files, option values, and a
// search too large to finish is refused up front instead of hanging.
#include "TestGraphs.h"

#include "analysis/Partition/CostTable.h"
#include "analysis/Partition/Error.h"
#include "analysis/Partition/InputFiles.h"
#include "analysis/Partition/PartitionCommand.h"
#include "analysis/Partition/Partitioner.h"
#include "analysis/Partition/PlanJson.h"
#include "analysis/Partition/Topology.h"

#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <sstream>

#include <sys/stat.h>
#include <unistd.h>

using namespace pipec::partition;
using namespace pipec::partition::testing;

namespace {
std::string errorOf(const std::function<void()> &f) {
  try {
    f();
  } catch (const Error &e) {
    return e.what();
  }
  return "no error";
}
bool contains(const std::string &text, const std::string &part) { return text.find(part) != std::string::npos; }

std::string clusterError(const std::string &text) {
  return errorOf([&] {
    std::istringstream in(text);
    readClusterJson(in, "c.json");
  });
}

std::string costsError(const std::string &text) {
  return errorOf([&] {
    std::istringstream in(text);
    readCostTableCsv(in, "costs.csv");
  });
}

const char *kHeader =
    "name,type,fwd_s,bwd_input_s,bwd_weight_s,activation_bytes,parameter_bytes,optimizer_bytes,producers\n";

struct TempDir {
  std::filesystem::path path =
      std::filesystem::temp_directory_path() / ("pipec_limits_" + std::to_string(::getpid()));
  TempDir() { std::filesystem::create_directories(path); }
  ~TempDir() { std::filesystem::remove_all(path); }
};

void apply(const std::string &flag, const std::string &value) {
  PartitionCliOptions o;
  applyPartitionFlag(o, flag, value);
}
} // namespace

TEST(Limits, GpusIsBoundedPerLevelAndInAll) {
  EXPECT_EQ(errorOf([] { parseGpusSpec("1x65536"); }),
            "--gpus '1x65536': 65536 devices per server is over the limit of 4096");
  EXPECT_EQ(errorOf([] { parseGpusSpec("65536x1"); }), "--gpus '65536x1': 65536 servers is over the limit of 4096");
  EXPECT_EQ(errorOf([] { parseGpusSpec("4096x4096"); }),
            "--gpus '4096x4096': 16777216 devices, over the limit of 65536");
  for (const char *bad : {"1x1e9", "99999999999999999999x1", "1x-8", "1x 8", "+1x8"})
    EXPECT_TRUE(contains(errorOf([&] { parseGpusSpec(bad); }), "expected NxG")) << bad;
  EXPECT_EQ(parseGpusSpec("16x4096").devicesPerServer, 4096);
}

TEST(Limits, ClusterFilesAreBounded) {
  EXPECT_EQ(clusterError(R"({"device": "H100", "levels": [{"fanout": 1099511627776, "bandwidth_GBps": 1}]})"),
            "c.json: levels[0]: \"fanout\" 1099511627776 is over the limit of 4096");
  EXPECT_EQ(clusterError(R"({"device": "H100", "levels": [{"fanout": -2, "bandwidth_GBps": 1}]})"),
            "c.json: levels[0]: \"fanout\" must be a positive integer");
  std::string many = R"({"device": "H100", "levels": [)";
  for (int i = 0; i < 9; ++i)
    many += std::string(i ? "," : "") + R"({"fanout": 1, "bandwidth_GBps": 1})";
  EXPECT_EQ(clusterError(many + "]}"), "c.json: \"levels\" has 9 entries, over the limit of 8");
  EXPECT_EQ(clusterError(R"({"device": "H100", "levels": [{"fanout": 4096, "bandwidth_GBps": 1},
                                                          {"fanout": 4096, "bandwidth_GBps": 1}]})"),
            "c.json: 4096 x 4096 devices, over the limit of 65536");
  EXPECT_TRUE(contains(clusterError(R"({"device": "H100", "levels": [{"fanout": 2, "bandwidth_GBps": 1e308}]})"),
                       "\"bandwidth_GBps\" 1e+308 must be between 0.001 and 1e+06"));
  EXPECT_TRUE(contains(clusterError(R"({"device_memory": 9223372036854775807, "levels": [{"fanout": 2, "bandwidth_GBps": 1}]})"),
                       "\"device_memory\" 9223372036854775807 is over the limit"));
  EXPECT_TRUE(contains(clusterError(R"({"device_memory": "1e30TB", "levels": [{"fanout": 2, "bandwidth_GBps": 1}]})"),
                       "over the limit of 1 PiB"));
  EXPECT_EQ(clusterError(std::string(100000, '[') + std::string(100000, ']')),
            "c.json: JSON nested deeper than 32 levels");
  EXPECT_TRUE(contains(clusterError(R"({"levels": [{"fanout": 2, "bandwidth_GBps": NaN}]})"), "malformed JSON"));
  EXPECT_TRUE(contains(errorOf([] { parseGigabytesPerSecond("1e300", "--intra-bw"); }), "between"));
}

TEST(Limits, CostValuesAreFiniteAndBounded) {
  std::string h = kHeader;
  EXPECT_EQ(costsError(h + "a,T,1e308,0,0,1,0,0,\n"),
            "costs.csv:2: op 'a': fwd_s is 1e+308 s, over the limit of 1000000 s");
  EXPECT_EQ(costsError(h + "a,T,inf,0,0,1,0,0,\n"), "costs.csv:2: column 'fwd_s': 'inf' is not a number");
  EXPECT_EQ(costsError(h + "a,T,1,0,0,1e30,0,0,\n"),
            "costs.csv:2: column 'activation_bytes': 1e30 is over the limit of 17592186044416 bytes (16 TiB)");
  EXPECT_EQ(costsError(h + "a,T,1,0,0,1,9223372036854775807,0,\n"),
            "costs.csv:2: column 'parameter_bytes': 9223372036854775807 is over the limit of 17592186044416 bytes (16 TiB)");
  std::string heavy = h;
  for (int i = 0; i < 100; ++i)
    heavy += "o" + std::to_string(i) + ",T,1,0,0," + std::to_string(kMaxOpBytes) + ",0,0,\n";
  EXPECT_TRUE(contains(costsError(heavy), "costs.csv: the ops' bytes add up to more than the limit")) << costsError(heavy);
  std::string wide;
  for (int i = 0; i < 100; ++i)
    wide += (i ? ",c" : "c") + std::to_string(i);
  EXPECT_EQ(costsError(wide + "\n"), "costs.csv:1: 100 columns, over the limit of 64");

  // Tables built in code (the cost pass) are checked by the cost model too.
  CostTable t = uniformChain(4, 1e-3, 1000, 100);
  for (double bad : {std::nan(""), std::numeric_limits<double>::infinity(), -1.0, 1e308}) {
    CostTable u = t;
    u.ops[2].backwardWeightSeconds = bad;
    EXPECT_TRUE(contains(errorOf([&] { partition(u, flatTopology(2, 1e9), PartitionOptions{}); }),
                         "cost table: op 'op2': bwd_weight_s is"))
        << bad;
  }
  CostTable u = t;
  u.ops[1].activationBytes = -5;
  EXPECT_EQ(errorOf([&] { CostModel(u, flatTopology(2, 1e9), PartitionOptions{}); }),
            "cost table: op 'op1': activation_bytes is -5 (must be >= 0)");
}

TEST(Limits, OptionValuesAreStrict) {
  EXPECT_EQ(errorOf([] { apply("--stages", "1000000000"); }), "--stages 1000000000: must be between 1 and 65536");
  EXPECT_EQ(errorOf([] { apply("--stages", "1e9"); }), "--stages 1e9: expected an integer between 1 and 65536");
  EXPECT_EQ(errorOf([] { apply("--stages", "-3"); }), "--stages -3: must be between 1 and 65536");
  EXPECT_EQ(errorOf([] { apply("--microbatches", "99999999999999999999"); }),
            "--microbatches 99999999999999999999: expected an integer between 1 and 65536");
  EXPECT_EQ(errorOf([] { apply("--microbatches", "65537"); }), "--microbatches 65537: must be between 1 and 65536");
  EXPECT_EQ(errorOf([] { apply("--microbatches", "65536"); }), "no error");
  EXPECT_EQ(errorOf([] { apply("--frobnicate", "1"); }), "unknown option '--frobnicate'");
  PartitionOptions o;
  o.microbatches = 1 << 30;
  EXPECT_EQ(errorOf([&] { CostModel(uniformChain(2, 1, 1, 1), flatTopology(2, 1e9), o); }),
            "--microbatches 1073741824: must be between 1 and 65536");
}

TEST(Limits, TooLargeSearchesAreRefusedQuickly) {
  CostTable table = uniformChain(64, 1e-3, 1 << 20, 1 << 20);
  auto timed = [&](const Topology &topo, PartitionOptions options) {
    auto start = std::chrono::steady_clock::now();
    std::string error = errorOf([&] { partition(table, topo, options); });
    double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    EXPECT_LT(seconds, 5.0) << topo.describe() << ": " << error;
    return error;
  };
  // 4096 devices in one server: the DP over even 16 layers would take minutes.
  Topology wide = makeGpusTopology({1, 4096}, *findDevicePreset("H100"));
  std::string error = timed(wide, PartitionOptions{});
  EXPECT_TRUE(contains(error, "the partition search would take about")) << error;
  // A forced depth multiplies the work by the stage count.
  PartitionOptions forced;
  forced.forcedStages = 60;
  Topology big = makeGpusTopology({64, 64}, *findDevicePreset("H100"));
  error = timed(big, forced);
  EXPECT_TRUE(contains(error, "--stages 60 on 4096 devices")) << error;
  // Large but reasonable topologies still partition.
  EXPECT_EQ(timed(makeGpusTopology({512, 8}, *findDevicePreset("H100")), PartitionOptions{}), "no error");
}

TEST(Limits, OnlyRegularBoundedFilesAreRead) {
  TempDir dir;
  std::string d = dir.path.string();
  EXPECT_EQ(errorOf([&] { readClusterJsonFile(d); }), d + ": cluster file is a directory, not a regular file");
  EXPECT_EQ(errorOf([&] { readCostTableCsvFile(d); }), d + ": cost table is a directory, not a regular file");
  EXPECT_EQ(errorOf([&] { readStageSpecsFile(d, uniformChain(2, 1, 1, 1)); }),
            d + ": partition file is a directory, not a regular file");
  std::string fifo = (dir.path / "fifo").string();
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  EXPECT_EQ(errorOf([&] { readClusterJsonFile(fifo); }), fifo + ": cluster file is a FIFO, not a regular file");
  std::string missing = (dir.path / "missing.json").string();
  EXPECT_TRUE(contains(errorOf([&] { readClusterJsonFile(missing); }), missing + ": cannot open cluster file"));
  std::string big = (dir.path / "big.json").string();
  {
    std::ofstream out(big);
    out << "[" << std::string(kMaxJsonFileBytes, ' ') << "]";
  }
  EXPECT_TRUE(contains(errorOf([&] { readUserJsonFile(big, "profile"); }), "over the limit of 16777216 bytes"));
}

TEST(Limits, PartitionFilesAreBounded) {
  CostTable table = uniformChain(4, 1, 1, 1);
  auto specsError = [&](const std::string &text) {
    return errorOf([&] {
      std::istringstream in(text);
      readStageSpecs(in, "p.json", table);
    });
  };
  EXPECT_EQ(specsError(R"({"stages": [{"first_op_index": 0, "last_op_index": 3, "replicas": 1099511627776}]})"),
            "p.json: stages[0]: \"replicas\" must be a positive integer at most 65536");
  EXPECT_EQ(specsError(R"({"stages": [{"first_op_index": 0, "last_op_index": 3, "ranks": [65536]}]})"),
            "p.json: stages[0]: \"ranks\" must be an array of non-negative integers below 65536");
  EXPECT_EQ(specsError(R"({"stages": [{"first_op_index": -1, "last_op_index": 3}]})"),
            "p.json: stages[0]: \"first_op_index\" must be an op index below 4");
}
