// The words the compiler and the runtime share (docs/layers.md): the
// instruction set of rank streams, where a virtual stage lives, the output
// size of a sliding window, the element-wise functions and the optimizer's
// defaults. Dtype codes are the stage ABI's (stage_abi.h).
//
// Plain C++17, header-only and dependency-free: the runtime builds alone with
// it, and the compiler's libraries include this file instead of keeping copies.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace pipec {

// ---------------------------------------------------------------- choices
// A setting with a fixed set of values has one enum and one table of
// spellings, in enum order (Choices<E>::spellings). Command lines, IR
// attributes and job files all use these spellings; an unknown spelling is an
// error where it is read, never a silent default (docs/settings.md).
template <class E> struct Choices; // specialized below, once per enum

template <class E> constexpr int choiceCount() {
  return int(sizeof(Choices<E>::spellings) / sizeof(Choices<E>::spellings[0]));
}
template <class E> const char *choiceName(E value) { return Choices<E>::spellings[int(value)]; }
template <class E> bool parseChoice(std::string_view text, E &value) {
  for (int i = 0; i < choiceCount<E>(); ++i)
    if (text == Choices<E>::spellings[i]) {
      value = E(i);
      return true;
    }
  return false;
}
// "a, b, c", or "a, b or c" with last = " or ": for help and error messages.
template <class E> std::string choiceNames(std::string_view last = ", ") {
  std::string out;
  for (int i = 0; i < choiceCount<E>(); ++i)
    out += std::string(i == 0 ? "" : i + 1 == choiceCount<E>() ? last : ", ") + Choices<E>::spellings[i];
  return out;
}

// ---------------------------------------------------------------- CUDA architectures
// An architecture as pipec's --cuda-arch and piperun's runtime.cuda_arch
// accept it (one grammar for both): "sm_", two or three digits, at most one
// lowercase letter ("sm_80", "sm_90a", "sm_100f"): the names nvcc's
// -gencode takes (compute_90a / sm_90a).
inline bool isCudaArchitecture(std::string_view name) {
  if (name.substr(0, 3) != "sm_")
    return false;
  size_t digits = 0;
  while (3 + digits < name.size() && name[3 + digits] >= '0' && name[3 + digits] <= '9')
    ++digits;
  const std::string_view suffix = name.substr(3 + digits);
  return digits >= 2 && digits <= 3 && (suffix.empty() || (suffix.size() == 1 && suffix[0] >= 'a' && suffix[0] <= 'z'));
}
inline constexpr const char *kCudaArchitectureExamples = "sm_80, sm_90 or sm_90a";

// ---------------------------------------------------------------- instructions
// One instruction of a rank's stream (docs/schedule-files.md).
enum class Op : unsigned char {
  Load,      // LOAD(mb): read the micro-batch's inputs (first virtual stage)
  Fwd,       // FWD(mb, chunk)
  Bwd,       // BWD(mb, chunk): input and weight gradients together
  BwdInput,  // BWD_INPUT(mb, chunk): "B" of the zero-bubble paper
  BwdWeight, // BWD_WEIGHT(mb, chunk): "W" of the zero-bubble paper
  Recompute, // RECOMPUTE(mb, chunk): re-run the forward before a backward
  SendAct, RecvAct, SendGrad, RecvGrad, // (mb, chunk, peer rank[, version])
  Stash,     // STASH(mb[, version]): keep a weight version for this micro-batch
  Restore,   // RESTORE(mb[, version]): compute the micro-batch with its kept version
  AllReduce, // ALLREDUCE(stage): gradients over the replicas of a stage
  Step,      // STEP: optimizer update
  SpecStep,  // SPEC_STEP: speculative update, pre-step weights kept (ZB-H2)
  Validate,  // VALIDATE: global all-reduce of grad norm / non-finite flags
  Rollback,  // ROLLBACK: if VALIDATE failed, restore and redo the step
};

// The spelling of each instruction in schedule files, in enum order.
template <> struct Choices<Op> {
  static constexpr const char *spellings[] = {
      "LOAD",      "FWD",       "BWD",       "BWD_INPUT", "BWD_WEIGHT", "RECOMPUTE",
      "SEND_ACT",  "RECV_ACT",  "SEND_GRAD", "RECV_GRAD", "STASH",      "RESTORE",
      "ALLREDUCE", "STEP",      "SPEC_STEP", "VALIDATE",  "ROLLBACK",
  };
};
static_assert(choiceCount<Op>() == int(Op::Rollback) + 1, "every instruction has one spelling");

