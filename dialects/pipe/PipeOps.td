#ifndef PIPEC_PIPE_OPS_TD
#define PIPEC_PIPE_OPS_TD

include "dialects/pipe/PipeBase.td"
include "dialects/pipe/PipeAttrs.td"
include "mlir/IR/SymbolInterfaces.td"
include "mlir/IR/RegionKindInterface.td"
include "mlir/Interfaces/SideEffectInterfaces.td"
include "mlir/Interfaces/ControlFlowInterfaces.td"
include "mlir/Interfaces/InferTypeOpInterface.td"

def Pipe_StageOp : Pipe_Op<"stage", [IsolatedFromAbove, SymbolTable,
    SingleBlock, NoTerminator, Symbol]> {
  let summary = "One pipeline stage: its entry points and where it runs";
  let description = [{
    Holds the functions of one stage (`fwd`, `bwd_input`, `bwd_weight`,
    `step`, and per-chunk variants for virtual stages). `id` is the stage's
    position in the pipeline, `replicas` its data-parallel width and `ranks`
    (when assigned) the global ranks that run it, one per replica.
  }];
  let arguments = (ins SymbolNameAttr:$sym_name, I64Attr:$id,
                       DefaultValuedAttr<I64Attr, "1">:$replicas,
                       OptionalAttr<DenseI64ArrayAttr>:$ranks);
  let regions = (region SizedRegion<1>:$body);
  let assemblyFormat = "$sym_name attr-dict-with-keyword $body";
  let hasVerifier = 1;
}

def Pipe_SendOp : Pipe_Op<"send"> {
  let summary = "Send a tensor to another stage (matched with pipe.recv by tag)";
  let description = [{
    `peer` is the receiving stage (a neighbour: bundles travel only between
    adjacent stages) and `tag` identifies the tensor; the same tag is used
    on every hop of a tensor that is forwarded through several stages.
    `name` is a stable tensor name for the stage ABI's descriptors.
  }];
  let arguments = (ins AnyRankedTensor:$value, I64Attr:$peer, I64Attr:$tag,
                       OptionalAttr<StrAttr>:$name);
  let assemblyFormat = "$value `to` $peer `tag` $tag attr-dict `:` type($value)";
  let hasVerifier = 1;
}

def Pipe_RecvOp : Pipe_Op<"recv"> {
  let summary = "Receive a tensor from another stage (matched with pipe.send by tag)";
  let arguments = (ins I64Attr:$peer, I64Attr:$tag, OptionalAttr<StrAttr>:$name);
  let results = (outs AnyStaticShapeTensor:$result);
  let assemblyFormat = "`from` $peer `tag` $tag attr-dict `:` type($result)";
  let hasVerifier = 1;
}

def Pipe_AllReduceOp : Pipe_Op<"allreduce", [SameOperandsAndResultType]> {
  let summary = "Sum (or average) a gradient over the replicas of a stage";
  let description = [{
    Without `stages`: reduces over the replicas of the enclosing stage (the
    data-parallel group). With `stages` (sorted, at least two, including the
    enclosing stage): reduces over every copy of the tied parameter `name`
    held by those stages (all their replicas); each of them then applies the
    same update to its own copy, so the copies stay equal.
  }];
  let arguments = (ins AnyStaticShapeTensor:$value,
                       DefaultValuedStrAttr<StrAttr, "mean">:$reduction,
                       OptionalAttr<StrAttr>:$name,
                       OptionalAttr<DenseI64ArrayAttr>:$stages);
  let results = (outs AnyStaticShapeTensor:$result);
  let assemblyFormat = "$value attr-dict `:` type($value)";
  let hasVerifier = 1;
}

def Pipe_StashOp : Pipe_Op<"stash"> {
  let summary = "Keep the weight version a micro-batch's forward used";
  let description = [{
    Asynchronous schedules (PipeDream 1F1B-RR) update weights while older
    micro-batches are still in flight; the backward of a micro-batch must use
    the weights its forward used. `slots` is the number of versions kept (the
    in-flight count of the plan); `name` identifies the weight. With
    `vertical_sync`, the version kept (and used by the forward of later
    stages) is the one that was current when the micro-batch entered stage 0
    (PipeDream's vertical sync); docs/stages.md describes the runtime side.
  }];
  let arguments = (ins AnyStaticShapeTensor:$weight, Index:$microbatch,
                       StrAttr:$name, I64Attr:$slots, UnitAttr:$vertical_sync);
  let assemblyFormat = "$weight `for` $microbatch attr-dict `:` type($weight)";
  let hasVerifier = 1;
}

def Pipe_RestoreOp : Pipe_Op<"restore"> {
  let summary = "Fetch the weight version stashed for a micro-batch";
  let arguments = (ins Index:$microbatch, StrAttr:$name, I64Attr:$slots,
                       UnitAttr:$vertical_sync);
  let results = (outs AnyStaticShapeTensor:$result);
  let assemblyFormat = "$microbatch attr-dict `:` type($result)";
  let hasVerifier = 1;
}

def Pipe_RecomputeOp : Pipe_Op<"recompute", [SingleBlockImplicitTerminator<"YieldOp">,
    RecursiveMemoryEffects]> {
  let summary = "Re-materialize activations before the backward (GPipe)";
  let description = [{
    The body re-runs forward ops from the stage-boundary activations it takes
    as operands; its results replace the activations that were not kept.
  }];
  let arguments = (ins Variadic<AnyType>:$inputs);
  let results = (outs Variadic<AnyType>:$results);
  let regions = (region SizedRegion<1>:$body);
  let assemblyFormat = "`(` $inputs `)` attr-dict-with-keyword `:` functional-type($inputs, $results) $body";
  let hasVerifier = 1;
}

def Pipe_FusedOp : Pipe_Op<"fused", [SingleBlockImplicitTerminator<"YieldOp">,
    RecursiveMemoryEffects]> {
  let summary = "Element-wise ops computed in one loop (pipec-fuse-elementwise)";
  let description = [{
    The body holds element-wise nn ops whose results all have the shape of
    the first result (the loop's iteration space); operands broadcast to it.
    Code generation emits one loop (CPU) or one kernel (CUDA) that computes
    every body op per element and stores only the yielded values, which are
    the values used outside the body (docs/optimization.md).
  }];
  let arguments = (ins Variadic<AnyRankedTensor>:$inputs);
  let results = (outs Variadic<AnyRankedTensor>:$results);
  let regions = (region SizedRegion<1>:$body);
  let assemblyFormat = "`(` $inputs `)` attr-dict-with-keyword `:` functional-type($inputs, $results) $body";
  let hasVerifier = 1;
}

def Pipe_YieldOp : Pipe_Op<"yield", [Pure, Terminator, ReturnLike,
    ParentOneOf<["RecomputeOp", "FusedOp"]>]> {
  let summary = "Terminates a pipe.recompute or pipe.fused body";
  let arguments = (ins Variadic<AnyType>:$values);
  let assemblyFormat = "attr-dict ($values^ `:` type($values))?";
  let builders = [OpBuilder<(ins), [{ build($_builder, $_state, mlir::ValueRange()); }]>];
}

#endif // PIPEC_PIPE_OPS_TD
