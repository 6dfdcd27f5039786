// RUN: pipec-opt %s --pipec-canonicalize-gemm | FileCheck %s

// An exported Linear on a 3-D input: Transpose(W) -> MatMul -> Add(bias)
// becomes one GEMM over the flattened rows with the transpose as transB and
// the bias as C; the plan's annotations stay on the GEMM.
// CHECK-LABEL: func.func @linear3d
// CHECK-SAME: (%[[X:.*]]: tensor<2x16x32xf32>, %[[W:.*]]: tensor<96x32xf32>, %[[B:.*]]: tensor<96xf32>)
// CHECK-NEXT: %[[X2:.*]] = nn.reshape %[[X]] {pipe.phase = #pipe.phase<fwd>, pipe.stage = 1 : i64} : tensor<2x16x32xf32> -> tensor<32x32xf32>
// CHECK-NEXT: %[[G:.*]] = nn.gemm %[[X2]], %[[W]], %[[B]] {pipe.phase = #pipe.phase<fwd>, pipe.stage = 1 : i64, transB = true} : (tensor<32x32xf32>, tensor<96x32xf32>, tensor<96xf32>) -> tensor<32x96xf32>
// CHECK-NEXT: %[[Y:.*]] = nn.reshape %[[G]] {{.*}} : tensor<32x96xf32> -> tensor<2x16x96xf32>
// CHECK-NEXT: return %[[Y]]
func.func @linear3d(%x: tensor<2x16x32xf32>, %w: tensor<96x32xf32>, %b: tensor<96xf32>) -> tensor<2x16x96xf32> {
  %t = nn.transpose %w {perm = array<i64: 1, 0>, pipe.stage = 1 : i64, pipe.phase = #pipe.phase<fwd>} : (tensor<96x32xf32>) -> tensor<32x96xf32>
  %y = nn.matmul %x, %t {pipe.stage = 1 : i64, pipe.phase = #pipe.phase<fwd>} : (tensor<2x16x32xf32>, tensor<32x96xf32>) -> tensor<2x16x96xf32>
  %z = nn.add %b, %y {pipe.stage = 1 : i64, pipe.phase = #pipe.phase<fwd>} : (tensor<96xf32>, tensor<2x16x96xf32>) -> tensor<2x16x96xf32>
  return %z : tensor<2x16x96xf32>
}

// 2-D: matmul + add of a [1, N] bias; a transposed operand folds into the
// gemm flag (transpose(d) with transA is d itself).
// CHECK-LABEL: func.func @matrix
// CHECK-NEXT: %[[G:.*]] = nn.gemm %arg0, %arg1, %arg2 : (tensor<8x4xf32>, tensor<4x5xf32>, tensor<1x5xf32>) -> tensor<8x5xf32>
// CHECK-NEXT: %[[T:.*]] = nn.gemm %arg3, %arg0 : (tensor<5x8xf32>, tensor<8x4xf32>) -> tensor<5x4xf32>
// CHECK-NEXT: return %[[G]], %[[T]]
func.func @matrix(%a: tensor<8x4xf32>, %w: tensor<4x5xf32>, %b: tensor<1x5xf32>, %d: tensor<5x8xf32>) -> (tensor<8x5xf32>, tensor<5x4xf32>) {
  %y = nn.matmul %a, %w : (tensor<8x4xf32>, tensor<4x5xf32>) -> tensor<8x5xf32>
  %z = nn.add %y, %b : (tensor<8x5xf32>, tensor<1x5xf32>) -> tensor<8x5xf32>
  %dt = nn.transpose %d {perm = array<i64: 1, 0>} : (tensor<5x8xf32>) -> tensor<8x5xf32>
  %g = nn.gemm %dt, %a {transA = true} : (tensor<8x5xf32>, tensor<8x4xf32>) -> tensor<5x4xf32>
  return %z, %g : tensor<8x5xf32>, tensor<5x4xf32>
}

// (A B)^T = B^T A^T: the transpose of a C-less gemm is a gemm.
// CHECK-LABEL: func.func @transposed_product
// CHECK-NEXT: %[[G:.*]] = nn.gemm %arg1, %arg0 {alpha = 5.000000e-01 : f32, transA = true, transB = true} : (tensor<4x5xf32>, tensor<8x4xf32>) -> tensor<5x8xf32>
// CHECK-NEXT: return %[[G]]
func.func @transposed_product(%a: tensor<8x4xf32>, %b: tensor<4x5xf32>) -> tensor<5x8xf32> {
  %g = nn.gemm %a, %b {alpha = 0.5 : f32} : (tensor<8x4xf32>, tensor<4x5xf32>) -> tensor<8x5xf32>
  %t = nn.transpose %g {perm = array<i64: 1, 0>} : (tensor<8x5xf32>) -> tensor<5x8xf32>
  return %t : tensor<5x8xf32>
}

// Left alone: a batched right operand, a gemm result used twice (the bias
// cannot join), and a bias that does not broadcast along the rows.
// CHECK-LABEL: func.func @unchanged
// CHECK-NEXT: nn.matmul
// CHECK-NEXT: nn.gemm %arg3, %arg4 :
// CHECK-NEXT: nn.add
// CHECK-NEXT: nn.add
// CHECK-NEXT: return
func.func @unchanged(%a: tensor<2x8x4xf32>, %b: tensor<2x4x5xf32>, %bias: tensor<8x5xf32>, %c: tensor<8x4xf32>, %w: tensor<4x5xf32>) -> (tensor<2x8x5xf32>, tensor<8x5xf32>, tensor<8x5xf32>) {
  %y = nn.matmul %a, %b : (tensor<2x8x4xf32>, tensor<2x4x5xf32>) -> tensor<2x8x5xf32>
  %g = nn.gemm %c, %w : (tensor<8x4xf32>, tensor<4x5xf32>) -> tensor<8x5xf32>
  %s = nn.add %g, %bias : (tensor<8x5xf32>, tensor<8x5xf32>) -> tensor<8x5xf32>
  %u = nn.add %g, %g : (tensor<8x5xf32>, tensor<8x5xf32>) -> tensor<8x5xf32>
  return %y, %s, %u : tensor<2x8x5xf32>, tensor<8x5xf32>, tensor<8x5xf32>
}

// Left alone across a stage cut: the transpose runs on stage 0 and the
// product on stage 1, and the bias add on stage 2; folding either would
// move a computation or a parameter's use to a stage the plan did not give it.
// CHECK-LABEL: func.func @across_stages
// CHECK-NEXT: %[[T:.*]] = nn.transpose
// CHECK-NEXT: %[[G:.*]] = nn.gemm %arg0, %[[T]] {pipe.stage = 1 : i64} :
// CHECK-NEXT: %[[Z:.*]] = nn.add %[[G]], %arg2 {pipe.stage = 2 : i64}
// CHECK-NEXT: return %[[Z]]
func.func @across_stages(%a: tensor<8x4xf32>, %w: tensor<5x4xf32>, %b: tensor<5xf32>) -> tensor<8x5xf32> {
  %t = nn.transpose %w {perm = array<i64: 1, 0>, pipe.stage = 0 : i64} : (tensor<5x4xf32>) -> tensor<4x5xf32>
  %y = nn.matmul %a, %t {pipe.stage = 1 : i64} : (tensor<8x4xf32>, tensor<4x5xf32>) -> tensor<8x5xf32>
  %z = nn.add %y, %b {pipe.stage = 2 : i64} : (tensor<8x5xf32>, tensor<5xf32>) -> tensor<8x5xf32>
  return %z : tensor<8x5xf32>
}

// Batched products in an outlined stage (after autodiff; attention's
// backward): a transpose of the last two axes of either operand becomes a
// trans flag of nn.batched_gemm, and a second such transpose of a
// batched_gemm's operand toggles it back. Other permutations stay
// transposes.
// CHECK-LABEL: func.func @batched
// CHECK-NEXT: %[[P:.*]] = nn.batched_gemm %arg0, %arg1 {pipe.phase = #pipe.phase<bwd_input>, pipe.stage = 0 : i64, transA = true} : (tensor<2x4x8x16xf32>, tensor<2x4x8x5xf32>) -> tensor<2x4x16x5xf32>
// CHECK-NEXT: %[[Q:.*]] = nn.batched_gemm %arg1, %arg2 {transB = true} : (tensor<2x4x8x5xf32>, tensor<4x6x5xf32>) -> tensor<2x4x8x6xf32>
// CHECK-NEXT: %[[R:.*]] = nn.batched_gemm %arg0, %arg3 {pipe.phase = #pipe.phase<bwd_input>, pipe.stage = 0 : i64} : (tensor<2x4x8x16xf32>, tensor<2x4x16x3xf32>) -> tensor<2x4x8x3xf32>
// CHECK-NEXT: %[[H:.*]] = nn.transpose %arg0 {perm = array<i64: 1, 0, 3, 2>}
// CHECK-NEXT: %[[E:.*]] = nn.transpose %arg4 {perm = array<i64: 1, 0, 2, 3>}
// CHECK-NEXT: %[[S:.*]] = nn.matmul %[[H]], %[[E]]
// CHECK-NEXT: return %[[P]], %[[Q]], %[[R]], %[[S]]
pipe.stage @stage_0 attributes {id = 0 : i64, replicas = 1 : i64} {
  func.func @batched(%a: tensor<2x4x8x16xf32>, %b: tensor<2x4x8x5xf32>, %c: tensor<4x6x5xf32>,
                     %d: tensor<2x4x16x3xf32>, %e: tensor<2x4x8x7xf32>)
      -> (tensor<2x4x16x5xf32>, tensor<2x4x8x6xf32>, tensor<2x4x8x3xf32>, tensor<4x2x16x7xf32>) {
    %at = nn.transpose %a {perm = array<i64: 0, 1, 3, 2>, pipe.stage = 0 : i64, pipe.phase = #pipe.phase<bwd_input>} : (tensor<2x4x8x16xf32>) -> tensor<2x4x16x8xf32>
    %p = nn.matmul %at, %b {pipe.stage = 0 : i64, pipe.phase = #pipe.phase<bwd_input>} : (tensor<2x4x16x8xf32>, tensor<2x4x8x5xf32>) -> tensor<2x4x16x5xf32>
    %ct = nn.transpose %c {perm = array<i64: 0, 2, 1>} : (tensor<4x6x5xf32>) -> tensor<4x5x6xf32>
    %q = nn.matmul %b, %ct : (tensor<2x4x8x5xf32>, tensor<4x5x6xf32>) -> tensor<2x4x8x6xf32>
    %at2 = nn.transpose %at {perm = array<i64: 0, 1, 3, 2>, pipe.stage = 0 : i64, pipe.phase = #pipe.phase<bwd_input>} : (tensor<2x4x16x8xf32>) -> tensor<2x4x8x16xf32>
    %r = nn.batched_gemm %at2, %d {transA = false, pipe.stage = 0 : i64, pipe.phase = #pipe.phase<bwd_input>} : (tensor<2x4x8x16xf32>, tensor<2x4x16x3xf32>) -> tensor<2x4x8x3xf32>
    %h = nn.transpose %a {perm = array<i64: 1, 0, 3, 2>} : (tensor<2x4x8x16xf32>) -> tensor<4x2x16x8xf32>
    %e2 = nn.transpose %e {perm = array<i64: 1, 0, 2, 3>} : (tensor<2x4x8x7xf32>) -> tensor<4x2x8x7xf32>
    %s = nn.matmul %h, %e2 : (tensor<4x2x16x8xf32>, tensor<4x2x8x7xf32>) -> tensor<4x2x16x7xf32>
    return %p, %q, %r, %s : tensor<2x4x16x5xf32>, tensor<2x4x8x6xf32>, tensor<2x4x8x3xf32>, tensor<4x2x16x7xf32>
  }
}

// Before autodiff (outside a stage) a batched product keeps its transpose:
// nn.batched_gemm has no gradient rule.
// CHECK-LABEL: func.func @batched_before_autodiff
// CHECK-NEXT: nn.transpose
// CHECK-NEXT: nn.matmul
func.func @batched_before_autodiff(%a: tensor<2x8x16xf32>, %b: tensor<2x8x5xf32>) -> tensor<2x16x5xf32> {
  %at = nn.transpose %a {perm = array<i64: 0, 2, 1>} : (tensor<2x8x16xf32>) -> tensor<2x16x8xf32>
  %p = nn.matmul %at, %b : (tensor<2x16x8xf32>, tensor<2x8x5xf32>) -> tensor<2x16x5xf32>
  return %p : tensor<2x16x5xf32>
}