inline bool isCompute(Op op) {
  return op == Op::Fwd || op == Op::Bwd || op == Op::BwdInput || op == Op::BwdWeight ||
         op == Op::Recompute;
}
inline bool isP2P(Op op) {
  return op == Op::SendAct || op == Op::RecvAct || op == Op::SendGrad || op == Op::RecvGrad;
}
inline bool isCollective(Op op) { return op == Op::AllReduce || op == Op::Validate; }

struct Instr {
  Op op = Op::Step;
  int mb = -1;    // micro-batch (global index); -1 where not applicable
  int chunk = -1; // model chunk on this rank; -1 where not applicable
  int peer = -1;  // peer rank (Send/Recv) or stage (AllReduce)
  // 1F1B-RR with vertical sync: the weight version (micro-batches applied)
  // that STASH pins, RESTORE selects and SEND_ACT/RECV_ACT carry; else -1.
  int version = -1;
  // FWD only: runs as one paired compute with the backward right after it in
  // the stream (DualPipeV's F&B, docs/schedules.md): both inputs are in before
  // it starts, and both results are sent after it ends.
  bool paired = false;
  bool operator==(const Instr &o) const {
    return op == o.op && mb == o.mb && chunk == o.chunk && peer == o.peer && version == o.version &&
           paired == o.paired;
  }
};

// The backward an F&B pair runs with: for the paired FWD at `i` of a stream,
// the BWD or BWD_INPUT (input gradient, with or without the weight
// gradient) right after it; nullptr when `stream[i]` is no paired FWD
// followed by one (a malformed pair where it is marked paired).
inline const Instr *pairedBackward(const std::vector<Instr> &stream, size_t i) {
  if (!stream[i].paired || stream[i].op != Op::Fwd || i + 1 >= stream.size())
    return nullptr;
  const Instr &next = stream[i + 1];
  return next.op == Op::Bwd || next.op == Op::BwdInput ? &next : nullptr;
}

// "FWD mb=3 chunk=0": how logs, traces and errors show an instruction.
inline std::string toString(const Instr &in) {
  std::string s = choiceName(in.op);
  if (in.mb >= 0) s += " mb=" + std::to_string(in.mb);
  if (in.chunk >= 0) s += " chunk=" + std::to_string(in.chunk);
  if (in.peer >= 0) s += (in.op == Op::AllReduce ? " stage=" : " peer=") + std::to_string(in.peer);
  if (in.version >= 0) s += " version=" + std::to_string(in.version);
  if (in.paired) s += " paired";
  return s;
}

// The stage code target: C++ on the CPU kernels, or CUDA C++ on the CUDA kernels.
enum class Target : unsigned char { Cpu, Cuda };
template <> struct Choices<Target> {
  static constexpr const char *spellings[] = {"cpu", "cuda"};
};

// How GPU ranks that share a GPU move bundles (piperun's environment
// variable PIPEC_SAME_GPU_TRANSPORT; docs/runtime.md, "Ranks sharing a
// GPU"): CUDA IPC where the machine allows it, IPC or a start-up error,
// or always through pinned host memory over MPI.
enum class SameGpuTransport : unsigned char { Auto, Ipc, Staged };
template <> struct Choices<SameGpuTransport> {
  static constexpr const char *spellings[] = {"auto", "ipc", "staged"};
};

// What a data field of a job is to the model: an input, or the labels of
// its loss (plan.json's runtime.data.fields[].role; token files need it).
enum class DataRole : unsigned char { Input, Label };
template <> struct Choices<DataRole> {
  static constexpr const char *spellings[] = {"input", "label"};
};

// The element type of a token file's ids (piperun --data-dtype).
enum class TokenDtype : unsigned char { Uint16, Uint32 };
template <> struct Choices<TokenDtype> {
  static constexpr const char *spellings[] = {"uint16", "uint32"};
};

// The precision of matrix products (storage and master weights stay float32).
enum class Precision : unsigned char { F32, TF32, BF16 };
template <> struct Choices<Precision> {
  static constexpr const char *spellings[] = {"fp32", "tf32", "bf16"};
};

