#ifndef PIPEC_PARTITION_TOPOLOGY_H
#define PIPEC_PARTITION_TOPOLOGY_H

#include <cstdint>
#include <iosfwd>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace pipec::partition {

/// Datasheet numbers of one accelerator (dense peaks, SXM parts). Links are
/// per device and per direction: NVLink to the other devices of the server,
/// the NIC to other servers.
struct DevicePreset {
  std::string_view name;
  double fp32FlopsPerSecond;
  double tf32FlopsPerSecond; ///< V100 has no TF32: equals fp32
  double bf16FlopsPerSecond; ///< V100 has no bf16: its fp16 tensor-core peak
  double memoryBytesPerSecond;
  int64_t memoryBytes;
  double intraServerBytesPerSecond; ///< default NVLink bandwidth (level 1 of --gpus)
  double interServerBytesPerSecond; ///< default network bandwidth (level 2 of --gpus)
  /// The fractions of the tensor-core peaks (tf32, bf16) and of the memory
  /// bandwidth that pipec's generated stages reach (docs/cost-model.md,
  /// "Against the card").
  double matrixEfficiency, memoryEfficiency;
  /// What convolutions (dense, and grouped or depthwise) and batch norms
  /// reach of the rates those give other ops (both rates of a convolution,
  /// the bandwidth of a batch norm and its gradients): cuDNN's NCHW
  /// convolutions and pipec's batch-norm kernels, fitted to op profiles
  /// (docs/cost-model.md).
  double convolutionEfficiency, groupedConvolutionEfficiency, batchNormEfficiency;
};

const std::vector<DevicePreset> &devicePresets();
/// Case-insensitive; nullptr when unknown.
const DevicePreset *findDevicePreset(std::string_view name);
/// Like findDevicePreset but throws Error naming `flag` and listing the presets.
const DevicePreset &requireDevicePreset(std::string_view name, std::string_view flag);
/// "V100, A100, H100, H200": the presets' names for help and error texts.
std::string devicePresetNames();

/// One level of the hierarchy: `fanout` children connected by links of
/// `bandwidthBytesPerSecond` (level 0: devices in a server).
struct Level {
  int fanout = 1;
  double bandwidthBytesPerSecond = 0;
  std::string name;
};

/// What a topology may describe (--gpus, --cluster): beyond these the
/// partition search's tables could not be built in reasonable time and memory.
/// Topology::verify enforces them; the partitioner also checks its estimated
/// work for the chosen depth before starting (docs/partition.md).
inline constexpr int kMaxLevels = 8;
inline constexpr int kMaxFanout = 4096;       ///< children of one component, any level
inline constexpr int64_t kMaxDevices = 65536; ///< product of the fan-outs
/// The device preset when none is given (--device).
inline constexpr const char *kDefaultDevice = "H100";
inline constexpr double kMinBandwidthGBps = 1e-3, kMaxBandwidthGBps = 1e6;
inline constexpr int64_t kMaxDeviceMemoryBytes = int64_t(1) << 50; ///< 1 PiB
/// What a GPU rank holds besides its stage's planned memory: the CUDA
/// context, the cuBLAS(Lt) and cuDNN handles, plans and workspaces (measured
/// 0.8-0.9 GiB above the plans on an H200, docs/partition.md).
inline constexpr int64_t kGpuRuntimeBytes = int64_t(1) << 30;

struct Topology {
  std::vector<Level> levels; ///< innermost first
  int64_t deviceMemoryBytes = 0;
  std::string device; ///< preset name, may be empty for cluster files without one
  /// Empty: deviceMemoryBytes is the device's. Else where it comes from (CPU
  /// ranks sharing a host: withRanksSharingHost).
  std::string memoryOrigin;

  /// What messages call the units memory is per: "device", or "rank" for CPU
  /// ranks sharing a host.
  const char *memoryUnit() const { return gpuDevices() ? "device" : "rank"; }
  /// Whether the devices are GPUs (the CUDA runtime takes kGpuRuntimeBytes
  /// of each), not CPU ranks sharing a host.
  bool gpuDevices() const { return memoryOrigin.empty(); }
  /// The memory a stage's plan may use per device by default: a GPU's less
  /// kGpuRuntimeBytes, a CPU rank's share as it is.
  int64_t stageMemoryBytes() const { return deviceMemoryBytes - (gpuDevices() ? kGpuRuntimeBytes : 0); }
  int64_t totalDevices() const;
  /// Devices in one component of level k (product of fan-outs 0..k); 1 for k = -1.
  int64_t devicesPerComponent(int k) const;
  /// The level of the link between devices a and b (ranks): the innermost k whose
  /// components (devicesPerComponent(k) devices each) hold both; -1 when a == b.
  int linkLevel(int64_t a, int64_t b) const;
  /// For the devices first..first+count-1, per level k (innermost first): the most
  /// level-k workers (components of level k-1) the range touches inside any one
  /// level-k component. For a range that is a product of whole components, these
  /// are its replica counts per level.
  std::vector<int64_t> workersTouched(int64_t first, int64_t count) const;
  /// "2x8 H100 (network 50 GB/s, NVLink 450 GB/s)" style summary.
  std::string describe() const;
  /// Throws Error when a level has fan-out < 1 or a non-positive bandwidth, or
  /// when a bound above is exceeded.
  void verify(const std::string &source) const;
};

/// This machine's memory: /proc/meminfo's MemTotal, or the memory limit of
/// this process's control group (a container's) when that is lower; nullopt
/// when neither can be read.
std::optional<int64_t> detectHostMemoryBytes();
/// The memory limit of a process's control group (a container's), if one is
/// set, from its /proc/PID/cgroup file and the cgroup file system's root:
/// cgroup v2's memory.max, or v1's memory.limit_in_bytes.
std::optional<int64_t> controlGroupMemoryLimit(const std::string &cgroupFile, const std::string &cgroupRoot);

/// `t` for CPU ranks: the ranks of one innermost component (a server of
/// --gpus NxG) share one host of `hostBytes`; each is given an equal share of
/// what is left after the system's part and piperun's own (docs/partition.md).
/// `origin` says where hostBytes came from. Throws Error when nothing is left.
Topology withRanksSharingHost(Topology t, int64_t hostBytes, const std::string &origin);

struct GpusSpec {
  int servers = 0, devicesPerServer = 0;
};
/// Parses "NxG" (N servers × G devices). Throws Error mentioning --gpus.
GpusSpec parseGpusSpec(std::string_view text);

/// Two levels: G devices over NVLink, N servers over the network. Bandwidths
/// <= 0 take the preset's defaults.
Topology makeGpusTopology(GpusSpec spec, const DevicePreset &device,
                          double intraBytesPerSecond = 0, double interBytesPerSecond = 0);

/// cluster.json (docs/cluster-json.md). Throws Error("FILE: reason").
Topology readClusterJson(std::istream &in, const std::string &fileName);
Topology readClusterJsonFile(const std::string &path);

/// "16GiB", "80GB", "1.5TB", "123" (bytes). Throws Error naming `what`.
int64_t parseByteSize(std::string_view text, std::string_view what);
/// A positive number of GB/s (10^9 bytes/s) → bytes/s. Throws Error naming `what`.
double parseGigabytesPerSecond(std::string_view text, std::string_view what);
/// 80 GiB → "80 GiB", 1.5e6 → "1.4 MiB".
std::string formatBytes(double bytes);

} // namespace pipec::partition

#endif
