#ifndef PIPEC_PIPE_BASE_TD
#define PIPEC_PIPE_BASE_TD

include "mlir/IR/OpBase.td"

def Pipe_Dialect : Dialect {
  let name = "pipe";
  let cppNamespace = "::pipec::pipe";
  let summary = "Pipeline structure: stages, communication, weight stashing, recompute.";
  let description = [{
    The `pipe` dialect describes how the `nn` computation is laid out over a
    pipeline: which ops belong to which stage, the tensors exchanged between
    stages (`pipe.send`/`pipe.recv`, matched by a tag), gradient all-reduce of
    replicated stages, weight versions kept for in-flight micro-batches
    (`pipe.stash`/`pipe.restore`) and re-materialized activations
    (`pipe.recompute`).
  }];
  let useDefaultAttributePrinterParser = 1;
  let hasOperationAttrVerify = 1;
  let hasRegionArgAttrVerify = 1;
  let hasRegionResultAttrVerify = 1;
}

class Pipe_Op<string mnemonic, list<Trait> traits = []>
    : Op<Pipe_Dialect, mnemonic, traits>;

#endif // PIPEC_PIPE_BASE_TD