// The optimizer: AdamW, or SGD with or without momentum (sgd-momentum is SGD
// whose momentum defaults to OptimizerDefaults::sgdMomentum).
enum class Optimizer : unsigned char { AdamW, SgdMomentum, Sgd };
template <> struct Choices<Optimizer> {
  static constexpr const char *spellings[] = {"adamw", "sgd-momentum", "sgd"};
};
// The update rule a stage library runs: AdamW's or SGD's.
inline bool usesAdam(Optimizer o) { return o == Optimizer::AdamW; }
// Optimizer state per parameter element, in parameter sizes: moment and
// variance, a momentum buffer, or none.
inline int optimizerStateCopies(Optimizer o) {
  return o == Optimizer::AdamW ? 2 : o == Optimizer::SgdMomentum ? 1 : 0;
}

// The schedule families (analysis/Schedule/Families.cpp holds each one's facts).
// Csv: the order of a user's schedule file (--schedule-file, PyTorch's CSV format).
enum class ScheduleKind : unsigned char { GPipe, OneFOneB, OneFOneBRR, Interleaved, ZbH1, ZbH2, ZbV, ZbInterleaved, DualPipeV, Csv, Auto };
template <> struct Choices<ScheduleKind> {
  static constexpr const char *spellings[] = {"gpipe", "1f1b",  "1f1b-rr", "interleaved",    "zb-h1",
                                              "zb-h2", "zb-v",  "zb-interleaved", "dualpipev", "csv", "auto"};
};

// Where virtual stage k (0 .. p*v-1, in model order) lives.
enum class Placement : unsigned char {
  Interleaved, // vs = chunk * p + stage (Megatron; v = 1 is the plain pipeline)
  VShape,      // v = 2: chunk 0 down the ranks, chunk 1 back up (ZB-V)
};
template <> struct Choices<Placement> {
  static constexpr const char *spellings[] = {"interleaved", "v"};
};

// Which stages keep only their inputs and recompute activations in the
// backward: none, every stage, or only those that would not fit otherwise.
enum class RecomputeMode : unsigned char { None, All, Auto };
template <> struct Choices<RecomputeMode> {
  static constexpr const char *spellings[] = {"none", "all", "auto"};
};

// The loss appended to a model: its own scalar loss when it returns one and
// softmax cross-entropy otherwise (auto), or the one named.
enum class Loss : unsigned char { Auto, SoftmaxCrossEntropy, Mse };
template <> struct Choices<Loss> {
  static constexpr const char *spellings[] = {"auto", "softmax-cross-entropy", "mse"};
};

static_assert(choiceCount<Target>() == int(Target::Cuda) + 1 &&
                  choiceCount<Precision>() == int(Precision::BF16) + 1 &&
                  choiceCount<Optimizer>() == int(Optimizer::Sgd) + 1 &&
                  choiceCount<ScheduleKind>() == int(ScheduleKind::Auto) + 1 &&
                  choiceCount<Placement>() == int(Placement::VShape) + 1 &&
                  choiceCount<RecomputeMode>() == int(RecomputeMode::Auto) + 1 &&
                  choiceCount<Loss>() == int(Loss::Mse) + 1,
              "every enumerator of a choice has one spelling");

// The virtual stage that pipeline stage `stage` (of `stages`) runs as chunk `chunk`.
inline int virtualStage(Placement p, int stages, int stage, int chunk) {
  if (p == Placement::VShape) return chunk == 0 ? stage : 2 * stages - 1 - stage;
  return chunk * stages + stage;
}

// The inverse of virtualStage.
inline void locateVirtualStage(Placement p, int stages, int vs, int &stage, int &chunk) {
  if (p == Placement::VShape) {
    chunk = vs < stages ? 0 : 1;
    stage = vs < stages ? vs : 2 * stages - 1 - vs;
    return;
  }
  chunk = vs / stages;
  stage = vs % stages;
}

// ---------------------------------------------------------------- windows
// Output length of a sliding window along one axis, as ONNX's Conv, MaxPool
// and AveragePool define it: floor or ceil of (input + pads - effective
// kernel) / stride, plus one; in ceil mode a last window that would start in
// the end padding is dropped. 0 when the window does not fit.
inline int64_t windowOutputSize(int64_t input, int64_t kernel, int64_t stride, int64_t padBegin,
                                int64_t padEnd, int64_t dilation, bool ceilMode) {
  const int64_t effectiveKernel = (kernel - 1) * dilation + 1;
  const int64_t span = input + padBegin + padEnd - effectiveKernel;
  if (span < 0) return 0;
  int64_t size = ceilMode ? (span + stride - 1) / stride + 1 : span / stride + 1;
  if (ceilMode && (size - 1) * stride >= input + padBegin) --size;
  return size;
}

