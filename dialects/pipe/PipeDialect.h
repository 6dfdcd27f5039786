// The `pipe` dialect: pipeline structure around `nn` computation.
#ifndef PIPEC_DIALECTS_PIPE_PIPEDIALECT_H
#define PIPEC_DIALECTS_PIPE_PIPEDIALECT_H

#include "mlir/Bytecode/BytecodeOpInterface.h"
#include "mlir/IR/BuiltinTypes.h"
#include "mlir/IR/Dialect.h"
#include "mlir/IR/OpDefinition.h"
#include "mlir/IR/RegionKindInterface.h"
#include "mlir/IR/SymbolTable.h"
#include "mlir/Interfaces/ControlFlowInterfaces.h"
#include "mlir/Interfaces/InferTypeOpInterface.h"
#include "mlir/Interfaces/SideEffectInterfaces.h"

#include "dialects/pipe/PipeOpsDialect.h.inc"

#define GET_OP_CLASSES
#include "dialects/pipe/PipeOps.h.inc"

#endif // PIPEC_DIALECTS_PIPE_PIPEDIALECT_H
