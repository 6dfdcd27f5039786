#include "analysis/Partition/Error.h"
#include "analysis/Partition/Topology.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include <unistd.h>

using namespace pipec::partition;

namespace {
std::string clusterError(const std::string &text) {
  std::istringstream in(text);
  try {
    readClusterJson(in, "cluster.json");
  } catch (const Error &e) {
    return e.what();
  }
  return "no error";
}
} // namespace

TEST(Topology, PresetsAreFoundCaseInsensitively) {
  for (const char *name : {"V100", "A100", "H100", "h100"})
    ASSERT_NE(findDevicePreset(name), nullptr) << name;
  EXPECT_EQ(findDevicePreset("B200"), nullptr);
  const DevicePreset &a100 = *findDevicePreset("A100");
  EXPECT_GT(a100.bf16FlopsPerSecond, a100.tf32FlopsPerSecond);
  EXPECT_GT(a100.tf32FlopsPerSecond, a100.fp32FlopsPerSecond);
  EXPECT_GT(a100.intraServerBytesPerSecond, a100.interServerBytesPerSecond);
  try {
    requireDevicePreset("TPU", "--device");
    FAIL();
  } catch (const Error &e) {
    EXPECT_STREQ(e.what(), "--device: unknown device 'TPU' (known: V100, A100, H100, H200)");
  }
}

TEST(Topology, GpusFlag) {
  GpusSpec s = parseGpusSpec("16x8");
  EXPECT_EQ(s.servers, 16);
  EXPECT_EQ(s.devicesPerServer, 8);
  Topology t = makeGpusTopology(s, *findDevicePreset("H100"), 0, 100e9);
  EXPECT_EQ(t.totalDevices(), 128);
  ASSERT_EQ(t.levels.size(), 2u);
  EXPECT_EQ(t.levels[0].fanout, 8);
  EXPECT_DOUBLE_EQ(t.levels[0].bandwidthBytesPerSecond, 450e9); // preset NVLink
  EXPECT_DOUBLE_EQ(t.levels[1].bandwidthBytesPerSecond, 100e9); // override
  EXPECT_EQ(t.devicesPerComponent(0), 8);
  for (const char *bad : {"0x8", "2x", "x8", "2x0", "2*8", "-1x8", "2x8x", "", "ax8"}) {
    try {
      parseGpusSpec(bad);
      ADD_FAILURE() << bad;
    } catch (const Error &e) {
      EXPECT_EQ(std::string(e.what()).rfind(std::string("--gpus '") + bad + "'", 0), 0u) << e.what();
    }
  }
}

TEST(Topology, ClusterFileWithThreeLevels) {
  std::istringstream in(R"({"device": "a100", "device_memory": "40GiB", "levels": [
      {"name": "nvlink", "fanout": 4, "bandwidth_GBps": 300},
      {"name": "rack", "fanout": 2, "bandwidth_GBps": 25},
      {"name": "spine", "fanout": 3, "bandwidth_GBps": 12.5}]})");
  Topology t = readClusterJson(in, "c.json");
  EXPECT_EQ(t.device, "A100");
  EXPECT_EQ(t.deviceMemoryBytes, int64_t(40) << 30);
  EXPECT_EQ(t.totalDevices(), 24);
  EXPECT_EQ(t.levels[2].name, "spine");
  EXPECT_DOUBLE_EQ(t.levels[2].bandwidthBytesPerSecond, 12.5e9);
}

TEST(Topology, ClusterFileErrors) {
  EXPECT_EQ(clusterError("{\"levels\": [}").rfind("cluster.json: malformed JSON: ", 0), 0u);
  EXPECT_EQ(clusterError("[1]"), "cluster.json: expected a JSON object with \"levels\"");
  EXPECT_EQ(clusterError(R"({"device": "H100"})"),
            "cluster.json: missing \"levels\": a non-empty array, innermost level first");
  EXPECT_EQ(clusterError(R"({"levels": [{"fanout": 8, "bandwidth_GBps": 1}]})"),
            "cluster.json: missing \"device_memory\" (or a \"device\" preset that implies it)");
  EXPECT_EQ(clusterError(R"({"device": "H100", "levels": [{"bandwidth_GBps": 1}]})"),
            "cluster.json: levels[0]: missing \"fanout\"");
  EXPECT_EQ(clusterError(R"({"device": "H100", "levels": [{"fanout": 0, "bandwidth_GBps": 1}]})"),
            "cluster.json: levels[0]: \"fanout\" must be a positive integer");
  EXPECT_EQ(clusterError(R"({"device": "H100", "levels": [{"fanout": 2}]})"),
            "cluster.json: levels[0]: missing \"bandwidth_GBps\"");
  EXPECT_EQ(clusterError(R"({"device": "H100", "levels": [{"fanout": 2, "bandwidth_GBps": 0}]})"),
            "cluster.json: levels[0]: \"bandwidth_GBps\" must be a positive number");
  EXPECT_EQ(clusterError(R"({"device": "X1", "levels": [{"fanout": 2, "bandwidth_GBps": 1}]})"),
            "cluster.json: \"device\": unknown device 'X1' (known: V100, A100, H100, H200)");
  EXPECT_EQ(clusterError(R"({"device_memory": "lots", "levels": [{"fanout": 2, "bandwidth_GBps": 1}]})"),
            "cluster.json: \"device_memory\" 'lots': expected a size such as 16GiB, 80GB or 1000000 (bytes)");
  EXPECT_THROW(readClusterJsonFile("/nonexistent/cluster.json"), Error);
  // A GPU no larger than what the CUDA runtime holds of it is refused, not planned.
  EXPECT_EQ(clusterError(R"({"device_memory": "1GiB", "levels": [{"fanout": 2, "bandwidth_GBps": 1}]})"),
            "cluster.json: device memory of 1.0 GiB leaves nothing beside the CUDA runtime's 1.0 GiB per GPU");
}

