#ifndef PIPEC_PIPE_ATTRS_TD
#define PIPEC_PIPE_ATTRS_TD

include "dialects/pipe/PipeBase.td"
include "mlir/IR/AttrTypeBase.td"
include "mlir/IR/BuiltinAttributes.td"
include "mlir/IR/EnumAttr.td"

class Pipe_Attr<string name, string attrMnemonic, list<Trait> traits = []>
    : AttrDef<Pipe_Dialect, name, traits> {
  let mnemonic = attrMnemonic;
}

// A double-precision parameter (an APFloat, which attribute storage can
// hash), printed in decimal so that it reads back to the same value.
class Pipe_DoubleParameter<string desc> : APFloatParameter<desc> {
  let parser = [{ [&]() -> ::mlir::FailureOr<::llvm::APFloat> {
    double value;
    if ($_parser.parseFloat(value))
      return ::mlir::failure();
    return ::llvm::APFloat(value);
  }() }];
  let printer = [{ $_printer.getStream() << ::pipec::pipe::formatDouble($_self.convertToDouble()); }];
}

// A choice (pipec/vocabulary.h's Choices<E>): the enum in C++, its spelling
// as a quoted string in the IR, read back through the same table.
class Pipe_ChoiceParameter<string cppType, string desc> : AttrParameter<cppType, desc> {
  let parser = "::pipec::pipe::parseChoiceParameter<" # cppType # ">($_parser)";
  let printer = [{ $_printer << '"' << ::pipec::choiceName($_self) << '"'; }];
}

def Pipe_CostAttr : Pipe_Attr<"Cost", "cost"> {
  let summary = "An op's times and bytes, as the partition reads them";
  let description = [{
    Set on every costed `nn` op by `pipec-estimate-costs` (docs/cost-model.md)
    as `pipe.cost`: its name in the cost table and profiles, the seconds of
    its forward (`fwd`), input gradient (`bwd_input`, B) and weight gradient
    (`bwd_weight`, W), the forward's FLOPs, the bytes of its results
    (`activation_bytes`: what a stage boundary after it would send) and of
    those of them the backward reads (`saved_bytes`: what a micro-batch
    keeps until its backward), of the parameters it reads first and of
    their optimizer state, and where the times came from (`estimate` or
    `profile`).

    Example:
      nn.relu %0 {pipe.cost = #pipe.cost<name = "fc1_relu", fwd = 1.5e-06,
          bwd_input = 2.5e-06, bwd_weight = 0.0, fwd_flops = 512.0,
          activation_bytes = 2048, saved_bytes = 2048, param_bytes = 0,
          optimizer_bytes = 0, source = "estimate">}
  }];
  let parameters = (ins
    StringRefParameter<"name in the cost table">:$name,
    Pipe_DoubleParameter<"forward seconds">:$fwd,
    Pipe_DoubleParameter<"input-gradient seconds (B)">:$bwd_input,
    Pipe_DoubleParameter<"weight-gradient seconds (W)">:$bwd_weight,
    Pipe_DoubleParameter<"forward FLOPs">:$fwd_flops,
    "int64_t":$activation_bytes,
    "int64_t":$saved_bytes,
    "int64_t":$param_bytes,
    "int64_t":$optimizer_bytes,
    StringRefParameter<"estimate or profile">:$source
  );
  let assemblyFormat = "`<` struct(params) `>`";
  let genVerifyDecl = 1;
}

def Pipe_PlanAttr : Pipe_Attr<"Plan", "plan"> {
  let summary = "The planner's choices that the passes after the partition follow";
  let description = [{
    Recorded on the module as `pipe.plan` by `pipec-partition` (with the
    stage ranges in `pipe.stages`): the schedule family, model chunks per
    rank and their placement (`interleaved` or `v`), micro-batches per
    mini-batch, whether updates are asynchronous (1F1B-RR) with `inflight`
    weight versions and vertical sync, and the stages whose activations are
    recomputed. `pipec-recompute mode=auto` and `pipec-weight-stashing
    from-plan=true` read it, so that the pipeline needs no option the
    planner decides (docs/planner.md), and the job writer writes plan.json's
    `pipeline` section from it (its one source in the IR: `pipe.plan_file`
    holds the rest of the file, docs/plan-json.md).

    Example:
      module attributes {pipe.plan = #pipe.plan<schedule = "1f1b", chunks = 1,
          placement = "interleaved", microbatches = 8, asynchronous = false,
          inflight = 4, vertical_sync = false, recompute = array<i64>>}
  }];
  let parameters = (ins
    Pipe_ChoiceParameter<"::pipec::ScheduleKind", "schedule family">:$schedule,
    "int64_t":$chunks,
    Pipe_ChoiceParameter<"::pipec::Placement", "interleaved or v">:$placement,
    "int64_t":$microbatches,
    "bool":$asynchronous,
    "int64_t":$inflight,
    "bool":$vertical_sync,
    "::mlir::DenseI64ArrayAttr":$recompute
  );
  let assemblyFormat = "`<` struct(params) `>`";
  let genVerifyDecl = 1;
}

// Which part of the training step an op of @train_step belongs to
// (`pipe.phase`), set by pipec-autodiff and read by pipec-outline-stages.
def Pipe_Phase : I32EnumAttr<"Phase", "the part of the training step an op belongs to", [
    I32EnumAttrCase<"Fwd", 0, "fwd">,               // the forward
    I32EnumAttrCase<"BwdInput", 1, "bwd_input">,    // the input gradient (B)
    I32EnumAttrCase<"BwdWeight", 2, "bwd_weight">,  // the weight gradient (W)
  ]> {
  let cppNamespace = "::pipec::pipe";
  let genSpecializedAttr = 0;
}

