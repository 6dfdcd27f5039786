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

  // The step's in-place updates are never fused.
  // CHECK-LABEL: func.func @step
  // CHECK-NOT: pipe.fused
  func.func @step(%a: tensor<4xf32>) -> tensor<4xf32> {
    %b = nn.relu %a : tensor<4xf32>
    %c = nn.relu %b : tensor<4xf32>
    return %c : tensor<4xf32>
  }
}