// ---------------------------------------------------------------- element-wise functions
// The element-wise unary functions: the one list that the nn dialect (the ops'
// getUnaryFunction and nn.unary_grad's kind), the cost model, the reference
// evaluator, the emitters and the CPU/CUDA kernels read (docs/adding-an-op.md).
// Columns: enumerator, spelling in the IR, the forward value the derivative
// reads (Input: x, Result: y), forward and derivative FLOPs per element.
#define PIPEC_UNARY_FUNCTIONS(X)                                                                   \
  X(Relu, "relu", Result, 1, 1)                                                                    \
  X(Relu6, "relu6", Result, 2, 2)         /* ONNX Clip(x, 0, 6); gradient where 0 < y < 6 */      \
  X(Tanh, "tanh", Result, 8, 3)                                                                    \
  X(Sigmoid, "sigmoid", Result, 8, 3)                                                              \
  X(Erf, "erf", Input, 8, 10)                                                                      \
  X(Sqrt, "sqrt", Result, 4, 2)                                                                    \
  X(Gelu, "gelu", Input, 16, 20)          /* ONNX Gelu, approximate = "none" */                    \
  X(GeluTanh, "gelu_tanh", Input, 16, 20) /* ONNX Gelu, approximate = "tanh" */                   \
  X(Neg, "neg", Result, 1, 1)             /* -dy reads neither value; y is the one named */      \
  X(Reciprocal, "reciprocal", Result, 4, 2)                                                        \
  X(Abs, "abs", Input, 1, 1)              /* gradient sign(x) dy, 0 at 0 as PyTorch */             \
  X(Exp, "exp", Result, 8, 1)                                                                      \
  X(Log, "log", Input, 8, 4)                                                                       \
  X(Sin, "sin", Input, 8, 9)                                                                       \
  X(Cos, "cos", Input, 8, 9)                                                                       \
  X(Softplus, "softplus", Input, 16, 10)  /* max(x, 0) + log1p(exp(-|x|)): no overflow */          \
  X(Softsign, "softsign", Input, 4, 4)                                                             \
  X(Floor, "floor", Result, 1, 0)         /* zero gradient, as PyTorch */                          \
  X(Ceil, "ceil", Result, 1, 0)                                                                    \
  X(Round, "round", Result, 1, 0)         /* halves to even, as ONNX */                            \
  X(Sign, "sign", Result, 1, 0)           /* zero gradient, as PyTorch */                          \
  X(Tan, "tan", Result, 8, 3)             /* 1 + y^2 */                                            \
  X(Atan, "atan", Input, 8, 4)                                                                     \
  X(Asin, "asin", Input, 8, 6)                                                                     \
  X(Acos, "acos", Input, 8, 6)                                                                     \
  X(Sinh, "sinh", Input, 8, 8)                                                                     \
  X(Cosh, "cosh", Input, 8, 8)                                                                     \
  X(Asinh, "asinh", Input, 8, 6)                                                                   \
  X(Acosh, "acosh", Input, 8, 6)                                                                   \
  X(Atanh, "atanh", Input, 8, 4)

enum class Unary : unsigned char {
#define PIPEC_ENUMERATOR(name, spelling, reads, flops, derivativeFlops) name,
  PIPEC_UNARY_FUNCTIONS(PIPEC_ENUMERATOR)
#undef PIPEC_ENUMERATOR
};

/// Which forward value a derivative reads.
enum class ForwardValue : unsigned char { Input, Result };

struct UnaryFunction {
  const char *enumerator; // the C++ name, as generated code spells it (pk::Unary::<enumerator>)
  const char *spelling;   // the IR's and plan files' name
  ForwardValue derivativeReads;
  double flops, derivativeFlops; // per element, for the cost model
};

