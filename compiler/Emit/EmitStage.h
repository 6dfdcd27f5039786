// Lowers one pipe.stage (docs/stages.md) to the source of a stage library
// implementing the stage ABI (runtime/include/pipec/stage_abi.h): C++ calling
// the CPU kernels (runtime/kernels/include/pipec/cpu_kernels.h), or CUDA C++
// calling the CUDA kernels (runtime/kernels/cuda/include/pipec/cuda_kernels.h,
// same API on device memory). One kernel call per op either way
// (docs/codegen.md, docs/cuda-codegen.md).
#ifndef PIPEC_COMPILER_EMIT_EMITSTAGE_H
#define PIPEC_COMPILER_EMIT_EMITSTAGE_H

#include "runtime/include/pipec/vocabulary.h"

#include "llvm/ADT/StringRef.h"
#include "llvm/Support/LogicalResult.h"

#include <cstdint>
#include <string>

namespace llvm {
class raw_ostream;
}
namespace pipec::pipe {
class StageOp;
}

namespace pipec::emit {

using ::pipec::Precision;
using ::pipec::Target;

struct StageTarget {
  Target target = Target::Cpu;
  /// Matrix-product precision on the CUDA target (storage and master weights
  /// stay float32). The CPU target computes fp32.
  Precision precision = Precision::F32;
  /// Where constants larger than kInlineConstantElements go: a file beside
  /// the source (this name, found on the assembler's include path) that the
  /// source embeds with `.incbin`, so that a large constant (a causal mask)
  /// never becomes a source literal (docs/optimization.md). Empty: literals.
  std::string constantsFile;
};

/// Constants with at most this many elements stay literals in the source.
inline constexpr int64_t kInlineConstantElements = 64;

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
/// The bytes of target.constantsFile go to `constantBytes` (required when
/// target.constantsFile is set; the caller writes the file).
llvm::LogicalResult emitStage(pipe::StageOp stage, int numStages, const StageTarget &target,
                              llvm::raw_ostream &os, std::string *constantBytes = nullptr);

} // namespace pipec::emit

#endif // PIPEC_COMPILER_EMIT_EMITSTAGE_H