TEST(Topology, Sizes) {
  EXPECT_EQ(parseByteSize("16GiB", "--memory-limit"), int64_t(16) << 30);
  EXPECT_EQ(parseByteSize("80GB", "--memory-limit"), int64_t(80e9));
  EXPECT_EQ(parseByteSize("1.5 MiB", "x"), 1572864);
  EXPECT_EQ(parseByteSize("123", "x"), 123);
  EXPECT_EQ(parseByteSize("2tb", "x"), int64_t(2e12));
  for (const char *bad : {"", "GiB", "12 parsecs", "-1GB", "0", "1e30TB"})
    EXPECT_THROW(parseByteSize(bad, "--memory-limit"), Error) << bad;
  EXPECT_DOUBLE_EQ(parseGigabytesPerSecond("12.5", "--inter-bw"), 12.5e9);
  EXPECT_THROW(parseGigabytesPerSecond("0", "--inter-bw"), Error);
  EXPECT_THROW(parseGigabytesPerSecond("fast", "--inter-bw"), Error);
  EXPECT_EQ(formatBytes(80.0 * (1 << 30)), "80.0 GiB");
  EXPECT_EQ(formatBytes(512), "512 B");
}

TEST(Topology, CpuRanksShareTheirHost) {
  // 2 hosts of 4 ranks, 32 GiB each: a tenth for the system, 256 MiB per rank.
  Topology t = makeGpusTopology({2, 4}, *findDevicePreset("H100"));
  const int64_t host = int64_t(32) << 30;
  Topology cpu = withRanksSharingHost(t, host, "--host-memory");
  EXPECT_EQ(cpu.deviceMemoryBytes, static_cast<int64_t>(host * 0.9 / 4 - (int64_t(256) << 20)));
  EXPECT_EQ(cpu.levels.size(), t.levels.size());
  EXPECT_NE(cpu.describe().find("per rank: 32.0 GiB of host memory (--host-memory) shared by 4 CPU ranks"),
            std::string::npos)
      << cpu.describe();
  EXPECT_NE(t.describe().find("80.0 GiB per device"), std::string::npos) << t.describe();
  // A GPU's stage may plan its memory less the CUDA runtime's share; a CPU rank's share is its own.
  EXPECT_EQ(t.stageMemoryBytes(), (int64_t(80) << 30) - kGpuRuntimeBytes);
  EXPECT_EQ(cpu.stageMemoryBytes(), cpu.deviceMemoryBytes);
  // A host too small for its ranks' own processes is refused, not planned.
  EXPECT_THROW(withRanksSharingHost(t, int64_t(1) << 30, "--host-memory"), Error);
  // /proc/meminfo, where there is one, gives a positive size.
  if (std::optional<int64_t> mine = detectHostMemoryBytes())
    EXPECT_GT(*mine, 0);
}

TEST(Topology, ContainerMemoryLimit) {
  namespace fs = std::filesystem;
  const fs::path root = fs::temp_directory_path() / ("pipec-cgroup-" + std::to_string(::getpid()));
  fs::remove_all(root);
  auto write = [&](const fs::path &file, const std::string &text) {
    fs::create_directories(file.parent_path());
    std::ofstream(file) << text;
  };
  // v2: one line "0::/path", the limit in that group's memory.max.
  write(root / "v2.cgroup", "0::/box\n");
  write(root / "fs/box/memory.max", "8589934592\n");
  EXPECT_EQ(controlGroupMemoryLimit((root / "v2.cgroup").string(), (root / "fs").string()), int64_t(8) << 30);
  write(root / "fs/box/memory.max", "max\n");
  EXPECT_FALSE(controlGroupMemoryLimit((root / "v2.cgroup").string(), (root / "fs").string()).has_value());
  // v1: the memory controller's line; "no limit" is a number near 2^63.
  write(root / "v1.cgroup", "5:cpu,cpuacct:/other\n4:memory:/job\n");
  write(root / "fs/memory/job/memory.limit_in_bytes", "4294967296\n");
  EXPECT_EQ(controlGroupMemoryLimit((root / "v1.cgroup").string(), (root / "fs").string()), int64_t(4) << 30);
  write(root / "fs/memory/job/memory.limit_in_bytes", "9223372036854771712\n");
  EXPECT_FALSE(controlGroupMemoryLimit((root / "v1.cgroup").string(), (root / "fs").string()).has_value());
  EXPECT_FALSE(controlGroupMemoryLimit((root / "absent").string(), (root / "fs").string()).has_value());
  fs::remove_all(root);
}
