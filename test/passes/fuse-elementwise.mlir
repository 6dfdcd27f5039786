// RUN: pipec-opt %s --pipec-fuse-elementwise | FileCheck %s

// An exported erf-GELU (x * 0.5 * (1 + erf(x / sqrt 2))) is one loop; the
// erf and the divide are returned (saved for the backward), so the fused op
// yields them besides the result, and the scalar constants are inputs.
// CHECK-LABEL: func.func @fwd
// CHECK: %[[F:.*]]:3 = pipe.fused(%arg0, %{{.*}}, %{{.*}}, %{{.*}}) : (tensor<4x8xf32>, tensor<f32>, tensor<f32>, tensor<f32>) -> (tensor<4x8xf32>, tensor<4x8xf32>, tensor<4x8xf32>) {
// CHECK-NEXT: ^bb0(%[[X:.*]]: tensor<4x8xf32>, %[[S2:.*]]: tensor<f32>, %[[ONE:.*]]: tensor<f32>, %[[HALF:.*]]: tensor<f32>):
// CHECK-NEXT: %[[D:.*]] = nn.div %[[X]], %[[S2]]
// CHECK-NEXT: %[[E:.*]] = nn.erf %[[D]]
// CHECK-NEXT: %[[A:.*]] = nn.add %[[E]], %[[ONE]]
// CHECK-NEXT: %[[M:.*]] = nn.mul %[[X]], %[[A]]
// CHECK-NEXT: %[[H:.*]] = nn.mul %[[M]], %[[HALF]]
// CHECK-NEXT: pipe.yield %[[D]], %[[E]], %[[H]]
// CHECK: return %[[F]]#2, %[[F]]#0, %[[F]]#1
pipe.stage @stage_0 attributes {id = 0 : i64, replicas = 1 : i64} {
  func.func @fwd(%x: tensor<4x8xf32>) -> (tensor<4x8xf32>, tensor<4x8xf32> {pipe.saved = "div"}, tensor<4x8xf32> {pipe.saved = "erf"}) {
    %s2 = nn.constant dense<1.41421354> : tensor<f32>
    %one = nn.constant dense<1.0> : tensor<f32>
    %half = nn.constant dense<0.5> : tensor<f32>
    %d = nn.div %x, %s2 : (tensor<4x8xf32>, tensor<f32>) -> tensor<4x8xf32>
    %e = nn.erf %d : tensor<4x8xf32>
    %a = nn.add %e, %one : (tensor<4x8xf32>, tensor<f32>) -> tensor<4x8xf32>
    %m = nn.mul %x, %a : (tensor<4x8xf32>, tensor<4x8xf32>) -> tensor<4x8xf32>
    %h = nn.mul %m, %half : (tensor<4x8xf32>, tensor<f32>) -> tensor<4x8xf32>
    return %h, %d, %e : tensor<4x8xf32>, tensor<4x8xf32>, tensor<4x8xf32>
  }

  // A group value read by a non-element-wise op before the next candidate
  // ends the group: (sub, pow) and (div, mul) are two loops around the
  // reduction of a decomposed LayerNorm; a result of another shape (the
  // [4, 1] sqrt) is not fused with [4, 8] ones.
  // CHECK-LABEL: func.func @bwd_input
  // CHECK: %[[P:.*]]:2 = pipe.fused
  // CHECK: nn.sub
  // CHECK-NEXT: nn.pow
  // CHECK: nn.reduce_mean %[[P]]#1
  // CHECK-NEXT: nn.sqrt
  // CHECK-NEXT: %[[Q:.*]] = pipe.fused(%[[P]]#0
  // CHECK: nn.div
  // CHECK-NEXT: nn.mul
  // CHECK-NOT: pipe.fused
  // CHECK: return %[[Q]]
  func.func @bwd_input(%x: tensor<4x8xf32>, %mean: tensor<4x1xf32>, %scale: tensor<8xf32>) -> tensor<4x8xf32> {
    %two = nn.constant dense<2.0> : tensor<f32>
    %c = nn.sub %x, %mean : (tensor<4x8xf32>, tensor<4x1xf32>) -> tensor<4x8xf32>
    %sq = nn.pow %c, %two : (tensor<4x8xf32>, tensor<f32>) -> tensor<4x8xf32>
    %var = nn.reduce_mean %sq {axes = array<i64: 1>} : (tensor<4x8xf32>) -> tensor<4x1xf32>
    %std = nn.sqrt %var : tensor<4x1xf32>
    %n = nn.div %c, %std : (tensor<4x8xf32>, tensor<4x1xf32>) -> tensor<4x8xf32>
    %y = nn.mul %n, %scale : (tensor<4x8xf32>, tensor<8xf32>) -> tensor<4x8xf32>
    return %y : tensor<4x8xf32>
  }

  // A residual dropout: the dropout joins the add that reads it, and its
  // mask, returned for the backward, is a second result of the loop; in the
  // backward the dropout's gradient joins the sum of the residual paths.
  // CHECK-LABEL: func.func @fwd_dropout
  // CHECK: %[[R:.*]]:2 = pipe.fused(%arg0, %arg1) : (tensor<4x8xf32>, tensor<4x8xf32>) -> (tensor<4x8xi1>, tensor<4x8xf32>) {
  // CHECK-NEXT: ^bb0(%[[X:.*]]: tensor<4x8xf32>, %[[S:.*]]: tensor<4x8xf32>):
  // CHECK-NEXT: %[[D:.*]], %[[M:.*]] = nn.dropout %[[X]] {ratio = 1.000000e-01 : f32, training = true}
  // CHECK-NEXT: %[[A:.*]] = nn.add %[[D]], %[[S]]
  // CHECK-NEXT: pipe.yield %[[M]], %[[A]]
  // CHECK: return %[[R]]#1, %[[R]]#0
  func.func @fwd_dropout(%x: tensor<4x8xf32>, %skip: tensor<4x8xf32>) -> (tensor<4x8xf32>, tensor<4x8xi1> {pipe.saved = "mask"}) {
    %d, %m = nn.dropout %x {ratio = 0.1 : f32, training = true} : (tensor<4x8xf32>) -> (tensor<4x8xf32>, tensor<4x8xi1>)
    %a = nn.add %d, %skip : (tensor<4x8xf32>, tensor<4x8xf32>) -> tensor<4x8xf32>
    return %a, %m : tensor<4x8xf32>, tensor<4x8xi1>
  }
  // CHECK-LABEL: func.func @bwd_dropout
  // CHECK: pipe.fused
  // CHECK-NEXT: ^bb0
  // CHECK-NEXT: nn.dropout_grad
  // CHECK-NEXT: nn.add
  // CHECK-NEXT: pipe.yield
  func.func @bwd_dropout(%dy: tensor<4x8xf32>, %m: tensor<4x8xi1>, %other: tensor<4x8xf32>) -> tensor<4x8xf32> {
    %g = nn.dropout_grad %dy, %m {ratio = 0.1 : f32, training = true} : (tensor<4x8xf32>, tensor<4x8xi1>) -> tensor<4x8xf32>
    %s = nn.add %g, %other : (tensor<4x8xf32>, tensor<4x8xf32>) -> tensor<4x8xf32>
    return %s : tensor<4x8xf32>
  }

  // SwiGLU's backward (gate g, up u, silu s = g * sigmoid(g) kept): du = dh *
  // s is read by a GEMM (here a reduction) before the rest starts. The
  // sigmoid, which reads an argument only, and dh * u, a sibling of du (both
  // read dh), join du's loop where du is computed (hoisted: everything they
  // read is defined there); the product of the two groups merges them. One
  // loop yields du and dg.
  // CHECK-LABEL: func.func @bwd_swiglu
  // CHECK: %[[F:.*]]:2 = pipe.fused(%arg0, %arg1, %arg2, %arg3)
  // CHECK-NEXT: ^bb0(%[[DH:.*]]: tensor<4x8xf32>, %[[S:.*]]: tensor<4x8xf32>, %[[G:.*]]: tensor<4x8xf32>, %[[U:.*]]: tensor<4x8xf32>):
  // CHECK-NEXT: %[[DU:.*]] = nn.mul %[[DH]], %[[S]]
  // CHECK-NEXT: %[[SIG:.*]] = nn.sigmoid %[[G]]
  // CHECK-NEXT: %[[DS:.*]] = nn.mul %[[DH]], %[[U]]
  // CHECK-NEXT: %[[A:.*]] = nn.mul %[[DS]], %[[SIG]]
  // CHECK-NEXT: %[[B:.*]] = nn.mul %[[DS]], %[[G]]
  // CHECK-NEXT: %[[C:.*]] = nn.unary_grad <sigmoid> %[[B]], y = %[[SIG]]
  // CHECK-NEXT: %[[DG:.*]] = nn.add %[[A]], %[[C]]
  // CHECK-NEXT: pipe.yield %[[DU]], %[[DG]]
  // CHECK-NEXT: }
  // CHECK-NEXT: nn.reduce_mean %[[F]]#0
  // CHECK-NOT: pipe.fused
  // CHECK: return
  func.func @bwd_swiglu(%dh: tensor<4x8xf32>, %s: tensor<4x8xf32>, %g: tensor<4x8xf32>, %u: tensor<4x8xf32>) -> (tensor<4x1xf32>, tensor<4x8xf32>) {
    %du = nn.mul %dh, %s : (tensor<4x8xf32>, tensor<4x8xf32>) -> tensor<4x8xf32>
    %r = nn.reduce_mean %du {axes = array<i64: 1>} : (tensor<4x8xf32>) -> tensor<4x1xf32>
    %sig = nn.sigmoid %g : tensor<4x8xf32>
    %ds = nn.mul %dh, %u : (tensor<4x8xf32>, tensor<4x8xf32>) -> tensor<4x8xf32>
    %a = nn.mul %ds, %sig : (tensor<4x8xf32>, tensor<4x8xf32>) -> tensor<4x8xf32>
    %b = nn.mul %ds, %g : (tensor<4x8xf32>, tensor<4x8xf32>) -> tensor<4x8xf32>
    %c = nn.unary_grad <sigmoid> %b, y = %sig : tensor<4x8xf32>
    %dg = nn.add %a, %c : (tensor<4x8xf32>, tensor<4x8xf32>) -> tensor<4x8xf32>
    return %r, %dg : tensor<4x1xf32>, tensor<4x8xf32>
  }

  // Groups computed where their first op is when the later ops can move
  // there: tanh (a sibling of relu: both read x) and then sigmoid and abs of
  // y (merged by the product with exp) join relu's loop, which the
  // reduction reads before that product. The product with the reduction's
  // mean cannot move up there (the mean comes after) nor the loop down to
  // it (the reduction reads exp before), so it starts a second loop, which
  // the sum then merges into rather than into the first.
  // CHECK-LABEL: func.func @fwd_merge
  // CHECK: %[[P:.*]]:3 = pipe.fused(%arg0, %arg1)
  // CHECK-NEXT: ^bb0
  // CHECK-NEXT: nn.relu
  // CHECK-NEXT: nn.exp
  // CHECK-NEXT: nn.tanh
  // CHECK-NEXT: nn.neg
  // CHECK-NEXT: nn.sigmoid
  // CHECK-NEXT: nn.abs
  // CHECK-NEXT: nn.mul
  // CHECK-NEXT: pipe.yield
  // CHECK-NEXT: }
  // CHECK-NEXT: %[[M:.*]] = nn.reduce_mean %[[P]]#0
  // CHECK-NEXT: %[[Q:.*]] = pipe.fused(%[[P]]#1, %[[M]], %[[P]]#2)
  // CHECK-NEXT: ^bb0
  // CHECK-NEXT: nn.mul
  // CHECK-NEXT: nn.add
  // CHECK-NEXT: pipe.yield
  // CHECK-NOT: pipe.fused
  // CHECK: return %[[Q]], %[[M]]
  func.func @fwd_merge(%x: tensor<4x8xf32>, %y: tensor<4x8xf32>) -> (tensor<4x8xf32>, tensor<4x1xf32>) {
    %r = nn.relu %x : tensor<4x8xf32>
    %e = nn.exp %r : tensor<4x8xf32>
    %t = nn.tanh %x : tensor<4x8xf32>
    %m = nn.reduce_mean %e {axes = array<i64: 1>} : (tensor<4x8xf32>) -> tensor<4x1xf32>
    %n = nn.neg %t : tensor<4x8xf32>
    %k = nn.mul %n, %m : (tensor<4x8xf32>, tensor<4x1xf32>) -> tensor<4x8xf32>
    %s = nn.sigmoid %y : tensor<4x8xf32>
    %a = nn.abs %s : tensor<4x8xf32>
    %p = nn.mul %e, %a : (tensor<4x8xf32>, tensor<4x8xf32>) -> tensor<4x8xf32>
    %q = nn.add %p, %k : (tensor<4x8xf32>, tensor<4x8xf32>) -> tensor<4x8xf32>
    return %q, %m : tensor<4x8xf32>, tensor<4x1xf32>
  }

  // A loop computes a value once: the second sigmoid of x (recomputed
  // for another reader) is the first. Dropouts, which draw, are not merged.
  // CHECK-LABEL: func.func @bwd_once
  // CHECK: pipe.fused
  // CHECK-NEXT: ^bb0(%[[X:.*]]: tensor<4x8xf32>)
  // CHECK-NEXT: %[[S:.*]] = nn.sigmoid %[[X]]
  // CHECK-NEXT: %[[A:.*]] = nn.add %[[S]], %[[S]]
  // CHECK-NEXT: nn.dropout %[[A]]
  // CHECK-NEXT: nn.dropout %[[A]]
  // CHECK-NEXT: nn.add
  // CHECK-NEXT: pipe.yield
  func.func @bwd_once(%x: tensor<4x8xf32>) -> tensor<4x8xf32> {
    %s1 = nn.sigmoid %x : tensor<4x8xf32>
    %s2 = nn.sigmoid %x : tensor<4x8xf32>
    %a = nn.add %s1, %s2 : (tensor<4x8xf32>, tensor<4x8xf32>) -> tensor<4x8xf32>
    %d1, %m1 = nn.dropout %a {ratio = 0.1 : f32, training = true} : (tensor<4x8xf32>) -> (tensor<4x8xf32>, tensor<4x8xi1>)
    %d2, %m2 = nn.dropout %a {ratio = 0.1 : f32, training = true} : (tensor<4x8xf32>) -> (tensor<4x8xf32>, tensor<4x8xi1>)
    %r = nn.add %d1, %d2 : (tensor<4x8xf32>, tensor<4x8xf32>) -> tensor<4x8xf32>
    return %r : tensor<4x8xf32>
  }

  // A group nothing reads is dead and goes: here the chain of the [3, 4]
  // values (it read exp(a) and counted as a reader at its own anchor, the
  // neg), so that the loop of the two exps and their sum, computed where
  // exp(b) is, leaves nothing behind reading its result before it.
  // CHECK-LABEL: func.func @dead
  // CHECK: %[[F:.*]] = pipe.fused(%arg0, %arg1)
  // CHECK-NEXT: ^bb0
  // CHECK-NEXT: nn.exp
  // CHECK-NEXT: nn.exp
  // CHECK-NEXT: nn.add
  // CHECK-NEXT: pipe.yield
  // CHECK-NEXT: }
  // CHECK-NEXT: return %[[F]]
  func.func @dead(%a: tensor<4xf32>, %b: tensor<4xf32>, %k: tensor<3x4xf32>) -> tensor<4xf32> {
    %g2 = nn.exp %a : tensor<4xf32>
    %y = nn.add %g2, %k : (tensor<4xf32>, tensor<3x4xf32>) -> tensor<3x4xf32>
    %g1 = nn.exp %b : tensor<4xf32>
    %y2 = nn.neg %y : tensor<3x4xf32>
    %o = nn.add %g1, %g2 : (tensor<4xf32>, tensor<4xf32>) -> tensor<4xf32>
    return %o : tensor<4xf32>
  }

  // The step's in-place updates are never fused.
  // CHECK-LABEL: func.func @step
  // CHECK-NOT: pipe.fused
  func.func @step(%a: tensor<4xf32>) -> tensor<4xf32> {
    %b = nn.relu %a : tensor<4xf32>
    %c = nn.relu %b : tensor<4xf32>
    return %c : tensor<4xf32>
  }
}