inline constexpr UnaryFunction kUnaryFunctions[] = {
#define PIPEC_ROW(name, spelling, reads, flops, derivativeFlops)                                   \
  {#name, spelling, ForwardValue::reads, flops, derivativeFlops},
    PIPEC_UNARY_FUNCTIONS(PIPEC_ROW)
#undef PIPEC_ROW
};
inline constexpr int kNumUnaryFunctions = int(sizeof(kUnaryFunctions) / sizeof(kUnaryFunctions[0]));

inline const UnaryFunction &unaryFunction(Unary u) { return kUnaryFunctions[int(u)]; }
/// Whether u's derivative reads the forward input x (else the result y).
inline constexpr bool derivativeReadsInput(Unary u) {
  return kUnaryFunctions[int(u)].derivativeReads == ForwardValue::Input;
}
/// Whether the CUDA kernels' GEMMs apply u inside cuBLASLt (its epilogues:
/// ReLU, and its GELU, the tanh form); any other activation is a pass of
/// its own after the GEMM (docs/optimization.md, "GEMM epilogues").
inline constexpr bool cudaGemmEpilogueApplies(Unary u) { return u == Unary::Relu || u == Unary::GeluTanh; }
/// Whether a batch norm's kernels (both libraries) and the CUDA
/// convolutions apply u as their epilogue's activation: ReLU and ReLU6
/// (docs/optimization.md, "Batch-norm epilogues", "Convolution epilogues").
inline constexpr bool epilogueActivationApplies(Unary u) { return u == Unary::Relu || u == Unary::Relu6; }
inline const char *unaryName(Unary u) { return unaryFunction(u).spelling; }
inline bool parseUnary(std::string_view text, Unary &u) {
  for (int i = 0; i < kNumUnaryFunctions; ++i)
    if (text == kUnaryFunctions[i].spelling) return u = Unary(i), true;
  return false;
}

// The element-wise binary functions with numpy broadcasting: the one list
// that the nn dialect (NN_BinaryElementwiseOp's getBinaryFunction, result
// type and cost), the reference evaluator, the emitters, the fusion pass and
// the CPU/CUDA kernels read (docs/adding-an-op.md). Columns: enumerator,
// spelling in the IR (the op's mnemonic), the result's element type (Same:
// the operands'; Bool: i1), the operands' (Numeric: float or integer; Bool:
// i1), forward and gradient FLOPs per element.
#define PIPEC_BINARY_FUNCTIONS(X)                                                                  \
  X(Add, "add", Same, Numeric, 1, 1)                                                               \
  X(Sub, "sub", Same, Numeric, 1, 1)                                                               \
  X(Mul, "mul", Same, Numeric, 1, 2)                                                               \
  X(Div, "div", Same, Numeric, 1, 4)                                                               \
  X(Pow, "pow", Same, Numeric, 8, 10)                                                              \
  X(Max, "max", Same, Numeric, 1, 2)                                                               \
  X(Min, "min", Same, Numeric, 1, 2)                                                               \
  X(Mod, "mod", Same, Numeric, 4, 0)   /* ONNX Mod fmod = 0: the sign of the divisor */            \
  X(FMod, "fmod", Same, Numeric, 4, 0) /* ONNX Mod fmod = 1: C's fmod, the dividend's sign */      \
  X(Equal, "equal", Bool, Numeric, 1, 0)                                                           \
  X(Less, "less", Bool, Numeric, 1, 0)                                                             \
  X(LessOrEqual, "less_or_equal", Bool, Numeric, 1, 0)                                             \
  X(Greater, "greater", Bool, Numeric, 1, 0)                                                       \
  X(GreaterOrEqual, "greater_or_equal", Bool, Numeric, 1, 0)                                       \
  X(And, "and", Bool, Bool, 1, 0)                                                                  \
  X(Or, "or", Bool, Bool, 1, 0)                                                                    \
  X(Xor, "xor", Bool, Bool, 1, 0)

enum class Binary : unsigned char {
#define PIPEC_ENUMERATOR(name, spelling, result, operands, flops, gradientFlops) name,
  PIPEC_BINARY_FUNCTIONS(PIPEC_ENUMERATOR)
#undef PIPEC_ENUMERATOR
};

/// The element types a binary function takes or gives.
enum class BinaryResult : unsigned char { Same, Bool };
enum class BinaryOperands : unsigned char { Numeric, Bool };

struct BinaryFunction {
  const char *enumerator; // pk::Binary::<enumerator> in generated code
  const char *spelling;   // the IR's op name (nn.<spelling>) and plan files' name
  BinaryResult result;
  BinaryOperands operands;
  double flops, gradientFlops; // per element, for the cost model
};

inline constexpr BinaryFunction kBinaryFunctions[] = {
#define PIPEC_ROW(name, spelling, result, operands, flops, gradientFlops)                          \
  {#name, spelling, BinaryResult::result, BinaryOperands::operands, flops, gradientFlops},
    PIPEC_BINARY_FUNCTIONS(PIPEC_ROW)
#undef PIPEC_ROW
};
inline constexpr int kNumBinaryFunctions = int(sizeof(kBinaryFunctions) / sizeof(kBinaryFunctions[0]));

inline constexpr const BinaryFunction &binaryFunction(Binary b) { return kBinaryFunctions[int(b)]; }
/// Whether b gives a bool (a comparison or a logical function).
inline constexpr bool givesBool(Binary b) { return binaryFunction(b).result == BinaryResult::Bool; }
/// Whether b takes bool operands (a logical function).
inline constexpr bool takesBool(Binary b) { return binaryFunction(b).operands == BinaryOperands::Bool; }
inline const char *binaryName(Binary b) { return binaryFunction(b).spelling; }
inline bool parseBinary(std::string_view text, Binary &b) {
  for (int i = 0; i < kNumBinaryFunctions; ++i)
    if (text == kBinaryFunctions[i].spelling) return b = Binary(i), true;
  return false;
}

// The gradient of one operand of an element-wise binary op that is not itself
// an element-wise op (nn.binary_grad's kind); the others (add, mul, the
// numerator of div) are built from nn ops. Columns: enumerator, spelling.
#define PIPEC_BINARY_GRADIENTS(X)                                                                  \
  X(SubRhs, "sub_rhs") /* -dy */                                                                   \
  X(DivRhs, "div_rhs") /* -dy * lhs / rhs^2 */                                                     \
  X(PowLhs, "pow_lhs") /* dy * rhs * lhs^(rhs - 1) */                                              \
  X(PowRhs, "pow_rhs") /* dy * lhs^rhs * ln(lhs) */                                               \
  X(MaxLhs, "max_lhs") /* dy where lhs > rhs, dy / 2 where equal (PyTorch's maximum) */            \
  X(MaxRhs, "max_rhs")                                                                             \
  X(MinLhs, "min_lhs") /* dy where lhs < rhs, dy / 2 where equal (PyTorch's minimum) */            \
  X(MinRhs, "min_rhs")

enum class BinaryGradient : unsigned char {
#define PIPEC_ENUMERATOR(name, spelling) name,
  PIPEC_BINARY_GRADIENTS(PIPEC_ENUMERATOR)
#undef PIPEC_ENUMERATOR
};

struct BinaryGradientKind {
  const char *enumerator; // pk::BinaryGrad::<enumerator> in generated code
  const char *spelling;
};
inline constexpr BinaryGradientKind kBinaryGradients[] = {
#define PIPEC_ROW(name, spelling) {#name, spelling},
    PIPEC_BINARY_GRADIENTS(PIPEC_ROW)
#undef PIPEC_ROW
};
inline constexpr int kNumBinaryGradients = int(sizeof(kBinaryGradients) / sizeof(kBinaryGradients[0]));

inline const BinaryGradientKind &binaryGradientKind(BinaryGradient g) { return kBinaryGradients[int(g)]; }
inline const char *binaryGradientName(BinaryGradient g) { return binaryGradientKind(g).spelling; }
inline bool parseBinaryGradient(std::string_view text, BinaryGradient &g) {
  for (int i = 0; i < kNumBinaryGradients; ++i)
    if (text == kBinaryGradients[i].spelling) return g = BinaryGradient(i), true;
  return false;
}

/// "relu, tanh, ..." or "sub_rhs, ...": the accepted spellings, for messages.
template <typename Row, int N> std::string spellingList(const Row (&rows)[N]) {
  std::string list;
  for (const Row &row : rows) list += (list.empty() ? "" : ", ") + std::string(row.spelling);
  return list;
}

// ---------------------------------------------------------------- optimizer
// Defaults of the optimizer options (pipec's --optimizer flags, the
// pipec-optimizer pass and plan.json's runtime.optimizer).
// Weight decay and momentum follow PyTorch's AdamW and SGD.
struct OptimizerDefaults {
  static constexpr double beta1 = 0.9;
  static constexpr double beta2 = 0.999;
  static constexpr double epsilon = 1e-8;
  static constexpr double adamwWeightDecay = 0.01;
  static constexpr double sgdWeightDecay = 0.0;
  static constexpr double sgdMomentum = 0.9; // what --optimizer sgd-momentum means without --momentum
  static double weightDecay(bool adamw) { return adamw ? adamwWeightDecay : sgdWeightDecay; }
};

// ---------------------------------------------------------------- libraries
// The oldest cuDNN (cudnnGetVersion: major·10000 + minor·100 + patch) whose
// graph API has what the CUDA kernels' flash attention uses; piperun names
// an older one as unused (docs/cuda-kernels.md, "Flash attention").
constexpr int64_t kMinimumCudnnVersion = 90000;

} // namespace pipec