def Pipe_PhaseAttr : EnumAttr<Pipe_Dialect, Pipe_Phase, "phase"> {
  let summary = "The phase of an op of @train_step (`#pipe.phase<fwd>`)";
  let assemblyFormat = "`<` $value `>`";
}

// The optimizer of the step function (`pipe.optimizer`'s kind).
def Pipe_OptimizerKind : I32EnumAttr<"OptimizerKind", "the optimizer of the step", [
    I32EnumAttrCase<"Sgd", 0, "sgd">,
    I32EnumAttrCase<"AdamW", 1, "adamw">,
  ]> {
  let cppNamespace = "::pipec::pipe";
  let genSpecializedAttr = 0;
}

// Which optimizer state an argument or result of the step is (`pipe.state`).
def Pipe_OptimizerState : I32EnumAttr<"OptimizerState", "an optimizer state tensor", [
    I32EnumAttrCase<"MomentumBuffer", 0, "momentum_buffer">, // SGD's momentum
    I32EnumAttrCase<"ExpAvg", 1, "exp_avg">,                 // AdamW's first moment
    I32EnumAttrCase<"ExpAvgSq", 2, "exp_avg_sq">,            // AdamW's second moment
  ]> {
  let cppNamespace = "::pipec::pipe";
  let genSpecializedAttr = 0;
}

def Pipe_StateAttr : EnumAttr<Pipe_Dialect, Pipe_OptimizerState, "state"> {
  let summary = "Which optimizer state a step argument or result is (`#pipe.state<exp_avg>`)";
  let assemblyFormat = "`<` $value `>`";
}

def Pipe_OptimizerAttr : Pipe_Attr<"Optimizer", "optimizer"> {
  let summary = "The optimizer and its hyper-parameters";
  let description = [{
    Set on the step function by `pipec-optimizer` as `pipe.optimizer` and
    copied to every stage's `step` by `pipec-outline-stages`: the kind
    (`sgd` or `adamw`), the learning rate, SGD's momentum (0 for AdamW),
    the weight decay, AdamW's beta1, beta2 and epsilon (0 for SGD) and the
    number of state tensors per trained parameter.

    Example:
      func.func @optimizer_step(...) attributes {pipe.optimizer =
          #pipe.optimizer<kind = sgd, lr = 0.10000000000000001, momentum = 0.9,
          weight_decay = 0.0, beta1 = 0.0, beta2 = 0.0, epsilon = 0.0,
          state_per_param = 1>}
  }];
  let parameters = (ins
    EnumParameter<Pipe_OptimizerKind>:$kind,
    Pipe_DoubleParameter<"learning rate">:$lr,
    Pipe_DoubleParameter<"SGD momentum">:$momentum,
    Pipe_DoubleParameter<"weight decay">:$weight_decay,
    Pipe_DoubleParameter<"AdamW beta1">:$beta1,
    Pipe_DoubleParameter<"AdamW beta2">:$beta2,
    Pipe_DoubleParameter<"AdamW epsilon">:$epsilon,
    "int64_t":$state_per_param
  );
  let assemblyFormat = "`<` struct(params) `>`";
  let genVerifyDecl = 1;
}

// Where generated code keeps an op's result (`pipe.storage`, one entry per
// result), chosen by pipec-plan-memory (docs/optimization.md).
def Pipe_StorageKind : I32EnumAttr<"StorageKind", "where a result is stored", [
    I32EnumAttrCase<"Arena", 0, "arena">,       // the stage's arena, at `offset` bytes
    I32EnumAttrCase<"Saved", 1, "saved">,       // the workspace slot of pipe.saved result `offset`
    I32EnumAttrCase<"Gradient", 2, "gradient">, // accumulated into the gradient buffer of result `offset`
    I32EnumAttrCase<"Buffer", 3, "buffer">,     // in place in the buffer that result `offset` updates
    I32EnumAttrCase<"Register", 4, "register">, // never stored: the norm-joined pipe.fused loop reads it in its kernel
  ]> {
  let cppNamespace = "::pipec::pipe";
  let genSpecializedAttr = 0;
}

def Pipe_StorageAttr : Pipe_Attr<"Storage", "storage"> {
  let summary = "Where an op result lives: `#pipe.storage<arena, 4096>`";
  let description = [{
    `arena`: at `offset` bytes into the stage's arena, which is allocated on
    the first call and reused by every entry point (the function's
    `pipe.arena_size` bounds it). `saved`: directly in the workspace slot of
    the function's pipe.saved result `offset`, which returns it or a view
    of it. `gradient`: the op
    accumulates (beta = 1) into the gradient buffer of the parameter whose
    gradient is function result `offset`. `buffer`: the op writes, in place,
    the buffer (a batch norm's running statistic) that function result
    `offset` updates, which it also reads. `register` (offset 0): never
    stored; a layer norm's input gradient that the pipe.fused loop joined to
    its kernel (pipe.norm_epilogue) reads as it is computed.
  }];
  let parameters = (ins EnumParameter<Pipe_StorageKind>:$kind, "int64_t":$offset);
  let assemblyFormat = "`<` $kind `,` $offset `>`";
  let genVerifyDecl = 1;
}

#endif // PIPEC_PIPE_ATTRS_TD
