// libFuzzer targets for the files `pipec partition` (and `pipec MODEL
// --gpus/--cluster/--partition`) reads, through runPartitionCommand, the
// function behind `pipec partition`: it reads the files and partitions. The
// flags go through applyPartitionFlag, as pipec's command line hands them over. Built three times (PIPEC_FUZZ_MODE):
//   1 fuzz_cost_table:  the input is the --costs CSV        (--gpus 2x2)
//   2 fuzz_cluster:     the input is the --cluster JSON     (a fixed cost table)
//   3 fuzz_stage_specs: the input is the --partition JSON   (a fixed cost table, --gpus 1x4)
// runPartitionCommand reports Error as "error: ..." and returns 1; anything
// else escaping it would terminate pipec, so it is a finding here too.
#include "FuzzSupport.h"

#include "analysis/Partition/PartitionCommand.h"
#include "analysis/Partition/Topology.h"

#include <iostream>
#include <string>
#include <vector>

#ifndef PIPEC_FUZZ_MODE
#error "PIPEC_FUZZ_MODE must be 1 (cost table), 2 (cluster) or 3 (stage specs)"
#endif

namespace {
// A small training graph with a branch (the shape of examples/mlp.onnx's
// table plus a residual), for the targets whose input is not the table.
const char *const kCostTable =
    "name,type,fwd_s,bwd_input_s,bwd_weight_s,activation_bytes,parameter_bytes,optimizer_bytes,producers\n"
    "fc1,Gemm,2e-05,2e-05,2e-05,32768,131584,263168,\n"
    "relu1,Relu,1e-06,1e-06,0,32768,0,0,fc1\n"
    "fc2,Gemm,2e-05,2e-05,2e-05,32768,65792,131584,relu1\n"
    "add,Add,1e-06,1e-06,0,32768,0,0,fc2;relu1\n"
    "relu2,Relu,1e-06,1e-06,0,32768,0,0,add\n"
    "fc3,Gemm,1e-05,1e-05,1e-05,1280,2570,5140,relu2\n"
    "loss,SoftmaxCrossEntropyLoss,1e-06,1e-06,0,4,0,0,fc3\n";

/// The largest cluster fuzz_cluster partitions (see LLVMFuzzerTestOneInput).
[[maybe_unused]] constexpr int64_t kMaxFuzzedDevices = 256;

int runPartition(std::vector<std::string> args) {
  // args: "partition", "--costs", FILE, then flag/value pairs
  pipec::partition::PartitionCliOptions options;
  options.costsFile = args.at(2);
  for (size_t i = 3; i + 1 < args.size(); i += 2)
    pipec::partition::applyPartitionFlag(options, args[i], args[i + 1]);
  pipec::fuzz::QuietStreams quiet;
  return pipec::partition::runPartitionCommand(options, std::cout, std::cerr);
}
} // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
#if PIPEC_FUZZ_MODE == 1
  const std::string costs = pipec::fuzz::writeInput("costs.csv", data, size);
  runPartition({"partition", "--costs", costs, "--gpus", "2x2", "--microbatches", "4"});
#else
  static const std::string costs = pipec::fuzz::writeInput("costs.csv", kCostTable);
#if PIPEC_FUZZ_MODE == 2
  const std::string cluster = pipec::fuzz::writeInput("cluster.json", data, size);
  // The partition's time grows with the device count: a valid cluster of
  // 2,251 devices takes 31 s in this -O0 sanitizer build (0.12 s in a
  // release build), over the 10 s a fuzz input may take. Larger clusters
  // are parsed here (the reader is what this target fuzzes) but not
  // partitioned; bench/partition measures the partition at scale.
  try {
    if (pipec::partition::readClusterJsonFile(cluster).totalDevices() > kMaxFuzzedDevices)
      return 0;
  } catch (const std::exception &) {
    // Invalid: runPartition reports it, as pipec would.
  }
  runPartition({"partition", "--costs", costs, "--cluster", cluster, "--microbatches", "4"});
#elif PIPEC_FUZZ_MODE == 3
  const std::string stages = pipec::fuzz::writeInput("partition.json", data, size);
  runPartition({"partition", "--costs", costs, "--gpus", "1x4", "--microbatches", "4", "--partition", stages});
#else
#error "unknown PIPEC_FUZZ_MODE"
#endif
#endif
  return 0;
}
