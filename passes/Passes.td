#ifndef PIPEC_PASSES_TD
#define PIPEC_PASSES_TD

include "mlir/Pass/PassBase.td"

def EstimateCosts : Pass<"pipec-estimate-costs", "mlir::ModuleOp"> {
  let dependentDialects = ["::pipec::pipe::PipeDialect"];
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
      %0 = nn.gemm %x, %w, %b {pipe.cost = #pipe.cost<name = "fc1", fwd = 4.1e-06,
             bwd_input = 0.0, bwd_weight = 4.1e-06, fwd_flops = 32768.0,
             activation_bytes = 2048, param_bytes = 8448, optimizer_bytes = 16896,
             source = "estimate">, transB = true} : (...) -> tensor<8x64xf32>

    Options: the settings `EstimateCostsOptions::bind` binds (analysis/Settings/Declared.h,
    docs/settings.md), the same as pipec's flags of those names;
    `pipec-opt --help` lists them.
  }];
  let statistics = [
    Statistic<"numOpsCosted", "ops-costed", "Number of ops annotated">,
    Statistic<"numOpsProfiled", "ops-profiled", "Number of ops whose times came from the profile">,
  ];
}

def AssignStages : Pass<"pipec-partition", "mlir::ModuleOp"> {
  let dependentDialects = ["::pipec::pipe::PipeDialect"];
  let summary = "Plan the pipeline: stages, replicas, schedule and micro-batches chosen jointly";
  let description = [{
    Runs the planner (docs/planner.md) on the ops annotated by
    `pipec-estimate-costs`, in program order: PipeDream's hierarchical DP and
    the device-range search for the stages, every schedule family the
    options allow, simulated, and the micro-batch count. It records the
    chosen plan on the module: each op gets `pipe.stage` (its pipeline
    stage), the module `pipe.stages` (one dictionary per stage with its op
    range, replicas and ranks) and `pipe.plan` (schedule, chunks, placement,
    micro-batches, asynchronous updates, recomputed stages), which
    `pipec-recompute mode=auto` and `pipec-weight-stashing from-plan=true`
    follow. `pipec` runs it with every command-line flag of the planner.

    Before:
      %0 = nn.gemm ... {pipe.cost = {...}}
      %1 = nn.relu %0 {pipe.cost = {...}}
    After (gpus=1x2 stages=2):
      module attributes {pipe.plan = #pipe.plan<schedule = "1f1b", ...>, pipe.stages = [...]}
      %0 = nn.gemm ... {pipe.cost = {...}, pipe.stage = 0 : i64}
      %1 = nn.relu %0 {pipe.cost = {...}, pipe.stage = 1 : i64}

    Options: the settings `planner::Request::bind` binds (analysis/Settings/Declared.h,
    docs/settings.md), the same as pipec's flags of those names;
    `pipec-opt --help` lists them.
  }];
  let statistics = [
    Statistic<"numPlansEvaluated", "plans-evaluated", "Number of plans the planner simulated">,
  ];
}

def AppendLoss : Pass<"pipec-append-loss", "mlir::ModuleOp"> {
  let summary = "Make @forward end in a scalar loss (labels become an input)";
  let description = [{
    A model that ends in logits gets its loss appended: `softmax-cross-entropy`
    flattens the leading axes of the first result ([..., C] → [N, C]) and
    compares it with integer labels shaped like those leading axes (a new
    argument, role `label`, named `labels`); `mse` takes labels shaped like
    the result and computes mean((y - labels)²). The loss becomes the only
    result. A model whose first result already comes from
    nn.softmax_cross_entropy_loss is left as it is (its labels argument gets
    the role `label`).

    Before:
      func.func @forward(..., %x {nn.role = #nn.role<input>}) -> tensor<8x10xf32>
    After (loss=softmax-cross-entropy):
      func.func @forward(..., %x {nn.role = #nn.role<input>}, %labels: tensor<8xi64> {nn.role = #nn.role<label>})
          -> (tensor<f32> {nn.role = #nn.role<loss>})

    Options: the settings `AppendLossOptions::bind` binds (analysis/Settings/Declared.h,
    docs/settings.md), the same as pipec's flags of those names;
    `pipec-opt --help` lists them.
  }];
}

def Autodiff : Pass<"pipec-autodiff", "mlir::ModuleOp"> {
  let dependentDialects = ["::pipec::pipe::PipeDialect"];
  let summary = "Derive @train_step: forward, input gradients (B), weight gradients (W)";
  let description = [{
    Reverse-mode differentiation of @forward, whose first result is the
    scalar loss. Each nn op knows the gradient of each operand; the result is
    `func.func @train_step` returning the loss, the gradient of every trained
    parameter (role `grad`, in argument order) and the new values of the
    buffers (role `buffer_update`). Every op gets `pipe.phase`:
    `#pipe.phase<fwd>`, or
    `bwd_input` for gradients of activations (B), or `bwd_weight` for
    gradients of values computed from parameters only (W), which zero-bubble
    schedules may delay. Ops with `pipe.stage` pass it on to the gradient ops
    they cause. Gradients of a value used several times (tied weights) are
    summed.
  }];
}

//===----------------------------------------------------------------------===//
// From @train_step to per-stage programs (docs/stages.md)
//===----------------------------------------------------------------------===//

def Optimizer : Pass<"pipec-optimizer", "mlir::ModuleOp"> {
  let dependentDialects = ["::pipec::nn::NNDialect", "::pipec::pipe::PipeDialect",
                           "::mlir::func::FuncDialect"];
  let summary = "Add @optimizer_step: one nn.adamw_update / nn.sgd_update per trained parameter";
  let description = [{
    Reads the trained parameters of @train_step (arguments with role `param`;
    buffers are not trained) and adds a function that updates them from their
    gradients. Its arguments are the parameters, their gradients, the
    optimizer state (parameter-major: AdamW `exp_avg`, `exp_avg_sq`; SGD
    `momentum_buffer`, as PyTorch names them; one SGD buffer even without
    momentum, as the stage ABI counts it) and the step count (1 for the first
    update); its results the new parameters and the new state. The
    hyper-parameters are attributes of the update ops and, together, the
    function's `pipe.optimizer` (a `#pipe.optimizer<...>`; each state
    tensor is marked by its `pipe.state`, a `#pipe.state<...>`).

    After (optimizer=sgd lr=0.1 momentum=0.9):
      func.func @optimizer_step(
          %w: tensor<64x32xf32> {nn.name = "fc1.weight", nn.role = #nn.role<param>},
          %g: tensor<64x32xf32> {nn.name = "fc1.weight", nn.role = #nn.role<grad>},
          %buf: tensor<64x32xf32> {nn.name = "fc1.weight", nn.role = #nn.role<optimizer_state>,
                                   pipe.state = #pipe.state<momentum_buffer>},
          %step: i64 {nn.role = #nn.role<step>})
          -> (tensor<64x32xf32> {nn.name = "fc1.weight", nn.role = #nn.role<param>},
              tensor<64x32xf32> {nn.name = "fc1.weight", nn.role = #nn.role<optimizer_state>,
                                 pipe.state = #pipe.state<momentum_buffer>})
          attributes {pipe.optimizer = #pipe.optimizer<kind = sgd, lr = 0.10000000000000001, ...>} {
        %0:2 = nn.sgd_update %w, %g, %buf, %step {lr = 1.0e-01 : f32, momentum = 9.0e-01 : f32,
                                                   weight_decay = 0.0 : f32} : tensor<64x32xf32>
        return %0#0, %0#1 : ...
      }

    Options: the settings `OptimizerOptions::bind` binds (analysis/Settings/Declared.h,
    docs/settings.md), the same as pipec's flags of those names;
    `pipec-opt --help` lists them.
  }];
  let statistics = [
    Statistic<"numUpdates", "updates", "Number of parameter updates created">,
  ];
}

def OutlineStages : Pass<"pipec-outline-stages", "mlir::ModuleOp"> {
  let dependentDialects = ["::pipec::pipe::PipeDialect", "::pipec::nn::NNDialect", "::mlir::func::FuncDialect"];
  let summary = "Split @train_step and @optimizer_step into one pipe.stage per pipeline stage";
  let description = [{
    Every op of @train_step carries `pipe.stage` and `pipe.phase`
    (`#pipe.phase<fwd>`, `<bwd_input>`, `<bwd_weight>`); each goes to the function of its phase in its
    stage: `@fwd`, `@bwd_input`, `@bwd_weight`, and `@step` gets the stage's
    part of @optimizer_step. Values crossing stages become `pipe.send` /
    `pipe.recv` pairs between neighbours (activations forward in @fwd,
    gradients backward in @bwd_input, one tag per tensor and direction,
    forwarded hop by hop when they skip stages). Values a later function of
    the same stage needs are returned by the earlier one and taken as
    arguments, both marked `pipe.saved = "<name>"` (the micro-batch's
    workspace). Parameters, buffers and data fields are arguments
    (`nn.role`, `nn.name`) of every function that reads them; the loss seed
    becomes the `loss_scale` argument of the last stage's @bwd_input.
    Replicated stages average gradients with `pipe.allreduce` in @step; a
    parameter read by several stages (tied weights) is held by each, its
    partial gradients summed by a `pipe.allreduce {stages = [...]}` among
    them. The pipec-verify-pipeline checks run at the end. docs/stages.md
    gives the full shape.

    Before:
      func.func @train_step(%w0 {nn.role = #nn.role<param>}, %w1 {nn.role = #nn.role<param>}, %x {nn.role = #nn.role<input>}, ...)
        %h = nn.matmul %x, %w0 {pipe.stage = 0 : i64, pipe.phase = #pipe.phase<fwd>} ...
        %y = nn.matmul %h, %w1 {pipe.stage = 1 : i64, pipe.phase = #pipe.phase<fwd>} ...
    After:
      pipe.stage @stage_0 attributes {id = 0 : i64, ranks = array<i64: 0>, replicas = 1 : i64} {
        func.func @fwd(%w0 {nn.role = #nn.role<param>, ...}, %x {nn.role = #nn.role<input>, ...}) {
          %h = nn.matmul %x, %w0 ...
          pipe.send %h to 1 tag 0 {name = "fc0"} : tensor<8x64xf32>
          return
        }
        func.func @bwd_input(...)  func.func @bwd_weight(...)  func.func @step(...)
      }
      pipe.stage @stage_1 ... { func.func @fwd(...) { %h = pipe.recv from 0 tag 0 ... } ... }
  }];
  let options = [
    Option<"keepTrainStep", "keep-train-step", "bool", /*default=*/"false",
           "Keep @train_step and @optimizer_step for reference">,
  ];
  let statistics = [
    Statistic<"numSends", "sends", "Number of pipe.send ops created">,
    Statistic<"numSaved", "saved", "Number of values saved between a stage's functions">,
  ];
}

def VerifyPipeline : Pass<"pipec-verify-pipeline", "mlir::ModuleOp"> {
  let summary = "Check that the stages' communication pairs up and their functions fit together";
  let description = [{
    Checks the stage modules the outlining produced: stage ids are 0..n-1
    and every stage has @fwd, @bwd_input, @bwd_weight and @step; every
    pipe.send has exactly one pipe.recv in the peer stage's function of the
    same phase with the same tag and type (and the reverse); peers are
    neighbours in the direction of the phase (activations forward in @fwd,
    gradients backward in @bwd_input); ops carrying `pipe.stage` sit in that
    stage; every `pipe.saved` argument has one producer result of the same
    type in an earlier function of its stage; tied-parameter all-reduces agree
    among the stages they name. Errors name the stage, the op and the tag.
    Reads only.
  }];
}

def WeightStashing : Pass<"pipec-weight-stashing", "mlir::ModuleOp"> {
  let dependentDialects = ["::pipec::pipe::PipeDialect"];
  let summary = "Keep one weight version per in-flight micro-batch (asynchronous schedules)";
  let description = [{
    For PipeDream's asynchronous 1F1B-RR: each stage function gets the
    micro-batch index (an `index` argument, `nn.role = #nn.role<microbatch>`); @fwd
    stashes every trained parameter (`pipe.stash`, `slots` = versions) and
    @bwd_input / @bwd_weight read it back with `pipe.restore`, so the
    backward of a micro-batch uses the weights its forward used. With
    vertical sync the forward of stages after the first also reads the
    restored version (the one current when the micro-batch entered stage 0).
    Synchronous schedules (versions 0 or 1) are left unchanged. Run it after
    pipec-recompute.

    After (versions=4):
      func.func @fwd(%w {nn.role = #nn.role<param>, nn.name = "fc.weight"}, ..., %mb: index {nn.role = #nn.role<microbatch>}) {
        pipe.stash %w for %mb {name = "fc.weight", slots = 4 : i64} : tensor<64x32xf32>
        ...
      func.func @bwd_weight(..., %mb: index {nn.role = #nn.role<microbatch>}) {
        %w = pipe.restore %mb {name = "fc.weight", slots = 4 : i64} : tensor<64x32xf32>

    Options: the settings `WeightStashingOptions::bind` binds (analysis/Settings/Declared.h,
    docs/settings.md), the same as pipec's flags of those names;
    `pipec-opt --help` lists them.
  }];
  let statistics = [
    Statistic<"numStashed", "stashed", "Number of parameters stashed">,
  ];
}

def Recompute : Pass<"pipec-recompute", "mlir::ModuleOp"> {
  let dependentDialects = ["::pipec::pipe::PipeDialect"];
  let summary = "Keep only stage-boundary activations and re-run the forward before the backward";
  let description = [{
    For the chosen stages, @fwd saves only what the stage received (its
    boundary activations); @bwd_input begins with a `pipe.recompute` region
    that re-runs the forward ops the backward needs from those, the
    parameters and the data fields, and yields the values @fwd used to save.
    Values @bwd_weight needs are then handed on by @bwd_input under the same
    `pipe.saved` names. @fwd's `pipe.saved_bytes` shrinks; the value before
    is kept as `pipe.saved_bytes_no_recompute`, and each stage's
    `pipe.workspace_bytes` is updated. Run it before pipec-weight-stashing.
  }];
  let options = [
    Option<"mode", "mode", "std::string", /*default=*/"\"none\"",
           "none, all (every stage), or auto (the planner's choice: the stages pipe.plan lists); a list in `stages` overrides">,
    ListOption<"stages", "stage-ids", "int64_t",
               "Stages to recompute (the driver's `auto` choice)">,
  ];
  let statistics = [
    Statistic<"numRecomputed", "ops-recomputed", "Number of forward ops re-run in a backward">,
  ];
}

//===----------------------------------------------------------------------===//
// Optimisation (pipec -O2; docs/optimization.md)
//===----------------------------------------------------------------------===//

def RecognizeComposites : Pass<"pipec-recognize-composites", "mlir::ModuleOp"> {
  let dependentDialects = ["::pipec::nn::NNDialect"];
  let summary = "Decomposed LayerNorm, erf-GELU and masked softmax as exporters write them become "
                "nn.layer_norm, nn.gelu and nn.masked_softmax";
  let description = [{
    Recognises, in every function:
    - `(x - mean(x)) / sqrt(mean((x - mean(x))^2) + eps) * w (+ b)`, both
      means over the same trailing axes with keepdims, the square a `pow`
      by 2 or a self-multiply, `w` and `b` of the normalized shape: one
      `nn.layer_norm` (axis = the first normalized axis, epsilon = eps);
    - `x * 0.5 * (1 + erf(x / sqrt 2))`, in any association of the
      products: one `nn.gelu`;
    - `softmax(where(mask, fill, x * c))` along the last axis, the fill on
      either side of the where, `x * c`, `c * x` or `x / c` or plain `x`,
      `fill` and `c` splat f32 constants: one `nn.masked_softmax`.
    Intermediate values must have no other use and every op of the chain
    the same `pipe.stage`; the new op keeps the root's `pipe.stage`,
    `pipe.phase` and `pipe.cost`. Runs with pipec-canonicalize-gemm after
    the partition, so that autodiff derives one gradient op per composite.
  }];
  let statistics = [
    Statistic<"numRecognized", "recognized", "Number of composites replaced by one op">,
  ];
}

def CanonicalizeGemm : Pass<"pipec-canonicalize-gemm", "mlir::ModuleOp"> {
  let dependentDialects = ["::pipec::nn::NNDialect"];
  let summary = "Matrix products as GEMMs: transposes folded, batch rows flattened, bias added by the GEMM";
  let description = [{
    Rewrites, until none applies, in every function of the module:
    - `nn.matmul` of a rank >= 2 operand against a 2-D one: one `nn.gemm`
      over the flattened rows (views reshape around it); its weight gradient
      is then one GEMM with the batch in K;
    - `nn.gemm` of a 2-D `nn.transpose` (perm [1, 0]): the transpose folds
      into transA / transB;
    - `nn.transpose` (perm [1, 0]) of an `nn.gemm` without C:
      (op(A) op(B))^T = op(B)^T op(A)^T, another gemm;
    - `nn.add` of a bias and a C-less `nn.gemm` (directly or through a view
      that keeps the last dimension): the bias becomes C with beta = 1.
    Only fp32 tensors, and only when the rewritten value has no other use.
    New ops keep the replaced op's `pipe.stage`, `pipe.phase` and
    `pipe.cost`, so it runs after pipec-partition (before autodiff, whose
    gradients then are GEMMs too) or on outlined stages.

    Before:
      %t = nn.transpose %w {perm = array<i64: 1, 0>} : tensor<96x32xf32> -> tensor<32x96xf32>
      %y = nn.matmul %x, %t : tensor<2x16x32xf32>, tensor<32x96xf32> -> tensor<2x16x96xf32>
      %z = nn.add %bias, %y : tensor<96xf32>, tensor<2x16x96xf32> -> tensor<2x16x96xf32>
    After:
      %x2 = nn.reshape %x : tensor<2x16x32xf32> -> tensor<32x32xf32>
      %g = nn.gemm %x2, %w, %bias {transB = true} : ... -> tensor<32x96xf32>
      %z = nn.reshape %g : tensor<32x96xf32> -> tensor<2x16x96xf32>
  }];
  let statistics = [
    Statistic<"numRewrites", "rewrites", "Number of matrix-product rewrites applied">,
  ];
}

def PadClasses : Pass<"pipec-pad-classes", "mlir::ModuleOp"> {
  let dependentDialects = ["::pipec::nn::NNDialect"];
  let summary = "A cross-entropy's class dimension that is not a multiple of 8 rounded up in its GEMM: zero weight rows, scores of -inf";
  let description = [{
    For CUDA stages with bf16 storage, before autodiff: an
    `nn.softmax_cross_entropy_loss` (log_prob unused, rank-2 scores) whose
    scores are an `nn.gemm`'s result through views that keep the class
    dimension last, where that dimension N is not a multiple of 8 (GPT-2's
    50,257 words), becomes the same loss over N rounded up to a multiple of
    64: the GEMM's weight padded with zero rows (or columns), its bias
    padded with -inf (a bias of 0 then -inf where it had none), class
    weights padded with 0, and the loss told the real count (`classes`),
    so labels from N on are still errors. The padding's scores are -inf:
    the softmax gives them nothing, their gradient is exactly 0, and the
    loss and every gradient equal the unpadded ones. Autodiff then derives
    the three GEMMs on the rounded dimension (the input gradient's K, the
    weight gradient's M) and a slice of the weight gradient. cuBLAS runs
    bf16 GEMMs with an odd dimension on slow kernels, and the kernel
    library otherwise copies the [tokens, N] logits and their gradient to
    and from a rounded layout three times per micro-batch (about 4 ms of
    GPT-2's at 16 x 1,024 on an H200, docs/gpu-runs.md). Only where
    pipec/gemm_rounding.h's rule says it pays (at most 1/8 more work, 64
    FLOPs per byte of the weight's padded copy: 128 rows or more).

    Before:
      %l = nn.gemm %h, %w {transB = true} : (tensor<256x64xf32>, tensor<1001x64xf32>) -> tensor<256x1001xf32>
      %loss, %lp = nn.softmax_cross_entropy_loss %l, %labels : ...
    After:
      %wp = nn.pad %w {pads = array<i64: 0, 0, 23, 0>} : ... -> tensor<1024x64xf32>
      %c = nn.constant dense<[0.0, ..., 0xFF800000, ...]> : tensor<1024xf32>
      %l = nn.gemm %h, %wp, %c {transB = true} : ... -> tensor<256x1024xf32>
      %loss, %lp = nn.softmax_cross_entropy_loss %l, %labels {classes = 1001 : i64} : ...
  }];
  let statistics = [
    Statistic<"numPadded", "padded", "Number of cross-entropy GEMMs whose class dimension was padded">,
  ];
}

def ChannelsLast : Pass<"pipec-channels-last", "mlir::ModuleOp"> {
  let dependentDialects = ["::pipec::nn::NNDialect"];
  let summary = "Convolutional regions stored channels-last ([N, spatial..., C]), converted at their edges";
  let description = [{
    For CUDA stages whose convolutions run on cuDNN (tf32 or bf16), before
    autodiff (docs/optimization.md, "Channels last"). Every nn.conv and
    nn.conv_input_grad (ConvTranspose) of rank 3 or more starts a region; a
    batch norm, max, average or global average pool that reads a region's
    tensor joins it, and so do element-wise ops whose operands have the
    result's shape or broadcast to it (a squeeze-excitation's scale; not
    dropout, whose mask is drawn per element index) and concat, split, pad
    and slice, whose axes are renumbered. A model's own transpose of a
    region tensor, or into one, is composed with the conversion: one move,
    or none (ConvNeXt's permutes). A channel shuffle of a region tensor
    (ShuffleNet's reshape to [N, a, b, d...], swap of axes 1 and 2, reshape
    back) becomes the same three moves on the stored channel axis. Region ops get
    `channels_last` and tensors of rank 3 or more [N, spatial..., C]; a
    convolution's weight is read through a transpose to [K, kernel...,
    C/group]. A tensor from outside is converted in once, next to its first
    region reader; a region tensor that something outside reads is converted
    back next to its producer, so a value crosses to another stage in the
    layout its reader wants. A conversion that moves only axes of size 1
    (a global average pool's [N, 1, 1, C]) is a reshape. Autodiff then
    derives the gradients in the same layout.

    Before:
      %y = nn.conv %x, %w {...} : (tensor<8x3x32x32xf32>, tensor<16x3x3x3xf32>) -> tensor<8x16x32x32xf32>
      %r = nn.relu %y : ...
    After:
      %xt = nn.transpose %x {perm = array<i64: 0, 2, 3, 1>} : ... -> tensor<8x32x32x3xf32>
      %wt = nn.transpose %w {perm = array<i64: 0, 2, 3, 1>} : ... -> tensor<16x3x3x3xf32>
      %y = nn.conv %xt, %wt {channels_last = true, ...} : ... -> tensor<8x32x32x16xf32>
      %r = nn.relu %y : ... -> tensor<8x32x32x16xf32>
      %rb = nn.transpose %r {perm = array<i64: 0, 3, 1, 2>} : ... -> tensor<8x16x32x32xf32>
  }];
  let statistics = [
    Statistic<"numRegionOps", "region-ops", "Number of ops rewritten to store their tensors channels-last">,
    Statistic<"numConversions", "conversions", "Number of layout conversions at the regions' edges">,
    Statistic<"numFolded", "folded", "Number of the model's transposes of a region tensor folded into one move">,
    Statistic<"numShuffles", "shuffles", "Number of channel shuffles moved to the stored channel axis">,
  ];
}

def FuseGemmEpilogue : Pass<"pipec-fuse-gemm-epilogue", "mlir::ModuleOp"> {
  let summary = "An activation of a GEMM's result becomes the GEMM's epilogue, and its gradient of a GEMM's product one nn.gemm_activation_grad";
  let description = [{
    In every model function of every pipe.stage (not @step), an element-wise
    unary function f (pipec/vocabulary.h's table) whose operand is an
    `nn.gemm` result, directly or through views (reshape, flatten, squeeze,
    unsqueeze), becomes that GEMM's `activation`: the GEMM computes
    f(alpha op(A) op(B) + beta C) and the views read it. When nothing else
    reads the pre-activation it never reaches memory; when something does
    (the gradient of a GELU or erf, which reads its input) the GEMM also
    returns it (`keeps_pre_activation`) for those readers. An
    `nn.unary_grad` of f at x whose incoming gradient is a GEMM's product
    (no C, no epilogue, read by nothing else, through views or not) becomes
    `nn.gemm_activation_grad`. On the CPU the epilogues run on each panel
    of the GEMM's output right after the panel is computed; on CUDA, ReLU
    and the tanh GELU are cuBLASLt epilogues (with the bias; GELU_AUX and
    DGELU for the tanh GELU's input and gradient), the others a kernel
    after the GEMM; so for `target=cuda` only ReLU and the tanh GELU (and
    their gradients) become epilogues, and the other functions are left to
    pipec-fuse-elementwise, which computes them in the loop of their
    readers. Runs after pipec-recompute-elementwise, so that an
    activation recomputed in a later entry point is still an op there.

    Options: the settings `FuseGemmEpilogueOptions::bind` binds
    (analysis/Settings/Declared.h, docs/settings.md).

    Before:
      %g = nn.gemm %x, %w, %b {transB = true} : ... -> tensor<8x64xf32>
      %r = nn.relu %g : tensor<8x64xf32>
    After:
      %r = nn.gemm %x, %w, %b {activation = #nn.unary<relu>, transB = true} : ... -> tensor<8x64xf32>
  }];
  let statistics = [
    Statistic<"numEpilogues", "epilogues", "Number of activations fused into GEMMs">,
  ];
}

def FuseNormEpilogue : Pass<"pipec-fuse-norm-epilogue", "mlir::ModuleOp"> {
  let summary = "The residual add and the ReLU (or ReLU6) after a batch norm or a channels-last convolution become its epilogue";
  let description = [{
    In every model function of every pipe.stage (not @step), an `nn.add`
    of a batch norm's normalized result (read by the add alone) and a tensor
    of the same shape and type becomes the norm's `residual` (the norm
    computed where it was when the residual is defined before it, else where
    the add was, if nothing reads its running statistics before that
    point); of two such norms (a ResNet block's main branch
    and its projected shortcut) the one the add reads second takes the
    other as its residual. Then an `nn.relu` or `nn.relu6` of a batch
    norm's result read by it alone becomes the norm's `activation`. The norm's apply pass
    writes relu(normalized + residual): a ResNet-50 forward loses its 49
    ReLU and residual-add passes. ReLU's gradient reads its output, which
    the norm now writes; a normalized value something else reads (a saved
    pre-activation) is never fused. In the backward, an `nn.unary_grad` of
    ReLU or ReLU6 (at its output y) read as dy by one `nn.batch_norm_grad`, and
    otherwise only returned, becomes part of that op (`activation`, `y`):
    its first pass masks dy as it sums, and with `keeps_masked_dy` writes
    the masked gradient for the returns (the norm's parameter gradient reads
    it in @bwd_weight).

    The same residual add and activation after a channels-last `nn.conv`
    (its result read by the add or the activation alone) become the
    convolution's `residual` and `activation` (it moves to the add when
    the residual is defined after it): cuDNN's graph writes
    f(conv + bias + residual) in one pass (pipec/cuda_kernels.h). The
    activation's gradient stays an op: the convolution's input, weight and
    bias gradients all read it. Channels-last convolutions exist on CUDA
    stages at tf32 and bf16 only (pipec-channels-last); at fp32 they run
    pipec's kernels, shared with the CPU, and keep their ops. Runs before
    pipec-fuse-elementwise.

    Before:
      %n:3 = nn.batch_norm %x, %s, %b, %m, %v {training = true} : ...
      %a = nn.add %n#0, %r : ...
      %y = nn.relu %a : tensor<2x4x6x6xf32>
    After:
      %y, %nm, %nv = nn.batch_norm %x, %s, %b, %m, %v, %r {activation = #nn.unary<relu>, training = true} : ...
  }];
  let statistics = [
    Statistic<"numResiduals", "residuals", "Number of residual adds fused into batch norms">,
    Statistic<"numActivations", "activations", "Number of ReLUs and ReLU6s fused into batch norms">,
    Statistic<"numActivationGradients", "activation-gradients",
              "Number of ReLU and ReLU6 gradients fused into batch norms' input gradients">,
    Statistic<"numConvResiduals", "conv-residuals", "Number of residual adds fused into convolutions">,
    Statistic<"numConvActivations", "conv-activations", "Number of ReLUs and ReLU6s fused into convolutions">,
  ];
}

def FuseNormLoops : Pass<"pipec-fuse-norm-loops", "mlir::ModuleOp"> {
  let summary = "An element-wise loop before a layer norm, or after its input gradient, runs in the norm's CUDA kernel";
  let description = [{
    CUDA stages, after pipec-fuse-elementwise and pipec-bf16-storage. In
    every model function of every pipe.stage (not @step):
    - a `pipe.fused` loop one of whose results an `nn.layer_norm` (centered
      or RMS) normalizes gets `pipe.norm_prologue`, and the norm moves right
      after it (its scale and bias are defined before the loop). The joined
      kernel runs the loop over each row, storing every result, then
      normalizes the row it just stored: one launch instead of two, and the
      norm's input is read back from cache. A pre-norm transformer's
      residual add (and GPT-2's dropout before it) joins every norm.
    - a `pipe.fused` loop that alone reads an `nn.layer_norm_grad`'s result
      gets `pipe.norm_epilogue` and moves right after it (its other inputs
      are defined before the gradient). The joined kernel hands each pack of
      the input gradient, rounded to its storage, to the loop: the gradient
      is never stored (pipec-plan-memory: `register`). The residual
      stream's gradient sum joins every norm's gradient.
    A lone element-wise op (pipec-fuse-elementwise leaves a group of one
    as it is: the residual add of a model without dropout) first becomes a
    loop of its own. Either needs a static shape of float or bf16 storage, one iteration
    space for the loop and the norm's input (or gradient), and float
    parameters with one element per position of a row. Code generation
    (docs/cuda-codegen.md) writes the pair as one kernel on the row norm's
    device code (pipec/cuda_row_norm.cuh), which the kernel library's norms
    share, so the bits are the library's.

    Before:
      %s = pipe.fused(%a, %b) : ... { %t = nn.add %x, %y ...; pipe.yield %t }
      %c = nn.constant ...
      %n:3 = nn.layer_norm %s, %g, %beta : ...
    After:
      %s = pipe.fused(%a, %b) {pipe.norm_prologue} : ... { ... }
      %n:3 = nn.layer_norm %s, %g, %beta : ...
      %c = nn.constant ...
  }];
  let statistics = [
    Statistic<"numPrologues", "prologues", "Number of loops joined to the norm after them">,
    Statistic<"numEpilogues", "epilogues", "Number of loops joined to the norm gradient before them">,
  ];
}

def RecomputeElementwise : Pass<"pipec-recompute-elementwise", "mlir::ModuleOp"> {
  let dependentDialects = ["::pipec::pipe::PipeDialect", "::pipec::nn::NNDialect"];
  let summary = "Saved values that are cheap to recompute (an element-wise function of another saved value, a dropout mask) are recomputed, not kept";
  let description = [{
    In every pipe.stage, a `pipe.saved` result of @fwd or @bwd_input that
    pure element-wise ops (GELU, ReLU, tanh, SwiGLU's g * sigmoid(g), ...:
    unary and binary ones, views and constants, at most 8 ops) compute from
    one other `pipe.saved` result of the same function, or from one
    parameter (pipec-pad-classes' padded weight; pads count among the ops),
    is no longer returned: each of @bwd_input and @bwd_weight that read it
    applies the same ops, just before its first reader, to the saved
    operand or the parameter (taking that as an argument if it did not
    already; where weights are stashed, a pipe.restore of it). It repeats until nothing
    changes (the sigmoid no longer saved, silu has one saved input). A GPT-2 block keeps its GELU's input for the GELU's gradient
    and, until this pass, its output for the next product's weight gradient;
    one element-wise pass in @bwd_weight replaces the second copy (288 MiB
    per GPT-2 124M micro-batch at 4 x 1,024 in bf16: docs/optimization.md).
    Likewise a saved training-mode dropout's mask that is read only as the
    mask of nn.dropout_grad is drawn again there from the dropout's key
    (`dropout_op_id`, the run's seed, step and micro-batch) instead of kept.
    The stage's `pipe.workspace_bytes` is updated.
  }];
  let statistics = [
    Statistic<"numRecomputed", "values-recomputed", "Number of saved values recomputed by their readers">,
  ];
}

def FuseElementwise : Pass<"pipec-fuse-elementwise", "mlir::ModuleOp"> {
  let dependentDialects = ["::pipec::pipe::PipeDialect"];
  let summary = "Chains of element-wise ops of one shape become one pipe.fused loop";
  let description = [{
    In every function of every pipe.stage, element-wise fp32 ops (unary
    functions and their gradients, add, sub, mul, div, pow, binary_grad,
    where, dropout with its mask and dropout_grad) whose results have the
    same shape are grouped in program order, each group computed at one of
    its ops (its anchor). An op joins the groups of all its operands'
    producers, merged, or else one of them, or else a group that reads one
    of its operands too (a sibling), wherever the joined ops can all be
    computed at the op or at a group's anchor: every operand from outside
    defined before that point, every reader outside after it. Groups of
    two or more ops move into a `pipe.fused` op at their anchor, an op that
    computes what an earlier one of the loop does (dropouts excepted) is
    that one, and it yields only the values used outside it (or returned),
    so intermediates of, e.g., an exported erf-GELU, the normalising tail
    of a decomposed LayerNorm or SwiGLU's backward never reach memory. Code
    generation emits one loop (CPU) or one kernel (CUDA) per pipe.fused.
  }];
  let statistics = [
    Statistic<"numFused", "fused-groups", "Number of pipe.fused ops created">,
    Statistic<"numFusedOps", "fused-ops", "Number of ops moved into pipe.fused bodies">,
  ];
}

def Bf16Storage : Pass<"pipec-bf16-storage", "mlir::ModuleOp"> {
  let dependentDialects = ["::pipec::pipe::PipeDialect", "::pipec::nn::NNDialect"];
  let summary = "Activations, their gradients and stage transfers stored in bfloat16 (CUDA stages at bf16 precision)";
  let description = [{
    In @fwd, @bwd_input and @bwd_weight of every pipe.stage, float values
    are retyped by where they live (docs/cuda-codegen.md, "bf16 storage"):
    - ops whose CUDA kernels have a bfloat16 version (matrix products,
      layer/RMS norm and their gradients, attention and its gradient,
      softmax, the loss, element-wise ops and their gradients, dropout,
      reductions, gather / slice gradients) read and write their
      activations in bf16; parameters they read as they are (scales, biases,
      rotary tables, class weights), additive masks, statistics (mean,
      1/std, log-sum-exp), the loss and parameter gradients stay f32;
    - a matrix product or pipe.fused loop whose every use wants f32 (a
      parameter gradient, a float32-only op) writes f32 directly;
    - data movement and views keep their input's storage; pipe.fused loops
      load either storage and compute in f32;
    - every other op (convolutions, pooling, batch norm, constants, ONNX
      casts) reads and writes f32;
    - values sent between stages are bf16 (half the bytes), saved values
      keep their storage across @fwd -> @bwd_input -> @bwd_weight, and every
      other function result (losses, gradients, outputs) is f32.
    Where a value's storage differs from what a reader takes, one `nn.cast`
    per value and storage in the function converts it before the first
    reader (a parameter read by a matrix product: one bf16 copy per
    function). @step is untouched: master weights and optimizer state stay
    f32. pipec adds this pass for CUDA stages at bf16 precision.
  }];
  let statistics = [
    Statistic<"numCasts", "casts", "Number of nn.cast conversions between bf16 and f32 inserted">,
  ];
}

def PlanMemory : Pass<"pipec-plan-memory", "mlir::ModuleOp"> {
  let dependentDialects = ["::pipec::pipe::PipeDialect"];
  let summary = "Static memory plan: every stage function's values in one arena, offsets from liveness";
  let description = [{
    For every function of every pipe.stage, gives each op result a place,
    recorded as `pipe.storage` (one #pipe.storage<kind, offset> per result):
    - `saved`: a value the function returns as `pipe.saved`, or the value
      a returned view (reshape, flatten, squeeze, unsqueeze) reads, is
      computed directly into that result's workspace slot (no copy, no
      arena space; the storage's offset names the result); a later saved
      result of the same storage gets `pipe.saved_slot_of = <index>` and
      shares that slot (neither stored nor copied);
    - `gradient`: a C-less `nn.gemm`, an `nn.reduce_sum` (a bias's
      gradient) or both results of an `nn.layer_norm_param_grad`, whose
      only use (through views) is returning a parameter's gradient, add
      into that gradient buffer (beta = 1, or the kernels' accumulate flag);
    - `register` (offset 0): a layer norm's input gradient that the loop
      joined to its kernel (pipec-fuse-norm-loops) reads as it is computed,
      never stored;
    - `arena`: every other value that needs storage gets a 64-byte aligned
      offset into the stage's arena. Live ranges come from the op order
      (views, all-reduces, optimizer updates and recompute / fused bodies
      alias their operands; a loop joined to a norm's kernel and the norm
      are one position); values whose live ranges overlap never share
      bytes, and an op's results never share bytes with its operands.
      Offsets are assigned largest first, each at the lowest offset that
      fits (best fit in a greedy-by-size order).
    - kernel scratch: a kernel call that needs scratch memory (convolutions,
      layer norm, pooling, the loss, reductions: pipec/kernel_scratch.h asks
      the `target`'s kernels) gets `pipe.scratch = array<i64: offset, bytes>`,
      its shared part's place in the arena, live during the call only; the
      per-thread part (CPU) lies after the arena, one per thread, and the
      function records the largest as `pipe.thread_scratch_size` (bytes).
    The function gets `pipe.arena_size` (bytes); the stage's arena is the
    largest of its functions', allocated once on the first call.

    Before:
      %a = nn.relu %x : tensor<2x16x8x8xf32>
      %b = nn.relu %a : tensor<2x16x8x8xf32>
      %y = nn.conv %b, %w {...} : (tensor<2x16x8x8xf32>, tensor<16x16x3x3xf32>) -> ...
    After (target cpu: Winograd's transformed weights shared, at %a's bytes,
    dead by then; each thread's transformed tiles after the arena):
      func.func @fwd(...) attributes {pipe.arena_size = 82944 : i64,
                                      pipe.thread_scratch_size = 264704 : i64}
      %a = nn.relu %x {pipe.storage = [#pipe.storage<arena, 0>]} ...
      %b = nn.relu %a {pipe.storage = [#pipe.storage<arena, 66560>]} ...
      %y = nn.conv %b, %w {..., pipe.scratch = array<i64: 0, 66560>,
                           pipe.storage = [#pipe.storage<arena, 74752>]} ...

    Options: the settings `PlanMemoryOptions::bind` binds (analysis/Settings/Declared.h,
    docs/settings.md), the same as pipec's flags of those names;
    `pipec-opt --help` lists them.
  }];
  let statistics = [
    Statistic<"numScratchCalls", "scratch-calls", "Number of kernel calls given scratch in the arena">,
    Statistic<"numArenaValues", "arena-values", "Number of values placed in an arena">,
    Statistic<"numSavedInPlace", "saved-in-place", "Number of values computed directly into their workspace slot">,
    Statistic<"numSavedShared", "saved-shared", "Number of saved results sharing an earlier saved result's slot">,
    Statistic<"numAccumulated", "gradients-in-place", "Number of results (GEMMs, reductions, layer-norm parameter gradients) accumulated into a gradient buffer">,
  ];
}

#endif // PIPEC_PASSES_TD
