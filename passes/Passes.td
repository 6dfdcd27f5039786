#ifndef PIPEC_PASSES_TD
#define PIPEC_PASSES_TD

include "mlir/Pass/PassBase.td"

def EstimateCosts : Pass<"pipec-estimate-costs", "mlir::ModuleOp"> {
  let summary = "Annotate every nn op with its forward, B and W times and memory";
  let description = [{
    Asks each `nn` op for its work (NNCostInterface: FLOPs and bytes of the
    forward and of the gradient with respect to each operand) and turns it
    into times with a roofline model of the chosen device preset:
    time = max(FLOPs / peak, bytes / memory bandwidth) + a launch overhead
    for ops that run a kernel. Matrix products use the peak of the chosen
    precision, other ops the fp32 peak.

    Gradients with respect to operands computed only from parameters are
    weight gradients (W, can be delayed by zero-bubble schedules); gradients
    with respect to other operands that depend on a parameter are input
    gradients (B); operands that depend on no parameter (the model's inputs)
    need no gradient. A parameter's bytes, and its optimizer state, count at
    its first user.

    A measured profile (`profile=FILE`, docs/profile-json.md) replaces the
    estimated times of the ops it names.

    Before:
      %0 = nn.gemm %x, %w, %b {transB = true} : (...) -> tensor<8x64xf32>
    After:
      %0 = nn.gemm %x, %w, %b {pipe.cost = {activation_bytes = 2048 : i64,
             bwd_input = 0.0 : f64, bwd_weight = 4.1e-06 : f64, fwd = 4.1e-06 : f64,
             name = "fc1", optimizer_bytes = 16896 : i64, param_bytes = 8448 : i64,
             source = "estimate"}, transB = true} : (...) -> tensor<8x64xf32>
  }];
  let options = [
    Option<"device", "device", "std::string", /*default=*/"\"H100\"",
           "Device preset (V100, A100, H100)">,
    Option<"precision", "precision", "std::string", /*default=*/"\"fp32\"",
           "Compute precision of matrix products: fp32, tf32 or bf16">,
    Option<"optimizer", "optimizer", "std::string", /*default=*/"\"adamw\"",
           "Optimizer whose state is counted: adamw (2 values per weight), "
           "sgd-momentum (1) or sgd (0)">,
    Option<"profile", "profile", "std::string", /*default=*/"\"\"",
           "Measured profile (JSON) overriding the estimates op by op">,
    Option<"launchOverhead", "launch-overhead", "double", /*default=*/"4.0e-6",
           "Seconds added for each kernel an op runs">,
  ];
  let statistics = [
    Statistic<"numOpsCosted", "ops-costed", "Number of ops annotated">,
    Statistic<"numOpsProfiled", "ops-profiled", "Number of ops whose times came from the profile">,
  ];
}

def AssignStages : Pass<"pipec-partition", "mlir::ModuleOp"> {
  let summary = "Partition the costed graph over a cluster (PipeDream's DP)";
  let description = [{
    Runs PipeDream's hierarchical dynamic program (docs/partition.md) on the
    ops annotated by `pipec-estimate-costs`, in program order, and records
    the result: each op gets `pipe.stage` (its pipeline stage) and the module
    `pipe.stages`, one dictionary per stage with its op range, replicas and
    ranks.

    Before:
      %0 = nn.gemm ... {pipe.cost = {...}}
      %1 = nn.relu %0 {pipe.cost = {...}}
    After (gpus=1x2):
      %0 = nn.gemm ... {pipe.cost = {...}, pipe.stage = 0 : i64}
      %1 = nn.relu %0 {pipe.cost = {...}, pipe.stage = 1 : i64}
  }];
  let options = [
    Option<"gpus", "gpus", "std::string", /*default=*/"\"1x1\"",
           "Topology: N servers x G devices">,
    Option<"device", "device", "std::string", /*default=*/"\"H100\"",
           "Device preset for memory and link bandwidths">,
    Option<"stages", "stages", "int", /*default=*/"0",
           "Force this many stages (0: the DP chooses)">,
    Option<"noReplication", "no-replication", "bool", /*default=*/"false",
           "A straight pipeline without data-parallel stages">,
    Option<"microbatches", "microbatches", "int", /*default=*/"1",
           "Micro-batches per mini-batch">,
    Option<"memoryLimit", "memory-limit", "std::string", /*default=*/"\"\"",
           "Memory per device (e.g. 16GiB); default: the preset's">,
  ];
}

#endif // PIPEC_PASSES_TD
