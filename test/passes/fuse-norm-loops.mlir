// RUN: pipec-opt %s --pipec-fuse-norm-loops | FileCheck %s
// RUN: pipec-opt %s --pipec-fuse-norm-loops --pipec-plan-memory=target=cuda | FileCheck %s --check-prefix=PLAN
// RUN: pipec-opt %s --pipec-fuse-norm-loops --mlir-print-op-generic | pipec-opt | FileCheck %s --check-prefix=ROUNDTRIP

// The IR the pass writes verifies and prints back.
// ROUNDTRIP: pipe.stage @stage_0

pipe.stage @stage_0 attributes {id = 0 : i64, replicas = 1 : i64} {
  // A pre-norm block's residual: the loop adds the dropped-out branch to
  // the residual stream, and the norm moves above the constant to run in
  // the loop's kernel. The loop's inputs die there: the norm's results get
  // bytes of their own (the plan puts the pair at one position; at two,
  // the norm's result would take the relu's bytes, which the loop reads).
  // CHECK-LABEL: func.func @fwd
  // CHECK: %[[S:.*]] = pipe.fused(%{{.*}}, %arg0) attributes {pipe.norm_prologue} :
  // CHECK: pipe.yield
  // CHECK-NEXT: }
  // CHECK-NEXT: nn.layer_norm %[[S]], %arg1, %arg2
  // CHECK-NEXT: nn.constant
  // PLAN-LABEL: func.func @fwd
  // PLAN: nn.relu %arg0 {pipe.storage = [#pipe.storage<arena, 0>]}
  // PLAN: pipe.fused(%{{.*}}, %arg0) attributes {pipe.norm_prologue, pipe.storage = [#pipe.storage<arena, 256>]}
  // PLAN: nn.layer_norm {{.*}} {pipe.storage = [#pipe.storage<arena, 512>, #pipe.storage<arena, {{[0-9]+}}>, #pipe.storage<arena, {{[0-9]+}}>]}
  func.func @fwd(%x: tensor<4x16xf32> {nn.name = "x", nn.role = #nn.role<input>},
                 %g: tensor<16xf32> {nn.name = "g", nn.role = #nn.role<param>},
                 %b: tensor<16xf32> {nn.name = "b", nn.role = #nn.role<param>})
      -> (tensor<4x16xf32>, tensor<4x16xf32>, tensor<4xf32>) {
    %a = nn.relu %x : tensor<4x16xf32>
    %s = pipe.fused(%a, %x) : (tensor<4x16xf32>, tensor<4x16xf32>) -> tensor<4x16xf32> {
    ^bb0(%p: tensor<4x16xf32>, %q: tensor<4x16xf32>):
      %d, %m = nn.dropout %p {ratio = 0.1 : f32, training = true} : (tensor<4x16xf32>) -> (tensor<4x16xf32>, tensor<4x16xi1>)
      %r = nn.add %q, %d : (tensor<4x16xf32>, tensor<4x16xf32>) -> tensor<4x16xf32>
      pipe.yield %r : tensor<4x16xf32>
    }
    %c = nn.constant dense<1.0> : tensor<4xf32>
    %n, %mean, %inv = nn.layer_norm %s, %g, %b : (tensor<4x16xf32>, tensor<16xf32>, tensor<16xf32>) -> (tensor<4x16xf32>, tensor<4x1xf32>, tensor<4x1xf32>)
    return %s, %n, %c : tensor<4x16xf32>, tensor<4x16xf32>, tensor<4xf32>
  }

  // The backward: the loop that alone reads the norm's input gradient
  // (adding it to the residual stream's) moves up to the gradient and runs
  // in its kernel; the gradient is never stored.
  // CHECK-LABEL: func.func @bwd_input
  // CHECK: %[[DX:.*]] = nn.layer_norm_grad
  // CHECK-NEXT: pipe.fused(%arg2, %[[DX]]) attributes {pipe.norm_epilogue}
  // CHECK: pipe.yield
  // CHECK-NEXT: }
  // CHECK-NEXT: nn.relu
  // PLAN-LABEL: func.func @bwd_input
  // PLAN: nn.layer_norm_grad {{.*}}pipe.storage = [#pipe.storage<register, 0>]}
  // PLAN-NEXT: pipe.fused(%arg2, %{{.*}}) attributes {pipe.norm_epilogue, pipe.storage = [#pipe.storage<arena, 0>]}
  func.func @bwd_input(%dy: tensor<2x3x16xbf16>, %x: tensor<2x3x16xbf16>, %dr: tensor<2x3x16xbf16>,
                       %g: tensor<16xf32> {nn.name = "g", nn.role = #nn.role<param>})
      -> (tensor<2x3x16xbf16>, tensor<2x3x16xbf16>) {
    %dx = nn.layer_norm_grad %dy, %x, %g {centered = false} : (tensor<2x3x16xbf16>, tensor<2x3x16xbf16>, tensor<16xf32>) -> tensor<2x3x16xbf16>
    %o = nn.relu %dy : tensor<2x3x16xbf16>
    %s = pipe.fused(%dr, %dx) : (tensor<2x3x16xbf16>, tensor<2x3x16xbf16>) -> tensor<2x3x16xbf16> {
    ^bb0(%p: tensor<2x3x16xbf16>, %q: tensor<2x3x16xbf16>):
      %r = nn.add %p, %q : (tensor<2x3x16xbf16>, tensor<2x3x16xbf16>) -> tensor<2x3x16xbf16>
      pipe.yield %r : tensor<2x3x16xbf16>
    }
    return %s, %o : tensor<2x3x16xbf16>, tensor<2x3x16xbf16>
  }

  // A lone add (pipec-fuse-elementwise leaves a group of one as it is)
  // becomes a loop of its own, which computes in float under bf16 storage,
  // and joins: before the norm, and after the norm's gradient.
  // CHECK-LABEL: func.func @lone
  // CHECK: %[[S:.*]] = pipe.fused(%arg0, %arg1) attributes {pipe.norm_prologue} : (tensor<2x16xbf16>, tensor<2x16xbf16>) -> tensor<2x16xbf16> {
  // CHECK-NEXT: ^bb0(%[[A:.*]]: tensor<2x16xf32>, %[[B:.*]]: tensor<2x16xf32>):
  // CHECK-NEXT: %[[R:.*]] = nn.add %[[A]], %[[B]] : (tensor<2x16xf32>, tensor<2x16xf32>) -> tensor<2x16xf32>
  // CHECK-NEXT: pipe.yield %[[R]] : tensor<2x16xf32>
  // CHECK-NEXT: }
  // CHECK-NEXT: nn.layer_norm %[[S]], %arg2
  // CHECK: %[[DX:.*]] = nn.layer_norm_grad
  // CHECK-NEXT: pipe.fused(%arg1, %[[DX]]) attributes {pipe.norm_epilogue}
  // CHECK-NEXT: ^bb0
  // CHECK-NEXT: nn.sub
  // CHECK-NOT: nn.sub
  // CHECK: return
  func.func @lone(%x: tensor<2x16xbf16>, %r: tensor<2x16xbf16>, %g: tensor<16xf32>, %dy: tensor<2x16xbf16>)
      -> (tensor<2x16xbf16>, tensor<2x16xbf16>, tensor<2x16xbf16>) {
    %s = nn.add %x, %r : (tensor<2x16xbf16>, tensor<2x16xbf16>) -> tensor<2x16xbf16>
    %n, %mean, %inv = nn.layer_norm %s, %g {centered = false} : (tensor<2x16xbf16>, tensor<16xf32>) -> (tensor<2x16xbf16>, tensor<2x1xf32>, tensor<2x1xf32>)
    %dx = nn.layer_norm_grad %dy, %s, %g {centered = false} : (tensor<2x16xbf16>, tensor<2x16xbf16>, tensor<16xf32>) -> tensor<2x16xbf16>
    %d = nn.sub %r, %dx : (tensor<2x16xbf16>, tensor<2x16xbf16>) -> tensor<2x16xbf16>
    return %s, %n, %d : tensor<2x16xbf16>, tensor<2x16xbf16>, tensor<2x16xbf16>
  }

  // Left alone: a scale of one element (the library expands it); a
  // gradient something else also reads; a loop reading a value computed
  // after the gradient (it cannot move up).
  // CHECK-LABEL: func.func @left_alone
  // CHECK-NOT: pipe.norm_
  // CHECK: return
  func.func @left_alone(%x: tensor<4x16xf32>, %g1: tensor<1xf32>, %g: tensor<16xf32>, %dy: tensor<4x16xf32>)
      -> (tensor<4x16xf32>, tensor<4x16xf32>, tensor<4x16xf32>, tensor<4x16xf32>) {
    %s = pipe.fused(%x) : (tensor<4x16xf32>) -> tensor<4x16xf32> {
    ^bb0(%p: tensor<4x16xf32>):
      %r = nn.relu %p : tensor<4x16xf32>
      pipe.yield %r : tensor<4x16xf32>
    }
    %n, %mean, %inv = nn.layer_norm %s, %g1 : (tensor<4x16xf32>, tensor<1xf32>) -> (tensor<4x16xf32>, tensor<4x1xf32>, tensor<4x1xf32>)
    %dx = nn.layer_norm_grad %dy, %x, %g : (tensor<4x16xf32>, tensor<4x16xf32>, tensor<16xf32>) -> tensor<4x16xf32>
    %t = pipe.fused(%dx) : (tensor<4x16xf32>) -> tensor<4x16xf32> {
    ^bb0(%p: tensor<4x16xf32>):
      %r = nn.relu %p : tensor<4x16xf32>
      pipe.yield %r : tensor<4x16xf32>
    }
    %dx2 = nn.layer_norm_grad %dy, %x, %g : (tensor<4x16xf32>, tensor<4x16xf32>, tensor<16xf32>) -> tensor<4x16xf32>
    %late = nn.relu %dy : tensor<4x16xf32>
    %u = pipe.fused(%dx2, %late) : (tensor<4x16xf32>, tensor<4x16xf32>) -> tensor<4x16xf32> {
    ^bb0(%p: tensor<4x16xf32>, %q: tensor<4x16xf32>):
      %r = nn.add %p, %q : (tensor<4x16xf32>, tensor<4x16xf32>) -> tensor<4x16xf32>
      pipe.yield %r : tensor<4x16xf32>
    }
    return %n, %dx, %t, %u : tensor<4x16xf32>, tensor<4x16xf32>, tensor<4x16xf32>, tensor<4x16xf32>
  }
}
