// Lowers one pipe.stage (docs/stages.md) to C++ implementing the stage ABI
// (runtime/include/pipec/stage_abi.h) with calls into the CPU kernels
// (runtime/kernels/include/pipec/cpu_kernels.h): one kernel call per op.
#ifndef PIPEC_COMPILER_EMIT_EMITCPU_H
#define PIPEC_COMPILER_EMIT_EMITCPU_H

#include "llvm/Support/LogicalResult.h"

namespace llvm {
class raw_ostream;
}
namespace pipec::pipe {
class StageOp;
}

namespace pipec::emit {

/// Writes the C++ source of libstage_<k>.so for `stage`; `numStages` is the
/// pipeline depth recorded in the descriptor. Errors (an op without a CPU
/// lowering) are emitted on the op.
llvm::LogicalResult emitCpuStage(pipe::StageOp stage, int numStages, llvm::raw_ostream &os);

} // namespace pipec::emit

#endif // PIPEC_COMPILER_EMIT_EMITCPU_H
