// Lowers one pipe.stage (docs/stages.md) to the source of a stage library
// implementing the stage ABI (runtime/include/pipec/stage_abi.h): C++ calling
// the CPU kernels (runtime/kernels/include/pipec/cpu_kernels.h), or CUDA C++
// calling the CUDA kernels (runtime/kernels/cuda/include/pipec/cuda_kernels.h,
// same API on device memory). One kernel call per op either way
// (docs/codegen.md, docs/cuda-codegen.md).
#ifndef PIPEC_COMPILER_EMIT_EMITSTAGE_H
#define PIPEC_COMPILER_EMIT_EMITSTAGE_H

#include "llvm/ADT/StringRef.h"
#include "llvm/Support/LogicalResult.h"

#include <string>

namespace llvm {
class raw_ostream;
}
namespace pipec::pipe {
class StageOp;
}

namespace pipec::emit {

enum class Target { Cpu, Cuda };

struct StageTarget {
  Target target = Target::Cpu;
  /// Matrix-product precision on the CUDA target: "fp32", "tf32" or "bf16"
  /// (storage and master weights stay float32). The CPU target computes fp32.
  std::string precision = "fp32";
};

/// The C, C++ and CUDA string literal, quotes included, whose bytes are
/// exactly `bytes`: printable ASCII other than `"`, `\` and `?` stays as it is,
/// every other byte (newline, control bytes, bytes >= 0x80, and `?`, so that no
/// trigraph can form) becomes a 3-digit octal escape, which never takes in the
/// characters after it as `\x` would. The only way text from a model reaches
/// generated source (docs/security.md). A NUL byte is escaped too, but a
/// string bound for a `const char *` must not contain one (emitStage refuses).
std::string cStringLiteral(llvm::StringRef bytes);

/// Writes the source of libstage_<k>.so for `stage` (stage_<k>.cpp for the
/// CPU, stage_<k>.cu for CUDA); `numStages` is the pipeline depth recorded
/// in the descriptor. Errors (an op without a lowering) are emitted on the op.
llvm::LogicalResult emitStage(pipe::StageOp stage, int numStages, const StageTarget &target,
                              llvm::raw_ostream &os);

} // namespace pipec::emit

#endif // PIPEC_COMPILER_EMIT_EMITSTAGE_H
