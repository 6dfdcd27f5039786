#include "analysis/Partition/Topology.h"
#include "analysis/Settings/Declared.h"

#include "analysis/Partition/Error.h"
#include "analysis/Partition/InputFiles.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <sstream>

namespace pipec::partition {

static constexpr int64_t GiB = int64_t(1) << 30;

const std::vector<DevicePreset> &devicePresets() {
  // Dense datasheet peaks of the SXM parts; link numbers are per direction:
  // NVLink 2/3/4 (300/600/900 GB/s both ways) and one 100/200/400 Gb/s NIC per GPU.
  // The efficiencies were fitted on an H200 (bench/gpu/fit_preset.py's fit
  // within the bandwidth, on the second 2026-11-28 run, docs/cost-model.md);
  // the other cards, never measured, assume the same fractions of their peaks.
  constexpr double kMatrixEfficiency = 0.36, kMemoryEfficiency = 0.95;
  // Convolutions and batch norms: fitted with fit_preset.py --convolutional to
  // ResNet-50's and MobileNet-V2's op profiles and iterations (bf16) on the
  // same run.
  constexpr double kConvolutionEfficiency = 0.29, kGroupedConvolutionEfficiency = 0.15, kBatchNormEfficiency = 0.23;
  const auto preset = [](std::string_view name, double fp32, double tf32, double bf16, double bandwidth,
                         int64_t memory, double intra, double inter) {
    return DevicePreset{name,  fp32,  tf32,  bf16,  bandwidth, memory, intra, inter, kMatrixEfficiency,
                        kMemoryEfficiency, kConvolutionEfficiency, kGroupedConvolutionEfficiency,
                        kBatchNormEfficiency};
  };
  static const std::vector<DevicePreset> presets = {
      preset("V100", 15.7e12, 15.7e12, 125e12, 900e9, 32 * GiB, 150e9, 12.5e9),
      preset("A100", 19.5e12, 156e12, 312e12, 2039e9, 80 * GiB, 300e9, 25e9),
      preset("H100", 67e12, 494.7e12, 989.4e12, 3350e9, 80 * GiB, 450e9, 50e9),
      // H100's tensor cores with HBM3e; its memory as the card reports it
      // (143,771 MiB, docs/gpu-runs.md).
      preset("H200", 67e12, 494.7e12, 989.4e12, 4800e9, 143771 * (GiB >> 10), 450e9, 50e9),
  };
  return presets;
}

static bool equalsIgnoreCase(std::string_view a, std::string_view b) {
  if (a.size() != b.size())
    return false;
  for (size_t i = 0; i < a.size(); ++i)
    if (std::tolower(static_cast<unsigned char>(a[i])) != std::tolower(static_cast<unsigned char>(b[i])))
      return false;
  return true;
}

const DevicePreset *findDevicePreset(std::string_view name) {
  for (const DevicePreset &p : devicePresets())
    if (equalsIgnoreCase(p.name, name))
      return &p;
  return nullptr;
}

std::string devicePresetNames() {
  std::string names;
  for (const DevicePreset &p : devicePresets())
    names += (names.empty() ? "" : ", ") + std::string(p.name);
  return names;
}

const DevicePreset &requireDevicePreset(std::string_view name, std::string_view flag) {
  if (const DevicePreset *p = findDevicePreset(name))
    return *p;
  throw Error(std::string(flag) + ": unknown device '" + std::string(name) + "' (known: " + devicePresetNames() +
              ")");
}

static std::string formatNumber(double v) {
  std::ostringstream os;
  os << v;
  return os.str();
}

/// "4096 x 4096" style product of the fan-outs (outermost first), for messages.
static std::string describeProduct(const std::vector<Level> &levels) {
  std::string out;
  for (size_t i = levels.size(); i-- > 0;)
    out += std::to_string(levels[i].fanout) + (i ? " x " : "");
  return out;
}

int64_t Topology::totalDevices() const { return devicesPerComponent(static_cast<int>(levels.size()) - 1); }

int64_t Topology::devicesPerComponent(int k) const {
  // Saturates instead of overflowing: verify() refuses anything over kMaxDevices.
  int64_t n = 1;
  for (int i = 0; i <= k && i < static_cast<int>(levels.size()); ++i)
    n = std::min<int64_t>(n * std::max(levels[i].fanout, 0), kMaxDevices + 1);
  return n;
}

int Topology::linkLevel(int64_t a, int64_t b) const {
  if (a == b)
    return -1;
  for (int k = 0; k < static_cast<int>(levels.size()); ++k)
    if (a / devicesPerComponent(k) == b / devicesPerComponent(k))
      return k;
  return static_cast<int>(levels.size()) - 1; // out of range: the outermost link
}

std::vector<int64_t> Topology::workersTouched(int64_t first, int64_t count) const {
  std::vector<int64_t> touched(levels.size(), 1);
  if (count < 1)
    return touched;
  int64_t last = first + count - 1;
  for (int k = 0; k < static_cast<int>(levels.size()); ++k) {
    int64_t size = devicesPerComponent(k), worker = devicesPerComponent(k - 1);
    int64_t firstComponent = first / size, lastComponent = last / size;
    auto within = [&](int64_t component) {
      int64_t lo = std::max(first, component * size), hi = std::min(last, component * size + size - 1);
      return hi / worker - lo / worker + 1;
    };
    int64_t most = std::max(within(firstComponent), within(lastComponent));
    if (lastComponent - firstComponent >= 2)
      most = std::max<int64_t>(most, levels[k].fanout); // a whole component in between
    touched[k] = most;
  }
  return touched;
}

std::string Topology::describe() const {
  std::ostringstream os;
  for (size_t i = levels.size(); i-- > 0;)
    os << levels[i].fanout << (i ? "x" : "");
  os << " " << (device.empty() ? "devices" : device) << " (";
  for (size_t i = levels.size(); i-- > 0;)
    os << levels[i].name << " " << levels[i].bandwidthBytesPerSecond / 1e9 << " GB/s"
       << (i ? ", " : "");
  os << "; " << formatBytes(static_cast<double>(deviceMemoryBytes))
     << " per " << memoryUnit() << (memoryOrigin.empty() ? "" : ": " + memoryOrigin) << ")";
  return os.str();
}

std::optional<int64_t> controlGroupMemoryLimit(const std::string &cgroupFile, const std::string &cgroupRoot) {
  std::ifstream groups(cgroupFile);
  std::string line;
  while (std::getline(groups, line)) {
    // "0::/path" (v2) or "N:memory:/path" (v1; controllers comma-separated)
    const size_t a = line.find(':'), b = a == std::string::npos ? a : line.find(':', a + 1);
    if (b == std::string::npos)
      continue;
    const std::string controllers = line.substr(a + 1, b - a - 1), path = line.substr(b + 1);
    std::string file;
    if (controllers.empty())
      file = cgroupRoot + path + "/memory.max";
    else if (("," + controllers + ",").find(",memory,") != std::string::npos)
      file = cgroupRoot + "/memory" + path + "/memory.limit_in_bytes";
    else
      continue;
    std::ifstream in(file);
    std::string value;
    if (!(in >> value) || value == "max")
      continue;
    char *end = nullptr;
    errno = 0;
    const long long bytes = std::strtoll(value.c_str(), &end, 10);
    if (errno == 0 && end && *end == '\0' && bytes > 0 && bytes < kMaxDeviceMemoryBytes)
      return bytes; // v1 reports "no limit" as a number near 2^63, over the bound
  }
  return std::nullopt;
}

std::optional<int64_t> detectHostMemoryBytes() {
  std::optional<int64_t> total;
  std::ifstream in("/proc/meminfo");
  std::string key, unit;
  int64_t kib = 0;
  while (!total && in >> key >> kib >> unit)
    if (key == "MemTotal:" && unit == "kB" && kib > 0 && kib < kMaxDeviceMemoryBytes / 1024)
      total = kib * 1024;
  if (std::optional<int64_t> limit = controlGroupMemoryLimit("/proc/self/cgroup", "/sys/fs/cgroup");
      limit && (!total || *limit < *total))
    return limit;
  return total;
}

Topology withRanksSharingHost(Topology t, int64_t hostBytes, const std::string &origin) {
  // The system keeps a tenth (page cache, other processes); each rank's
  // process, libraries, MPI and BLAS buffers take about 256 MiB before its
  // stage's weights (measured on piperun, docs/scale.md).
  constexpr double kSystemShare = 0.1;
  constexpr int64_t kRankBaselineBytes = int64_t(256) << 20;
  const int ranks = t.levels.empty() ? 1 : t.levels[0].fanout;
  const double share = static_cast<double>(hostBytes) * (1 - kSystemShare) / ranks - kRankBaselineBytes;
  if (!(share >= 1))
    throw Error(formatBytes(static_cast<double>(hostBytes)) + " of host memory (" + origin + ") leaves nothing for " +
                std::to_string(ranks) + " CPU ranks of about " + formatBytes(kRankBaselineBytes) +
                " each before their weights");
  t.deviceMemoryBytes = static_cast<int64_t>(share);
  t.memoryOrigin = formatBytes(static_cast<double>(hostBytes)) + " of host memory (" + origin + ") shared by " +
                   std::to_string(ranks) + (ranks == 1 ? " CPU rank" : " CPU ranks");
  return t;
}

void Topology::verify(const std::string &source) const {
  if (levels.empty())
    throw Error(source + ": the topology has no levels");
  if (levels.size() > static_cast<size_t>(kMaxLevels))
    throw Error(source + ": " + std::to_string(levels.size()) + " levels, over the limit of " +
                std::to_string(kMaxLevels));
  for (size_t i = 0; i < levels.size(); ++i) {
    std::string level = source + ": level " + std::to_string(i) + " ('" + levels[i].name + "')";
    if (levels[i].fanout < 1)
      throw Error(level + " has fan-out " + std::to_string(levels[i].fanout) + " (must be >= 1)");
    if (levels[i].fanout > kMaxFanout)
      throw Error(level + " has fan-out " + std::to_string(levels[i].fanout) + ", over the limit of " +
                  std::to_string(kMaxFanout));
    double gbps = levels[i].bandwidthBytesPerSecond / 1e9;
    if (!(gbps >= kMinBandwidthGBps && gbps <= kMaxBandwidthGBps))
      throw Error(level + " has bandwidth " + formatNumber(gbps) + " GB/s (must be between " +
                  formatNumber(kMinBandwidthGBps) + " and " + formatNumber(kMaxBandwidthGBps) + " GB/s)");
  }
  if (deviceMemoryBytes <= 0)
    throw Error(source + ": device memory must be positive");
  if (gpuDevices() && deviceMemoryBytes <= kGpuRuntimeBytes)
    throw Error(source + ": device memory of " + formatBytes(static_cast<double>(deviceMemoryBytes)) +
                " leaves nothing beside the CUDA runtime's " + formatBytes(static_cast<double>(kGpuRuntimeBytes)) +
                " per GPU");
  if (deviceMemoryBytes > kMaxDeviceMemoryBytes)
    throw Error(source + ": device memory of " + std::to_string(deviceMemoryBytes) +
                " bytes is over the limit of " + std::to_string(kMaxDeviceMemoryBytes) + " (1 PiB)");
  if (totalDevices() > kMaxDevices)
    throw Error(source + ": " + describeProduct(levels) + " devices, over the limit of " +
                std::to_string(kMaxDevices));
}

static bool parsePositiveInt(std::string_view s, int &out) {
  if (s.empty() || s.size() > 9)
    return false;
  int v = 0;
  for (char c : s) {
    if (!std::isdigit(static_cast<unsigned char>(c)))
      return false;
    v = v * 10 + (c - '0');
  }
  out = v;
  return v > 0;
}

GpusSpec parseGpusSpec(std::string_view text) {
  size_t x = text.find_first_of("xX");
  GpusSpec spec;
  if (x == std::string_view::npos || !parsePositiveInt(text.substr(0, x), spec.servers) ||
      !parsePositiveInt(text.substr(x + 1), spec.devicesPerServer))
    throw Error((settings::flag(settings::kGpus) + " '") + std::string(text) +
                "': expected NxG with N servers and G devices per server, both positive integers "
                "(e.g. 2x8)");
  for (auto [count, what] : {std::pair<int, const char *>{spec.servers, "servers"},
                             {spec.devicesPerServer, "devices per server"}})
    if (count > kMaxFanout)
      throw Error((settings::flag(settings::kGpus) + " '") + std::string(text) + "': " + std::to_string(count) + " " + what +
                  " is over the limit of " + std::to_string(kMaxFanout));
  if (static_cast<int64_t>(spec.servers) * spec.devicesPerServer > kMaxDevices)
    throw Error((settings::flag(settings::kGpus) + " '") + std::string(text) + "': " +
                std::to_string(static_cast<int64_t>(spec.servers) * spec.devicesPerServer) +
                " devices, over the limit of " + std::to_string(kMaxDevices));
  return spec;
}

Topology makeGpusTopology(GpusSpec spec, const DevicePreset &device, double intra, double inter) {
  Topology t;
  t.device = std::string(device.name);
  t.deviceMemoryBytes = device.memoryBytes;
  t.levels.push_back({spec.devicesPerServer, intra > 0 ? intra : device.intraServerBytesPerSecond, "nvlink"});
  t.levels.push_back({spec.servers, inter > 0 ? inter : device.interServerBytesPerSecond, "network"});
  t.verify(settings::flag(settings::kGpus));
  return t;
}

int64_t parseByteSize(std::string_view text, std::string_view what) {
  std::string s(text);
  char *end = nullptr;
  errno = 0;
  double v = std::strtod(s.c_str(), &end);
  std::string unit(end ? end : "");
  while (!unit.empty() && unit.front() == ' ')
    unit.erase(unit.begin());
  double scale = 0;
  static const struct { const char *unit; double scale; } units[] = {
      {"", 1}, {"B", 1}, {"KB", 1e3}, {"MB", 1e6}, {"GB", 1e9}, {"TB", 1e12},
      {"KiB", 1024.0}, {"MiB", 1048576.0}, {"GiB", 1073741824.0}, {"TiB", 1099511627776.0}};
  for (const auto &u : units)
    if (equalsIgnoreCase(unit, u.unit) && (unit.size() < 3 || unit[1] == 'i' || unit[1] == 'I'))
      scale = u.scale;
  if (s.empty() || end == s.c_str() || errno == ERANGE || !std::isfinite(v) || scale == 0)
    throw Error(std::string(what) + " '" + s + "': expected a size such as 16GiB, 80GB or 1000000 (bytes)");
  double bytes = v * scale;
  if (!(bytes > 0))
    throw Error(std::string(what) + " '" + s + "': the size must be positive");
  if (bytes > static_cast<double>(kMaxDeviceMemoryBytes))
    throw Error(std::string(what) + " '" + s + "': over the limit of 1 PiB");
  return static_cast<int64_t>(std::llround(bytes));
}

double parseGigabytesPerSecond(std::string_view text, std::string_view what) {
  std::string s(text);
  char *end = nullptr;
  errno = 0;
  double v = std::strtod(s.c_str(), &end);
  if (s.empty() || *end != '\0' || errno == ERANGE || !std::isfinite(v))
    throw Error(std::string(what) + " '" + s + "': expected a number of GB/s");
  if (!(v > 0))
    throw Error(std::string(what) + " '" + s + "': the bandwidth must be positive");
  if (v < kMinBandwidthGBps || v > kMaxBandwidthGBps)
    throw Error(std::string(what) + " '" + s + "': the bandwidth must be between " +
                formatNumber(kMinBandwidthGBps) + " and " + formatNumber(kMaxBandwidthGBps) + " GB/s");
  return v * 1e9;
}

std::string formatBytes(double bytes) {
  static const char *units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int u = 0;
  while (std::fabs(bytes) >= 1024 && u < 4) {
    bytes /= 1024;
    ++u;
  }
  std::ostringstream os;
  os.setf(std::ios::fixed);
  os.precision(u == 0 ? 0 : 1);
  os << bytes << " " << units[u];
  return os.str();
}

static Topology clusterFromJson(const nlohmann::json &j, const std::string &file);

Topology readClusterJson(std::istream &in, const std::string &file) {
  std::ostringstream text;
  text << in.rdbuf();
  return clusterFromJson(parseUserJson(text.str(), file), file);
}

static Topology clusterFromJson(const nlohmann::json &j, const std::string &file) {
  auto fail = [&](const std::string &why) -> Error { return Error(file + ": " + why); };
  if (!j.is_object())
    throw fail("expected a JSON object with \"levels\"");
  Topology t;
  const DevicePreset *preset = nullptr;
  if (j.contains("device")) {
    if (!j["device"].is_string())
      throw fail("\"device\" must be a string");
    t.device = j["device"].get<std::string>();
    preset = &requireDevicePreset(t.device, file + ": \"device\"");
    t.device = std::string(preset->name);
  }
  if (j.contains("device_memory")) {
    const nlohmann::json &m = j["device_memory"];
    if (m.is_number_unsigned() && m.get<uint64_t>() > static_cast<uint64_t>(kMaxDeviceMemoryBytes))
      throw fail("\"device_memory\" " + m.dump() + " is over the limit of " +
                 std::to_string(kMaxDeviceMemoryBytes) + " bytes (1 PiB)");
    if (m.is_number_integer() && m.get<int64_t>() > 0)
      t.deviceMemoryBytes = m.get<int64_t>();
    else if (m.is_string())
      t.deviceMemoryBytes = parseByteSize(m.get<std::string>(), file + ": \"device_memory\"");
    else
      throw fail("\"device_memory\" must be a positive number of bytes or a string such as \"80GiB\"");
  } else if (preset) {
    t.deviceMemoryBytes = preset->memoryBytes;
  } else {
    throw fail("missing \"device_memory\" (or a \"device\" preset that implies it)");
  }
  if (!j.contains("levels") || !j["levels"].is_array() || j["levels"].empty())
    throw fail("missing \"levels\": a non-empty array, innermost level first");
  if (j["levels"].size() > static_cast<size_t>(kMaxLevels))
    throw fail("\"levels\" has " + std::to_string(j["levels"].size()) + " entries, over the limit of " +
               std::to_string(kMaxLevels));
  for (size_t i = 0; i < j["levels"].size(); ++i) {
    const nlohmann::json &l = j["levels"][i];
    std::string where = "levels[" + std::to_string(i) + "]";
    if (!l.is_object())
      throw fail(where + " must be an object");
    Level level;
    if (l.contains("name") && !l["name"].is_string())
      throw fail(where + ": \"name\" must be a string");
    level.name = l.value("name", "level" + std::to_string(i));
    if (level.name.size() > 64)
      throw fail(where + ": \"name\" is longer than 64 characters");
    if (!l.contains("fanout"))
      throw fail(where + ": missing \"fanout\"");
    if (!l["fanout"].is_number_unsigned() || l["fanout"].get<uint64_t>() < 1)
      throw fail(where + ": \"fanout\" must be a positive integer");
    if (l["fanout"].get<uint64_t>() > static_cast<uint64_t>(kMaxFanout))
      throw fail(where + ": \"fanout\" " + l["fanout"].dump() + " is over the limit of " +
                 std::to_string(kMaxFanout));
    level.fanout = l["fanout"].get<int>();
    if (!l.contains("bandwidth_GBps"))
      throw fail(where + ": missing \"bandwidth_GBps\"");
    if (!l["bandwidth_GBps"].is_number() || !(l["bandwidth_GBps"].get<double>() > 0))
      throw fail(where + ": \"bandwidth_GBps\" must be a positive number");
    double gbps = l["bandwidth_GBps"].get<double>();
    if (!(gbps >= kMinBandwidthGBps && gbps <= kMaxBandwidthGBps))
      throw fail(where + ": \"bandwidth_GBps\" " + l["bandwidth_GBps"].dump() + " must be between " +
                 formatNumber(kMinBandwidthGBps) + " and " + formatNumber(kMaxBandwidthGBps));
    level.bandwidthBytesPerSecond = gbps * 1e9;
    t.levels.push_back(level);
  }
  t.verify(file);
  return t;
}

Topology readClusterJsonFile(const std::string &path) {
  return clusterFromJson(readUserJsonFile(path, "cluster file"), path);
}

} // namespace pipec::partition
