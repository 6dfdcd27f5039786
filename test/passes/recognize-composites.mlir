// RUN: pipec-opt %s --pipec-recognize-composites | FileCheck %s

// nn.LayerNorm(32) as PyTorch exports it at opset 13: one nn.layer_norm.
// CHECK-LABEL: func.func @layer_norm
// CHECK-NEXT: %[[Y:.*]], %{{.*}}, %{{.*}} = nn.layer_norm %arg0, %arg1, %arg2 {axis = 2 : i64, epsilon = 9.99999997E-7 : f32, pipe.stage = 0 : i64}
// CHECK-NEXT: return %[[Y]]
func.func @layer_norm(%x: tensor<2x16x32xf32>, %w: tensor<32xf32>, %b: tensor<32xf32>) -> tensor<2x16x32xf32> {
  %two = nn.constant {pipe.stage = 0 : i64} dense<2.0> : tensor<f32>
  %eps = nn.constant {pipe.stage = 0 : i64} dense<1.0e-6> : tensor<f32>
  %mean = nn.reduce_mean %x {axes = array<i64: 2>, pipe.stage = 0 : i64} : (tensor<2x16x32xf32>) -> tensor<2x16x1xf32>
  %d = nn.sub %x, %mean {pipe.stage = 0 : i64} : (tensor<2x16x32xf32>, tensor<2x16x1xf32>) -> tensor<2x16x32xf32>
  %p = nn.pow %d, %two {pipe.stage = 0 : i64} : (tensor<2x16x32xf32>, tensor<f32>) -> tensor<2x16x32xf32>
  %var = nn.reduce_mean %p {axes = array<i64: 2>, pipe.stage = 0 : i64} : (tensor<2x16x32xf32>) -> tensor<2x16x1xf32>
  %ve = nn.add %var, %eps {pipe.stage = 0 : i64} : (tensor<2x16x1xf32>, tensor<f32>) -> tensor<2x16x1xf32>
  %s = nn.sqrt %ve {pipe.stage = 0 : i64} : tensor<2x16x1xf32>
  %n = nn.div %d, %s {pipe.stage = 0 : i64} : (tensor<2x16x32xf32>, tensor<2x16x1xf32>) -> tensor<2x16x32xf32>
  %m = nn.mul %n, %w {pipe.stage = 0 : i64} : (tensor<2x16x32xf32>, tensor<32xf32>) -> tensor<2x16x32xf32>
  %y = nn.add %m, %b {pipe.stage = 0 : i64} : (tensor<2x16x32xf32>, tensor<32xf32>) -> tensor<2x16x32xf32>
  return %y : tensor<2x16x32xf32>
}

// RMSNorm as the exporters write Hugging Face's modules: Llama at opset 17
// (1 / sqrt, weight first), at opset 20 (Reciprocal, weight second), Gemma
// (scale 1 + w), a power of -0.5 and x / sqrt without a scale (scale 1):
// each one nn.layer_norm with centered = false.
// CHECK-LABEL: func.func @rms_norm
// CHECK-DAG: %[[A:.*]], %{{.*}}, %{{.*}} = nn.layer_norm %arg0, %arg1 {axis = 2 : i64, centered = false, epsilon = 9.99999997E-7 : f32}
// CHECK-DAG: %[[B:.*]], %{{.*}}, %{{.*}} = nn.layer_norm %arg0, %arg1 {axis = 2 : i64, centered = false}
// CHECK-DAG: %[[G:.*]] = nn.add %{{.*}}, %arg1
// CHECK-DAG: %[[C:.*]], %{{.*}}, %{{.*}} = nn.layer_norm %arg0, %[[G]] {axis = 2 : i64, centered = false, epsilon = 9.99999997E-7 : f32}
// CHECK-DAG: %[[D:.*]], %{{.*}}, %{{.*}} = nn.layer_norm %arg0, %arg1 {axis = 1 : i64, centered = false, epsilon = 9.99999997E-7 : f32}
// CHECK-DAG: %[[ONES:.*]] = nn.constant dense<1.000000e+00> : tensor<32xf32>
// CHECK-DAG: %[[E:.*]], %{{.*}}, %{{.*}} = nn.layer_norm %arg0, %[[ONES]] {axis = 2 : i64, centered = false, epsilon = 0.000000e+00 : f32}
// CHECK-NOT: nn.sqrt
// CHECK-NOT: nn.pow
// CHECK: return %[[A]], %[[B]], %[[C]], %[[D]], %[[E]]
func.func @rms_norm(%x: tensor<2x16x32xf32>, %w: tensor<32xf32>) -> (tensor<2x16x32xf32>, tensor<2x16x32xf32>, tensor<2x16x32xf32>, tensor<2x16x32xf32>, tensor<2x16x32xf32>) {
  %two = nn.constant dense<2.0> : tensor<f32>
  %one = nn.constant dense<1.0> : tensor<f32>
  %eps = nn.constant dense<1.0e-6> : tensor<f32>
  %eps5 = nn.constant dense<1.0e-5> : tensor<f32>
  %zero = nn.constant dense<0.0> : tensor<f32>
  %mhalf = nn.constant dense<-0.5> : tensor<f32>
  // Llama, opset 17.
  %p = nn.pow %x, %two : (tensor<2x16x32xf32>, tensor<f32>) -> tensor<2x16x32xf32>
  %v = nn.reduce_mean %p {axes = array<i64: 2>} : (tensor<2x16x32xf32>) -> tensor<2x16x1xf32>
  %ve = nn.add %v, %eps : (tensor<2x16x1xf32>, tensor<f32>) -> tensor<2x16x1xf32>
  %s = nn.sqrt %ve : tensor<2x16x1xf32>
  %r = nn.div %one, %s : (tensor<f32>, tensor<2x16x1xf32>) -> tensor<2x16x1xf32>
  %n = nn.mul %x, %r : (tensor<2x16x32xf32>, tensor<2x16x1xf32>) -> tensor<2x16x32xf32>
  %a = nn.mul %w, %n : (tensor<32xf32>, tensor<2x16x32xf32>) -> tensor<2x16x32xf32>
  // Llama, opset 20: x * x, Reciprocal, eps first.
  %p2 = nn.mul %x, %x : (tensor<2x16x32xf32>, tensor<2x16x32xf32>) -> tensor<2x16x32xf32>
  %v2 = nn.reduce_mean %p2 {axes = array<i64: 2>} : (tensor<2x16x32xf32>) -> tensor<2x16x1xf32>
  %ve2 = nn.add %eps5, %v2 : (tensor<f32>, tensor<2x16x1xf32>) -> tensor<2x16x1xf32>
  %s2 = nn.sqrt %ve2 : tensor<2x16x1xf32>
  %r2 = nn.reciprocal %s2 : tensor<2x16x1xf32>
  %n2 = nn.mul %r2, %x : (tensor<2x16x1xf32>, tensor<2x16x32xf32>) -> tensor<2x16x32xf32>
  %b = nn.mul %n2, %w : (tensor<2x16x32xf32>, tensor<32xf32>) -> tensor<2x16x32xf32>
  // Gemma: the scale is 1 + w.
  %p3 = nn.pow %x, %two : (tensor<2x16x32xf32>, tensor<f32>) -> tensor<2x16x32xf32>
  %v3 = nn.reduce_mean %p3 {axes = array<i64: 2>} : (tensor<2x16x32xf32>) -> tensor<2x16x1xf32>
  %ve3 = nn.add %v3, %eps : (tensor<2x16x1xf32>, tensor<f32>) -> tensor<2x16x1xf32>
  %s3 = nn.sqrt %ve3 : tensor<2x16x1xf32>
  %r3 = nn.reciprocal %s3 : tensor<2x16x1xf32>
  %n3 = nn.mul %x, %r3 : (tensor<2x16x32xf32>, tensor<2x16x1xf32>) -> tensor<2x16x32xf32>
  %g = nn.add %one, %w : (tensor<f32>, tensor<32xf32>) -> tensor<32xf32>
  %c = nn.mul %n3, %g : (tensor<2x16x32xf32>, tensor<32xf32>) -> tensor<2x16x32xf32>
  // Over the last two axes, r as a power of -0.5; the scale broadcasts.
  %p4 = nn.pow %x, %two : (tensor<2x16x32xf32>, tensor<f32>) -> tensor<2x16x32xf32>
  %v4 = nn.reduce_mean %p4 {axes = array<i64: 1, 2>} : (tensor<2x16x32xf32>) -> tensor<2x1x1xf32>
  %ve4 = nn.add %v4, %eps : (tensor<2x1x1xf32>, tensor<f32>) -> tensor<2x1x1xf32>
  %r4 = nn.pow %ve4, %mhalf : (tensor<2x1x1xf32>, tensor<f32>) -> tensor<2x1x1xf32>
  %n4 = nn.mul %x, %r4 : (tensor<2x16x32xf32>, tensor<2x1x1xf32>) -> tensor<2x16x32xf32>
  %d = nn.mul %n4, %w : (tensor<2x16x32xf32>, tensor<32xf32>) -> tensor<2x16x32xf32>
  // x / sqrt(mean(x^2)) without a scale.
  %p5 = nn.pow %x, %two : (tensor<2x16x32xf32>, tensor<f32>) -> tensor<2x16x32xf32>
  %v5 = nn.reduce_mean %p5 {axes = array<i64: 2>} : (tensor<2x16x32xf32>) -> tensor<2x16x1xf32>
  %ve5 = nn.add %v5, %zero : (tensor<2x16x1xf32>, tensor<f32>) -> tensor<2x16x1xf32>
  %s5 = nn.sqrt %ve5 : tensor<2x16x1xf32>
  %e = nn.div %x, %s5 : (tensor<2x16x32xf32>, tensor<2x16x1xf32>) -> tensor<2x16x32xf32>
  return %a, %b, %c, %d, %e : tensor<2x16x32xf32>, tensor<2x16x32xf32>, tensor<2x16x32xf32>, tensor<2x16x32xf32>, tensor<2x16x32xf32>
}

// Not an RMSNorm: the mean square is used elsewhere too, the mean is over a
// leading axis, and the square is of another value.
// CHECK-LABEL: func.func @not_rms_norm
// CHECK-NOT: nn.layer_norm
// CHECK: return
func.func @not_rms_norm(%x: tensor<2x16x32xf32>, %y: tensor<2x16x32xf32>) -> (tensor<2x16x32xf32>, tensor<2x16x1xf32>, tensor<2x16x32xf32>, tensor<2x16x32xf32>) {
  %two = nn.constant dense<2.0> : tensor<f32>
  %eps = nn.constant dense<1.0e-6> : tensor<f32>
  %p = nn.pow %x, %two : (tensor<2x16x32xf32>, tensor<f32>) -> tensor<2x16x32xf32>
  %v = nn.reduce_mean %p {axes = array<i64: 2>} : (tensor<2x16x32xf32>) -> tensor<2x16x1xf32>
  %ve = nn.add %v, %eps : (tensor<2x16x1xf32>, tensor<f32>) -> tensor<2x16x1xf32>
  %s = nn.sqrt %ve : tensor<2x16x1xf32>
  %n = nn.div %x, %s : (tensor<2x16x32xf32>, tensor<2x16x1xf32>) -> tensor<2x16x32xf32>
  %p2 = nn.pow %x, %two : (tensor<2x16x32xf32>, tensor<f32>) -> tensor<2x16x32xf32>
  %v2 = nn.reduce_mean %p2 {axes = array<i64: 1>} : (tensor<2x16x32xf32>) -> tensor<2x1x32xf32>
  %ve2 = nn.add %v2, %eps : (tensor<2x1x32xf32>, tensor<f32>) -> tensor<2x1x32xf32>
  %s2 = nn.sqrt %ve2 : tensor<2x1x32xf32>
  %n2 = nn.div %x, %s2 : (tensor<2x16x32xf32>, tensor<2x1x32xf32>) -> tensor<2x16x32xf32>
  %p3 = nn.pow %y, %two : (tensor<2x16x32xf32>, tensor<f32>) -> tensor<2x16x32xf32>
  %v3 = nn.reduce_mean %p3 {axes = array<i64: 2>} : (tensor<2x16x32xf32>) -> tensor<2x16x1xf32>
  %ve3 = nn.add %v3, %eps : (tensor<2x16x1xf32>, tensor<f32>) -> tensor<2x16x1xf32>
  %s3 = nn.sqrt %ve3 : tensor<2x16x1xf32>
  %n3 = nn.div %x, %s3 : (tensor<2x16x32xf32>, tensor<2x16x1xf32>) -> tensor<2x16x32xf32>
  return %n, %v, %n2, %n3 : tensor<2x16x32xf32>, tensor<2x16x1xf32>, tensor<2x16x32xf32>, tensor<2x16x32xf32>
}

// Hugging Face's apply_rotary_pos_emb: q * cos + rotate_half(q) * sin with
// the halves as slices (opset 20) and, operands swapped, as torch.chunk's
// split: each one nn.rotary. The third has its halves the wrong way round
// (x1 negated): not a rotation R, left alone.
// CHECK-LABEL: func.func @rotary
// CHECK-DAG: %[[A:.*]] = nn.rotary %arg0, %arg1, %arg2 : (tensor<2x4x16x8xf32>, tensor<1x1x16x8xf32>, tensor<1x1x16x8xf32>) -> tensor<2x4x16x8xf32>
// CHECK-DAG: %[[B:.*]] = nn.rotary %arg0, %arg1, %arg2 : (tensor<2x4x16x8xf32>, tensor<1x1x16x8xf32>, tensor<1x1x16x8xf32>) -> tensor<2x4x16x8xf32>
// CHECK-DAG: %[[C:.*]] = nn.add
// CHECK: return %[[A]], %[[B]], %[[C]]
func.func @rotary(%x: tensor<2x4x16x8xf32>, %cos: tensor<1x1x16x8xf32>, %sin: tensor<1x1x16x8xf32>) -> (tensor<2x4x16x8xf32>, tensor<2x4x16x8xf32>, tensor<2x4x16x8xf32>) {
  %m = nn.mul %x, %cos : (tensor<2x4x16x8xf32>, tensor<1x1x16x8xf32>) -> tensor<2x4x16x8xf32>
  %lo = nn.slice %x {ends = array<i64: 2, 4, 16, 4>, starts = array<i64: 0, 0, 0, 0>, steps = array<i64: 1, 1, 1, 1>} : (tensor<2x4x16x8xf32>) -> tensor<2x4x16x4xf32>
  %hi = nn.slice %x {ends = array<i64: 2, 4, 16, 8>, starts = array<i64: 0, 0, 0, 4>, steps = array<i64: 1, 1, 1, 1>} : (tensor<2x4x16x8xf32>) -> tensor<2x4x16x4xf32>
  %n = nn.neg %hi : tensor<2x4x16x4xf32>
  %r = nn.concat %n, %lo {axis = -1 : i64} : (tensor<2x4x16x4xf32>, tensor<2x4x16x4xf32>) -> tensor<2x4x16x8xf32>
  %rs = nn.mul %r, %sin : (tensor<2x4x16x8xf32>, tensor<1x1x16x8xf32>) -> tensor<2x4x16x8xf32>
  %a = nn.add %m, %rs : (tensor<2x4x16x8xf32>, tensor<2x4x16x8xf32>) -> tensor<2x4x16x8xf32>
  %halves:2 = nn.split %x {axis = 3 : i64, sizes = array<i64: 4, 4>} : (tensor<2x4x16x8xf32>) -> (tensor<2x4x16x4xf32>, tensor<2x4x16x4xf32>)
  %n2 = nn.neg %halves#1 : tensor<2x4x16x4xf32>
  %r2 = nn.concat %n2, %halves#0 {axis = 3 : i64} : (tensor<2x4x16x4xf32>, tensor<2x4x16x4xf32>) -> tensor<2x4x16x8xf32>
  %rs2 = nn.mul %sin, %r2 : (tensor<1x1x16x8xf32>, tensor<2x4x16x8xf32>) -> tensor<2x4x16x8xf32>
  %m2 = nn.mul %cos, %x : (tensor<1x1x16x8xf32>, tensor<2x4x16x8xf32>) -> tensor<2x4x16x8xf32>
  %b = nn.add %rs2, %m2 : (tensor<2x4x16x8xf32>, tensor<2x4x16x8xf32>) -> tensor<2x4x16x8xf32>
  %m3 = nn.mul %x, %cos : (tensor<2x4x16x8xf32>, tensor<1x1x16x8xf32>) -> tensor<2x4x16x8xf32>
  %lo3 = nn.slice %x {ends = array<i64: 2, 4, 16, 4>, starts = array<i64: 0, 0, 0, 0>, steps = array<i64: 1, 1, 1, 1>} : (tensor<2x4x16x8xf32>) -> tensor<2x4x16x4xf32>
  %hi3 = nn.slice %x {ends = array<i64: 2, 4, 16, 8>, starts = array<i64: 0, 0, 0, 4>, steps = array<i64: 1, 1, 1, 1>} : (tensor<2x4x16x8xf32>) -> tensor<2x4x16x4xf32>
  %n3 = nn.neg %lo3 : tensor<2x4x16x4xf32>
  %r3 = nn.concat %n3, %hi3 {axis = -1 : i64} : (tensor<2x4x16x4xf32>, tensor<2x4x16x4xf32>) -> tensor<2x4x16x8xf32>
  %rs3 = nn.mul %r3, %sin : (tensor<2x4x16x8xf32>, tensor<1x1x16x8xf32>) -> tensor<2x4x16x8xf32>
  %c = nn.add %m3, %rs3 : (tensor<2x4x16x8xf32>, tensor<2x4x16x8xf32>) -> tensor<2x4x16x8xf32>
  return %a, %b, %c : tensor<2x4x16x8xf32>, tensor<2x4x16x8xf32>, tensor<2x4x16x8xf32>
}

// Attention as exporters write it: q · transpose(k), the masked softmax,
// · v (the transpose absorbed); a plain scaled softmax without a mask and a
// pre-transposed key (transposed back for nn.attention); and a softmax whose
// scores are used elsewhere too (left alone: they must exist).
// CHECK-LABEL: func.func @attention
// CHECK-DAG: %[[A:.*]], %{{.*}} = nn.attention %arg0, %arg1, %arg2, %arg4 {fill = -1.000000e+09 : f32, scale = 0.353553385 : f32} : (tensor<2x4x16x8xf32>, tensor<2x4x16x8xf32>, tensor<2x4x16x8xf32>, tensor<1x1x16x16xi1>) -> (tensor<2x4x16x8xf32>, tensor<2x4x16x1xf32>)
// CHECK-DAG: %[[KT:.*]] = nn.transpose %arg3 {perm = array<i64: 0, 1, 3, 2>}
// CHECK-DAG: %[[B:.*]], %{{.*}} = nn.attention %arg0, %[[KT]], %arg2 {scale = 1.250000e-01 : f32} : (tensor<2x4x16x8xf32>, tensor<2x4x16x8xf32>, tensor<2x4x16x8xf32>) -> (tensor<2x4x16x8xf32>, tensor<2x4x16x1xf32>)
// CHECK-DAG: %[[S:.*]] = nn.matmul %arg0, %arg3
// CHECK-DAG: %[[C:.*]] = nn.matmul %{{.*}}, %arg2
// CHECK: return %[[A]], %[[B]], %[[C]], %[[S]]
func.func @attention(%q: tensor<2x4x16x8xf32>, %k: tensor<2x4x16x8xf32>, %v: tensor<2x4x16x8xf32>, %kt: tensor<2x4x8x16xf32>, %mask: tensor<1x1x16x16xi1>) -> (tensor<2x4x16x8xf32>, tensor<2x4x16x8xf32>, tensor<2x4x16x8xf32>, tensor<2x4x16x16xf32>) {
  %t = nn.transpose %k {perm = array<i64: 0, 1, 3, 2>} : (tensor<2x4x16x8xf32>) -> tensor<2x4x8x16xf32>
  %s = nn.matmul %q, %t : (tensor<2x4x16x8xf32>, tensor<2x4x8x16xf32>) -> tensor<2x4x16x16xf32>
  %p = nn.masked_softmax %s, %mask {fill = -1.0e9 : f32, scale = 0.353553385 : f32} : (tensor<2x4x16x16xf32>, tensor<1x1x16x16xi1>) -> tensor<2x4x16x16xf32>
  %a = nn.matmul %p, %v : (tensor<2x4x16x16xf32>, tensor<2x4x16x8xf32>) -> tensor<2x4x16x8xf32>
  %c = nn.constant dense<0.125> : tensor<f32>
  %s2 = nn.matmul %q, %kt : (tensor<2x4x16x8xf32>, tensor<2x4x8x16xf32>) -> tensor<2x4x16x16xf32>
  %z2 = nn.mul %s2, %c : (tensor<2x4x16x16xf32>, tensor<f32>) -> tensor<2x4x16x16xf32>
  %p2 = nn.softmax %z2 {axis = -1 : i64} : (tensor<2x4x16x16xf32>) -> tensor<2x4x16x16xf32>
  %b = nn.matmul %p2, %v : (tensor<2x4x16x16xf32>, tensor<2x4x16x8xf32>) -> tensor<2x4x16x8xf32>
  %s3 = nn.matmul %q, %kt : (tensor<2x4x16x8xf32>, tensor<2x4x8x16xf32>) -> tensor<2x4x16x16xf32>
  %p3 = nn.softmax %s3 {axis = -1 : i64} : (tensor<2x4x16x16xf32>) -> tensor<2x4x16x16xf32>
  %c3 = nn.matmul %p3, %v : (tensor<2x4x16x16xf32>, tensor<2x4x16x8xf32>) -> tensor<2x4x16x8xf32>
  return %a, %b, %c3, %s3 : tensor<2x4x16x8xf32>, tensor<2x4x16x8xf32>, tensor<2x4x16x8xf32>, tensor<2x4x16x16xf32>
}

// scaled_dot_product_attention as the dynamo exporter writes it: the
// softmax guarded by where(isnan(P), 0, P). With a finite fill the guard is
// P and the attention fuses; with -inf (a fully masked row is NaN) it stays.
// CHECK-LABEL: func.func @sdpa_guard
// CHECK: %[[A:.*]], %{{.*}} = nn.attention %arg0, %arg1, %arg2, %arg3 {fill = -3.40282347E+38 : f32, scale = 0.353553385 : f32}
// CHECK: nn.masked_softmax
// CHECK: nn.where
// CHECK: return %[[A]]
func.func @sdpa_guard(%q: tensor<2x4x16x8xf32>, %k: tensor<2x4x16x8xf32>, %v: tensor<2x4x16x8xf32>, %mask: tensor<1x1x16x16xi1>) -> (tensor<2x4x16x8xf32>, tensor<2x4x16x8xf32>) {
  %true = nn.constant dense<true> : tensor<i1>
  %zero = nn.constant dense<0.0> : tensor<f32>
  %t = nn.transpose %k {perm = array<i64: 0, 1, 3, 2>} : (tensor<2x4x16x8xf32>) -> tensor<2x4x8x16xf32>
  %s = nn.matmul %q, %t : (tensor<2x4x16x8xf32>, tensor<2x4x8x16xf32>) -> tensor<2x4x16x16xf32>
  %p = nn.masked_softmax %s, %mask {fill = -3.40282347E+38 : f32, scale = 0.353553385 : f32} : (tensor<2x4x16x16xf32>, tensor<1x1x16x16xi1>) -> tensor<2x4x16x16xf32>
  %e = nn.equal %p, %p : (tensor<2x4x16x16xf32>, tensor<2x4x16x16xf32>) -> tensor<2x4x16x16xi1>
  %n = nn.xor %e, %true : (tensor<2x4x16x16xi1>, tensor<i1>) -> tensor<2x4x16x16xi1>
  %g = nn.where %n, %zero, %p : (tensor<2x4x16x16xi1>, tensor<f32>, tensor<2x4x16x16xf32>) -> tensor<2x4x16x16xf32>
  %a = nn.matmul %g, %v : (tensor<2x4x16x16xf32>, tensor<2x4x16x8xf32>) -> tensor<2x4x16x8xf32>
  %t2 = nn.transpose %k {perm = array<i64: 0, 1, 3, 2>} : (tensor<2x4x16x8xf32>) -> tensor<2x4x8x16xf32>
  %s2 = nn.matmul %q, %t2 : (tensor<2x4x16x8xf32>, tensor<2x4x8x16xf32>) -> tensor<2x4x16x16xf32>
  %p2 = nn.masked_softmax %s2, %mask {fill = 0xFF800000 : f32, scale = 0.353553385 : f32} : (tensor<2x4x16x16xf32>, tensor<1x1x16x16xi1>) -> tensor<2x4x16x16xf32>
  %e2 = nn.equal %p2, %p2 : (tensor<2x4x16x16xf32>, tensor<2x4x16x16xf32>) -> tensor<2x4x16x16xi1>
  %n2 = nn.xor %e2, %true : (tensor<2x4x16x16xi1>, tensor<i1>) -> tensor<2x4x16x16xi1>
  %g2 = nn.where %n2, %zero, %p2 : (tensor<2x4x16x16xi1>, tensor<f32>, tensor<2x4x16x16xf32>) -> tensor<2x4x16x16xf32>
  %b = nn.matmul %g2, %v : (tensor<2x4x16x16xf32>, tensor<2x4x16x8xf32>) -> tensor<2x4x16x8xf32>
  return %a, %b : tensor<2x4x16x8xf32>, tensor<2x4x16x8xf32>
}

// Attention dropout (GPT-2's and BERT's attn_pdrop): softmax -> dropout ->
// matmul is one nn.attention carrying the dropout's ratio and the op part of
// its mask's key (the FNV-1a hash of its node name, or its seed), for the
// masked softmax, a plain one under the SDPA NaN guard, and an additive
// mask. An inference-mode dropout drops nothing: no dropout attributes. A
// dropout whose mask is read elsewhere stays, and so does its attention.
// CHECK-LABEL: func.func @attention_dropout
// CHECK-DAG: %[[A:.*]], %{{.*}} = nn.attention %arg0, %{{.*}}, %arg2, %arg3 {dropout_op_id = 4768036628430608398 : i64, dropout_ratio = 1.000000e-01 : f32, fill = -1.000000e+09 : f32, scale = 0.353553385 : f32}
// CHECK-DAG: %[[B:.*]], %{{.*}} = nn.attention %arg0, %arg1, %arg2, %arg3 {dropout_op_id = 7 : i64, dropout_ratio = 2.500000e-01 : f32, fill = -3.40282347E+38 : f32, scale = 0.353553385 : f32}
// CHECK-DAG: %[[C:.*]], %{{.*}} = nn.attention %arg0, %{{.*}}, %arg2, %{{.*}} {dropout_op_id = 7 : i64, dropout_ratio = 5.000000e-01 : f32, scale = 1.250000e-01 : f32}
// CHECK-DAG: %[[D:.*]], %{{.*}} = nn.attention %arg0, %{{.*}}, %arg2 {scale = 1.250000e-01 : f32} :
// CHECK-DAG: %[[KEEP:[^,]*]], %{{.*}} = nn.dropout %{{.*}} {ratio = 1.000000e-01 : f32, training = true}
// CHECK-DAG: %[[E:.*]] = nn.matmul %[[KEEP]], %arg2
// CHECK: return %[[A]], %[[B]], %[[C]], %[[D]], %[[E]],
func.func @attention_dropout(%q: tensor<2x4x16x8xf32>, %k: tensor<2x4x16x8xf32>, %v: tensor<2x4x16x8xf32>, %mask: tensor<1x1x16x16xi1>, %in: tensor<2x1x16x16xf32>) -> (tensor<2x4x16x8xf32>, tensor<2x4x16x8xf32>, tensor<2x4x16x8xf32>, tensor<2x4x16x8xf32>, tensor<2x4x16x8xf32>, tensor<2x4x16x16xi1>) {
  %c = nn.constant dense<0.125> : tensor<f32>
  %true = nn.constant dense<true> : tensor<i1>
  %zero = nn.constant dense<0.0> : tensor<f32>
  %t = nn.transpose %k {perm = array<i64: 0, 1, 3, 2>} : (tensor<2x4x16x8xf32>) -> tensor<2x4x8x16xf32>
  %s = nn.matmul %q, %t : (tensor<2x4x16x8xf32>, tensor<2x4x8x16xf32>) -> tensor<2x4x16x16xf32>
  %p = nn.masked_softmax %s, %mask {fill = -1.0e9 : f32, scale = 0.353553385 : f32} : (tensor<2x4x16x16xf32>, tensor<1x1x16x16xi1>) -> tensor<2x4x16x16xf32>
  %pd, %pm = nn.dropout %p {ratio = 0.1 : f32, training = true} : (tensor<2x4x16x16xf32>) -> (tensor<2x4x16x16xf32>, tensor<2x4x16x16xi1>) loc("attn_dropout")
  %a = nn.matmul %pd, %v : (tensor<2x4x16x16xf32>, tensor<2x4x16x8xf32>) -> tensor<2x4x16x8xf32>
  // scaled_dot_product_attention(dropout_p = 0.25) as the dynamo exporter writes it.
  %t2 = nn.transpose %k {perm = array<i64: 0, 1, 3, 2>} : (tensor<2x4x16x8xf32>) -> tensor<2x4x8x16xf32>
  %s2 = nn.matmul %q, %t2 : (tensor<2x4x16x8xf32>, tensor<2x4x8x16xf32>) -> tensor<2x4x16x16xf32>
  %p2 = nn.masked_softmax %s2, %mask {fill = -3.40282347E+38 : f32, scale = 0.353553385 : f32} : (tensor<2x4x16x16xf32>, tensor<1x1x16x16xi1>) -> tensor<2x4x16x16xf32>
  %e2 = nn.equal %p2, %p2 : (tensor<2x4x16x16xf32>, tensor<2x4x16x16xf32>) -> tensor<2x4x16x16xi1>
  %n2 = nn.xor %e2, %true : (tensor<2x4x16x16xi1>, tensor<i1>) -> tensor<2x4x16x16xi1>
  %g2 = nn.where %n2, %zero, %p2 : (tensor<2x4x16x16xi1>, tensor<f32>, tensor<2x4x16x16xf32>) -> tensor<2x4x16x16xf32>
  %pd2, %pm2 = nn.dropout %g2 {ratio = 0.25 : f32, training = true, seed = 7 : i64} : (tensor<2x4x16x16xf32>) -> (tensor<2x4x16x16xf32>, tensor<2x4x16x16xi1>)
  %b = nn.matmul %pd2, %v : (tensor<2x4x16x16xf32>, tensor<2x4x16x8xf32>) -> tensor<2x4x16x8xf32>
  // An additive mask computed from the inputs.
  %am = nn.mul %in, %in : (tensor<2x1x16x16xf32>, tensor<2x1x16x16xf32>) -> tensor<2x1x16x16xf32>
  %s3 = nn.matmul %q, %t : (tensor<2x4x16x8xf32>, tensor<2x4x8x16xf32>) -> tensor<2x4x16x16xf32>
  %z3 = nn.mul %s3, %c : (tensor<2x4x16x16xf32>, tensor<f32>) -> tensor<2x4x16x16xf32>
  %m3 = nn.add %z3, %am : (tensor<2x4x16x16xf32>, tensor<2x1x16x16xf32>) -> tensor<2x4x16x16xf32>
  %p3 = nn.softmax %m3 {axis = -1 : i64} : (tensor<2x4x16x16xf32>) -> tensor<2x4x16x16xf32>
  %pd3, %pm3 = nn.dropout %p3 {ratio = 0.5 : f32, training = true, seed = 7 : i64} : (tensor<2x4x16x16xf32>) -> (tensor<2x4x16x16xf32>, tensor<2x4x16x16xi1>)
  %c3 = nn.matmul %pd3, %v : (tensor<2x4x16x16xf32>, tensor<2x4x16x8xf32>) -> tensor<2x4x16x8xf32>
  // Inference mode: the dropout is the identity.
  %s4 = nn.matmul %q, %t : (tensor<2x4x16x8xf32>, tensor<2x4x8x16xf32>) -> tensor<2x4x16x16xf32>
  %z4 = nn.mul %s4, %c : (tensor<2x4x16x16xf32>, tensor<f32>) -> tensor<2x4x16x16xf32>
  %p4 = nn.softmax %z4 {axis = -1 : i64} : (tensor<2x4x16x16xf32>) -> tensor<2x4x16x16xf32>
  %pd4, %pm4 = nn.dropout %p4 {ratio = 0.1 : f32} : (tensor<2x4x16x16xf32>) -> (tensor<2x4x16x16xf32>, tensor<2x4x16x16xi1>) loc("eval_dropout")
  %d4 = nn.matmul %pd4, %v : (tensor<2x4x16x16xf32>, tensor<2x4x16x8xf32>) -> tensor<2x4x16x8xf32>
  // The mask is a result too: the dropout and its products stay.
  %s5 = nn.matmul %q, %t : (tensor<2x4x16x8xf32>, tensor<2x4x8x16xf32>) -> tensor<2x4x16x16xf32>
  %z5 = nn.mul %s5, %c : (tensor<2x4x16x16xf32>, tensor<f32>) -> tensor<2x4x16x16xf32>
  %p5 = nn.softmax %z5 {axis = -1 : i64} : (tensor<2x4x16x16xf32>) -> tensor<2x4x16x16xf32>
  %pd5, %pm5 = nn.dropout %p5 {ratio = 0.1 : f32, training = true} : (tensor<2x4x16x16xf32>) -> (tensor<2x4x16x16xf32>, tensor<2x4x16x16xi1>) loc("kept_dropout")
  %e5 = nn.matmul %pd5, %v : (tensor<2x4x16x16xf32>, tensor<2x4x16x8xf32>) -> tensor<2x4x16x8xf32>
  return %a, %b, %c3, %d4, %e5, %pm5 : tensor<2x4x16x8xf32>, tensor<2x4x16x8xf32>, tensor<2x4x16x8xf32>, tensor<2x4x16x8xf32>, tensor<2x4x16x8xf32>, tensor<2x4x16x16xi1>
}

// An all-zero additive mask (the dynamo exporter's folded mask of an
// unpadded batch) under a softmax is no mask: the attention fuses. Not so
// for a mask with any other value, nor for an add that feeds anything else.
// CHECK-LABEL: func.func @zero_mask
// CHECK: %[[A:.*]], %{{.*}} = nn.attention %arg0, %arg1, %arg2 {scale = 1.250000e-01 : f32}
// CHECK: %[[S:.*]] = nn.add
// CHECK: return %[[A]], %[[S]]
func.func @zero_mask(%q: tensor<2x4x16x8xf32>, %k: tensor<2x4x16x8xf32>, %v: tensor<2x4x16x8xf32>, %w: tensor<2x4x16x16xf32>) -> (tensor<2x4x16x8xf32>, tensor<2x4x16x16xf32>) {
  %zeros = nn.constant dense<0.0> : tensor<2x1x16x16xf32>
  %c = nn.constant dense<0.125> : tensor<f32>
  %t = nn.transpose %k {perm = array<i64: 0, 1, 3, 2>} : (tensor<2x4x16x8xf32>) -> tensor<2x4x8x16xf32>
  %s = nn.matmul %q, %t : (tensor<2x4x16x8xf32>, tensor<2x4x8x16xf32>) -> tensor<2x4x16x16xf32>
  %z = nn.mul %s, %c : (tensor<2x4x16x16xf32>, tensor<f32>) -> tensor<2x4x16x16xf32>
  %m = nn.add %z, %zeros : (tensor<2x4x16x16xf32>, tensor<2x1x16x16xf32>) -> tensor<2x4x16x16xf32>
  %p = nn.softmax %m {axis = -1 : i64} : (tensor<2x4x16x16xf32>) -> tensor<2x4x16x16xf32>
  %a = nn.matmul %p, %v : (tensor<2x4x16x16xf32>, tensor<2x4x16x8xf32>) -> tensor<2x4x16x8xf32>
  %s2 = nn.add %w, %zeros : (tensor<2x4x16x16xf32>, tensor<2x1x16x16xf32>) -> tensor<2x4x16x16xf32>
  return %a, %s2 : tensor<2x4x16x8xf32>, tensor<2x4x16x16xf32>
}

// softmax(q · kᵀ · c + M) · v with M computed at run time: an additive mask
// when no parameter reaches it (an eager export's mask from the inputs);
// not when one does (Swin's trained relative position bias needs a
// gradient nn.attention does not give).
// CHECK-LABEL: func.func @additive_mask
// CHECK: %[[M:.*]] = nn.mul %arg3, %arg3
// CHECK: %[[A:.*]], %{{.*}} = nn.attention %arg0, %arg1, %arg2, %[[M]] {scale = 1.250000e-01 : f32} : (tensor<2x4x16x8xf32>, tensor<2x4x16x8xf32>, tensor<2x4x16x8xf32>, tensor<2x1x16x16xf32>)
// CHECK: nn.softmax
// CHECK: %[[B:.*]] = nn.matmul
// CHECK: return %[[A]], %[[B]]
func.func @additive_mask(%q: tensor<2x4x16x8xf32>, %k: tensor<2x4x16x8xf32>, %v: tensor<2x4x16x8xf32>, %in: tensor<2x1x16x16xf32>, %w: tensor<1x4x16x16xf32> {nn.role = #nn.role<param>}) -> (tensor<2x4x16x8xf32>, tensor<2x4x16x8xf32>) {
  %c = nn.constant dense<0.125> : tensor<f32>
  %mask = nn.mul %in, %in : (tensor<2x1x16x16xf32>, tensor<2x1x16x16xf32>) -> tensor<2x1x16x16xf32>
  %t = nn.transpose %k {perm = array<i64: 0, 1, 3, 2>} : (tensor<2x4x16x8xf32>) -> tensor<2x4x8x16xf32>
  %s = nn.matmul %q, %t : (tensor<2x4x16x8xf32>, tensor<2x4x8x16xf32>) -> tensor<2x4x16x16xf32>
  %z = nn.mul %s, %c : (tensor<2x4x16x16xf32>, tensor<f32>) -> tensor<2x4x16x16xf32>
  %m = nn.add %z, %mask : (tensor<2x4x16x16xf32>, tensor<2x1x16x16xf32>) -> tensor<2x4x16x16xf32>
  %p = nn.softmax %m {axis = -1 : i64} : (tensor<2x4x16x16xf32>) -> tensor<2x4x16x16xf32>
  %a = nn.matmul %p, %v : (tensor<2x4x16x16xf32>, tensor<2x4x16x8xf32>) -> tensor<2x4x16x8xf32>
  %bias = nn.mul %w, %w : (tensor<1x4x16x16xf32>, tensor<1x4x16x16xf32>) -> tensor<1x4x16x16xf32>
  %t2 = nn.transpose %k {perm = array<i64: 0, 1, 3, 2>} : (tensor<2x4x16x8xf32>) -> tensor<2x4x8x16xf32>
  %s2 = nn.matmul %q, %t2 : (tensor<2x4x16x8xf32>, tensor<2x4x8x16xf32>) -> tensor<2x4x16x16xf32>
  %m2 = nn.add %s2, %bias : (tensor<2x4x16x16xf32>, tensor<1x4x16x16xf32>) -> tensor<2x4x16x16xf32>
  %p2 = nn.softmax %m2 {axis = -1 : i64} : (tensor<2x4x16x16xf32>) -> tensor<2x4x16x16xf32>
  %b = nn.matmul %p2, %v : (tensor<2x4x16x16xf32>, tensor<2x4x16x8xf32>) -> tensor<2x4x16x8xf32>
  return %a, %b : tensor<2x4x16x8xf32>, tensor<2x4x16x8xf32>
}

// The exact GELU, x * 0.5 * (1 + erf(x / sqrt 2)), in the exporter's order
// and with the half applied first.
// CHECK-LABEL: func.func @gelu
// CHECK: %[[G:.*]] = nn.gelu %arg0 : tensor<4x8xf32>
// CHECK: %[[H:.*]] = nn.gelu %arg0 : tensor<4x8xf32>
// CHECK: return %[[G]], %[[H]]
func.func @gelu(%x: tensor<4x8xf32>) -> (tensor<4x8xf32>, tensor<4x8xf32>) {
  %s2 = nn.constant dense<1.41421354> : tensor<f32>
  %one = nn.constant dense<1.0> : tensor<f32>
  %half = nn.constant dense<0.5> : tensor<f32>
  %d = nn.div %x, %s2 : (tensor<4x8xf32>, tensor<f32>) -> tensor<4x8xf32>
  %e = nn.erf %d : tensor<4x8xf32>
  %a = nn.add %e, %one : (tensor<4x8xf32>, tensor<f32>) -> tensor<4x8xf32>
  %m = nn.mul %x, %a : (tensor<4x8xf32>, tensor<4x8xf32>) -> tensor<4x8xf32>
  %g = nn.mul %m, %half : (tensor<4x8xf32>, tensor<f32>) -> tensor<4x8xf32>
  %d2 = nn.div %x, %s2 : (tensor<4x8xf32>, tensor<f32>) -> tensor<4x8xf32>
  %e2 = nn.erf %d2 : tensor<4x8xf32>
  %a2 = nn.add %one, %e2 : (tensor<f32>, tensor<4x8xf32>) -> tensor<4x8xf32>
  %xh = nn.mul %half, %x : (tensor<f32>, tensor<4x8xf32>) -> tensor<4x8xf32>
  %h = nn.mul %xh, %a2 : (tensor<4x8xf32>, tensor<4x8xf32>) -> tensor<4x8xf32>
  return %g, %h : tensor<4x8xf32>, tensor<4x8xf32>
}

// The attention softmax: PyTorch's masked_fill (the fill first, a scale
// multiplying), Hugging Face's GPT-2 (the fill second, a division), and a
// where without a scale.
// CHECK-LABEL: func.func @masked_softmax
// CHECK: %[[A:.*]] = nn.masked_softmax %arg0, %arg1 {fill = 0xFF800000 : f32, scale = 1.250000e-01 : f32}
// CHECK: %[[B:.*]] = nn.masked_softmax %arg0, %arg1 {divide = true, fill = -3.40282347E+38 : f32, masked_when = false, scale = 8.000000e+00 : f32}
// CHECK: %[[C:.*]] = nn.masked_softmax %arg0, %arg1 {fill = -1.000000e+04 : f32, scale = 1.000000e+00 : f32}
// CHECK-NOT: nn.where
// CHECK: return %[[A]], %[[B]], %[[C]]
func.func @masked_softmax(%x: tensor<2x4x8x8xf32>, %mask: tensor<1x1x8x8xi1>) -> (tensor<2x4x8x8xf32>, tensor<2x4x8x8xf32>, tensor<2x4x8x8xf32>) {
  %ninf = nn.constant dense<0xFF800000> : tensor<f32>
  %scale = nn.constant dense<0.125> : tensor<f32>
  %s = nn.mul %x, %scale : (tensor<2x4x8x8xf32>, tensor<f32>) -> tensor<2x4x8x8xf32>
  %w = nn.where %mask, %ninf, %s : (tensor<1x1x8x8xi1>, tensor<f32>, tensor<2x4x8x8xf32>) -> tensor<2x4x8x8xf32>
  %a = nn.softmax %w {axis = -1 : i64} : (tensor<2x4x8x8xf32>) -> tensor<2x4x8x8xf32>
  %min = nn.constant dense<-3.40282347E+38> : tensor<f32>
  %root = nn.constant dense<8.0> : tensor<f32>
  %d = nn.div %x, %root : (tensor<2x4x8x8xf32>, tensor<f32>) -> tensor<2x4x8x8xf32>
  %w2 = nn.where %mask, %d, %min : (tensor<1x1x8x8xi1>, tensor<2x4x8x8xf32>, tensor<f32>) -> tensor<2x4x8x8xf32>
  %b = nn.softmax %w2 {axis = 3 : i64} : (tensor<2x4x8x8xf32>) -> tensor<2x4x8x8xf32>
  %big = nn.constant dense<-1.0e4> : tensor<f32>
  %w3 = nn.where %mask, %big, %x : (tensor<1x1x8x8xi1>, tensor<f32>, tensor<2x4x8x8xf32>) -> tensor<2x4x8x8xf32>
  %c = nn.softmax %w3 {axis = -1 : i64} : (tensor<2x4x8x8xf32>) -> tensor<2x4x8x8xf32>
  return %a, %b, %c : tensor<2x4x8x8xf32>, tensor<2x4x8x8xf32>, tensor<2x4x8x8xf32>
}

// Left alone: a softmax along another axis, a fill that is not a constant,
// a scaled value read elsewhere (kept, the where still fused) and a where
// cut from its softmax by the partition.
// CHECK-LABEL: func.func @masked_softmax_unchanged
// CHECK: nn.softmax %{{.*}} {axis = 2 : i64}
// CHECK: nn.softmax
// CHECK: %[[S:.*]] = nn.mul %arg0
// CHECK: nn.masked_softmax %[[S]], %arg1 {fill = 0xFF800000 : f32, scale = 1.000000e+00 : f32}
// CHECK: nn.softmax
// CHECK: return
func.func @masked_softmax_unchanged(%x: tensor<2x4x8x8xf32>, %mask: tensor<1x1x8x8xi1>, %f: tensor<f32>) -> (tensor<2x4x8x8xf32>, tensor<2x4x8x8xf32>, tensor<2x4x8x8xf32>, tensor<2x4x8x8xf32>, tensor<2x4x8x8xf32>) {
  %ninf = nn.constant dense<0xFF800000> : tensor<f32>
  %scale = nn.constant dense<0.125> : tensor<f32>
  %w = nn.where %mask, %ninf, %x : (tensor<1x1x8x8xi1>, tensor<f32>, tensor<2x4x8x8xf32>) -> tensor<2x4x8x8xf32>
  %a = nn.softmax %w {axis = 2 : i64} : (tensor<2x4x8x8xf32>) -> tensor<2x4x8x8xf32>
  %w2 = nn.where %mask, %f, %x : (tensor<1x1x8x8xi1>, tensor<f32>, tensor<2x4x8x8xf32>) -> tensor<2x4x8x8xf32>
  %b = nn.softmax %w2 {axis = -1 : i64} : (tensor<2x4x8x8xf32>) -> tensor<2x4x8x8xf32>
  %s = nn.mul %x, %scale : (tensor<2x4x8x8xf32>, tensor<f32>) -> tensor<2x4x8x8xf32>
  %w3 = nn.where %mask, %ninf, %s : (tensor<1x1x8x8xi1>, tensor<f32>, tensor<2x4x8x8xf32>) -> tensor<2x4x8x8xf32>
  %c = nn.softmax %w3 {axis = -1 : i64} : (tensor<2x4x8x8xf32>) -> tensor<2x4x8x8xf32>
  %w4 = nn.where %mask, %ninf, %x {pipe.stage = 0 : i64} : (tensor<1x1x8x8xi1>, tensor<f32>, tensor<2x4x8x8xf32>) -> tensor<2x4x8x8xf32>
  %d = nn.softmax %w4 {axis = -1 : i64, pipe.stage = 1 : i64} : (tensor<2x4x8x8xf32>) -> tensor<2x4x8x8xf32>
  return %a, %b, %c, %s, %d : tensor<2x4x8x8xf32>, tensor<2x4x8x8xf32>, tensor<2x4x8x8xf32>, tensor<2x4x8x8xf32>, tensor<2x4x8x8xf32>
}

// An additive mask: x * scale + M, M a constant of 0 and one fill <= -1e9
// (-inf; -1e9 on the left of the add) with an unmasked entry in every row,
// becomes a masked softmax under the boolean mask M == fill.
// CHECK-LABEL: func.func @additive_masked_softmax
// (The two masks are equal, so the rewriter keeps one constant.)
// CHECK: %[[M:.*]] = nn.constant dense<{{\[\[}}false, true, true], [false, false, true], [false, false, false]]> : tensor<3x3xi1>
// CHECK: %[[A:.*]] = nn.masked_softmax %arg0, %[[M]] {divide = true, fill = 0xFF800000 : f32, scale = 8.000000e+00 : f32}
// CHECK: %[[B:.*]] = nn.masked_softmax %arg0, %[[M]] {fill = -1.000000e+09 : f32, scale = 1.000000e+00 : f32}
// CHECK: return %[[A]], %[[B]]
func.func @additive_masked_softmax(%x: tensor<2x3x3xf32>) -> (tensor<2x3x3xf32>, tensor<2x3x3xf32>) {
  %causal = nn.constant dense<[[0.0, 0xFF800000, 0xFF800000], [0.0, 0.0, 0xFF800000], [0.0, 0.0, 0.0]]> : tensor<3x3xf32>
  %big = nn.constant dense<[[0.0, -1.0e9, -1.0e9], [0.0, 0.0, -1.0e9], [0.0, 0.0, 0.0]]> : tensor<3x3xf32>
  %root = nn.constant dense<8.0> : tensor<f32>
  %d = nn.div %x, %root : (tensor<2x3x3xf32>, tensor<f32>) -> tensor<2x3x3xf32>
  %s1 = nn.add %d, %causal : (tensor<2x3x3xf32>, tensor<3x3xf32>) -> tensor<2x3x3xf32>
  %a = nn.softmax %s1 {axis = -1 : i64} : (tensor<2x3x3xf32>) -> tensor<2x3x3xf32>
  %s2 = nn.add %big, %x : (tensor<3x3xf32>, tensor<2x3x3xf32>) -> tensor<2x3x3xf32>
  %b = nn.softmax %s2 {axis = 2 : i64} : (tensor<2x3x3xf32>) -> tensor<2x3x3xf32>
  return %a, %b : tensor<2x3x3xf32>, tensor<2x3x3xf32>
}

// Left alone: a fill above -1e9 (-1e4: exp(x - 1e4) need not vanish), a
// fully masked row (the masked softmax would spread it evenly), two
// different fills, a mask broadcast along the softmax's axis, and a mask
// that is not a constant.
// CHECK-LABEL: func.func @additive_mask_unchanged
// CHECK-NOT: nn.masked_softmax
// CHECK: return
func.func @additive_mask_unchanged(%x: tensor<2x3x3xf32>, %m: tensor<3x3xf32>) -> (tensor<2x3x3xf32>, tensor<2x3x3xf32>, tensor<2x3x3xf32>, tensor<2x3x3xf32>, tensor<2x3x3xf32>) {
  %small = nn.constant dense<[[0.0, -1.0e4, -1.0e4], [0.0, 0.0, -1.0e4], [0.0, 0.0, 0.0]]> : tensor<3x3xf32>
  %full = nn.constant dense<[[0xFF800000, 0xFF800000, 0xFF800000], [0.0, 0.0, 0xFF800000], [0.0, 0.0, 0.0]]> : tensor<3x3xf32>
  %two = nn.constant dense<[[0.0, 0xFF800000, -1.0e9], [0.0, 0.0, 0xFF800000], [0.0, 0.0, 0.0]]> : tensor<3x3xf32>
  %column = nn.constant dense<[[0.0], [0xFF800000], [0.0]]> : tensor<3x1xf32>
  %s1 = nn.add %x, %small : (tensor<2x3x3xf32>, tensor<3x3xf32>) -> tensor<2x3x3xf32>
  %a = nn.softmax %s1 {axis = -1 : i64} : (tensor<2x3x3xf32>) -> tensor<2x3x3xf32>
  %s2 = nn.add %x, %full : (tensor<2x3x3xf32>, tensor<3x3xf32>) -> tensor<2x3x3xf32>
  %b = nn.softmax %s2 {axis = -1 : i64} : (tensor<2x3x3xf32>) -> tensor<2x3x3xf32>
  %s3 = nn.add %x, %two : (tensor<2x3x3xf32>, tensor<3x3xf32>) -> tensor<2x3x3xf32>
  %c = nn.softmax %s3 {axis = -1 : i64} : (tensor<2x3x3xf32>) -> tensor<2x3x3xf32>
  %s4 = nn.add %x, %column : (tensor<2x3x3xf32>, tensor<3x1xf32>) -> tensor<2x3x3xf32>
  %d = nn.softmax %s4 {axis = -1 : i64} : (tensor<2x3x3xf32>) -> tensor<2x3x3xf32>
  %s5 = nn.add %x, %m : (tensor<2x3x3xf32>, tensor<3x3xf32>) -> tensor<2x3x3xf32>
  %e = nn.softmax %s5 {axis = -1 : i64} : (tensor<2x3x3xf32>) -> tensor<2x3x3xf32>
  return %a, %b, %c, %d, %e : tensor<2x3x3xf32>, tensor<2x3x3xf32>, tensor<2x3x3xf32>, tensor<2x3x3xf32>, tensor<2x3x3xf32>
}

// Left alone: a LayerNorm cut by the partition (two stages), and a GELU
// whose erf is also read elsewhere.
// CHECK-LABEL: func.func @unchanged
// CHECK-NOT: nn.layer_norm
// CHECK-NOT: nn.gelu
// CHECK: return
func.func @unchanged(%x: tensor<2x32xf32>, %w: tensor<32xf32>, %b: tensor<32xf32>) -> (tensor<2x32xf32>, tensor<2x32xf32>, tensor<2x32xf32>) {
  %two = nn.constant dense<2.0> : tensor<f32>
  %eps = nn.constant dense<1.0e-5> : tensor<f32>
  %mean = nn.reduce_mean %x {axes = array<i64: 1>, pipe.stage = 0 : i64} : (tensor<2x32xf32>) -> tensor<2x1xf32>
  %d = nn.sub %x, %mean {pipe.stage = 0 : i64} : (tensor<2x32xf32>, tensor<2x1xf32>) -> tensor<2x32xf32>
  %p = nn.pow %d, %two {pipe.stage = 0 : i64} : (tensor<2x32xf32>, tensor<f32>) -> tensor<2x32xf32>
  %var = nn.reduce_mean %p {axes = array<i64: 1>, pipe.stage = 0 : i64} : (tensor<2x32xf32>) -> tensor<2x1xf32>
  %ve = nn.add %var, %eps {pipe.stage = 0 : i64} : (tensor<2x1xf32>, tensor<f32>) -> tensor<2x1xf32>
  %s = nn.sqrt %ve {pipe.stage = 1 : i64} : tensor<2x1xf32>
  %n = nn.div %d, %s {pipe.stage = 1 : i64} : (tensor<2x32xf32>, tensor<2x1xf32>) -> tensor<2x32xf32>
  %m = nn.mul %n, %w {pipe.stage = 1 : i64} : (tensor<2x32xf32>, tensor<32xf32>) -> tensor<2x32xf32>
  %y = nn.add %m, %b {pipe.stage = 1 : i64} : (tensor<2x32xf32>, tensor<32xf32>) -> tensor<2x32xf32>
  %s2 = nn.constant dense<1.41421354> : tensor<f32>
  %one = nn.constant dense<1.0> : tensor<f32>
  %half = nn.constant dense<0.5> : tensor<f32>
  %dv = nn.div %x, %s2 : (tensor<2x32xf32>, tensor<f32>) -> tensor<2x32xf32>
  %e = nn.erf %dv : tensor<2x32xf32>
  %a = nn.add %e, %one : (tensor<2x32xf32>, tensor<f32>) -> tensor<2x32xf32>
  %mm = nn.mul %x, %a : (tensor<2x32xf32>, tensor<2x32xf32>) -> tensor<2x32xf32>
  %g = nn.mul %mm, %half : (tensor<2x32xf32>, tensor<f32>) -> tensor<2x32xf32>
  return %y, %g, %e : tensor<2x32xf32>, tensor<2x32xf32>, tensor<2x32xf32>
}

// The heads' split and merge around attention, as every exporter writes
// them: q, k, v projected as [B, S, H, D] and transposed to [B, H, S, D],
// the result transposed back. The attention becomes sequence-major and the
// four transposes go; log_sum_exp keeps the head-major order. An operand
// transpose read elsewhere too (%k2 below) keeps its attention head-major;
// a result read without the merge gets one transpose back.
// CHECK-LABEL: func.func @attention_heads
// CHECK: %[[A:.*]], %[[L:.*]] = nn.attention %arg0, %arg1, %arg2, %arg3 {fill = -1.000000e+09 : f32, scale = 0.353553385 : f32, sequence_major = true} : (tensor<2x16x4x8xf32>, tensor<2x12x4x8xf32>, tensor<2x12x4x6xf32>, tensor<1x1x16x12xi1>) -> (tensor<2x16x4x6xf32>, tensor<2x4x16x1xf32>)
// CHECK-NOT: nn.transpose %[[A]]
// CHECK: %[[R:.*]] = nn.reshape %[[A]]
// CHECK: %[[B:.*]], %{{.*}} = nn.attention %arg0, %arg1, %arg2 {scale = 1.250000e-01 : f32, sequence_major = true}
// CHECK: %[[BT:.*]] = nn.transpose %[[B]] {perm = array<i64: 0, 2, 1, 3>}
// CHECK: %[[C:.*]], %{{.*}} = nn.attention %{{.*}}, %{{.*}}, %{{.*}} {scale = 1.250000e-01 : f32} :
// CHECK: return %[[R]], %[[L]], %[[BT]], %[[C]]
func.func @attention_heads(%q: tensor<2x16x4x8xf32>, %k: tensor<2x12x4x8xf32>, %v: tensor<2x12x4x6xf32>, %mask: tensor<1x1x16x12xi1>) -> (tensor<2x16x24xf32>, tensor<2x4x16x1xf32>, tensor<2x4x16x6xf32>, tensor<2x4x16x6xf32>, tensor<2x4x12x8xf32>) {
  %qt = nn.transpose %q {perm = array<i64: 0, 2, 1, 3>} : (tensor<2x16x4x8xf32>) -> tensor<2x4x16x8xf32>
  %kt = nn.transpose %k {perm = array<i64: 0, 2, 1, 3>} : (tensor<2x12x4x8xf32>) -> tensor<2x4x12x8xf32>
  %vt = nn.transpose %v {perm = array<i64: 0, 2, 1, 3>} : (tensor<2x12x4x6xf32>) -> tensor<2x4x12x6xf32>
  %a, %lse = nn.attention %qt, %kt, %vt, %mask {fill = -1.0e9 : f32, scale = 0.353553385 : f32} : (tensor<2x4x16x8xf32>, tensor<2x4x12x8xf32>, tensor<2x4x12x6xf32>, tensor<1x1x16x12xi1>) -> (tensor<2x4x16x6xf32>, tensor<2x4x16x1xf32>)
  %merged = nn.transpose %a {perm = array<i64: 0, 2, 1, 3>} : (tensor<2x4x16x6xf32>) -> tensor<2x16x4x6xf32>
  %r = nn.reshape %merged : tensor<2x16x4x6xf32> -> tensor<2x16x24xf32>
  %qt2 = nn.transpose %q {perm = array<i64: 0, 2, 1, 3>} : (tensor<2x16x4x8xf32>) -> tensor<2x4x16x8xf32>
  %kt2 = nn.transpose %k {perm = array<i64: 0, 2, 1, 3>} : (tensor<2x12x4x8xf32>) -> tensor<2x4x12x8xf32>
  %vt2 = nn.transpose %v {perm = array<i64: 0, 2, 1, 3>} : (tensor<2x12x4x6xf32>) -> tensor<2x4x12x6xf32>
  %b, %lse2 = nn.attention %qt2, %kt2, %vt2 {scale = 0.125 : f32} : (tensor<2x4x16x8xf32>, tensor<2x4x12x8xf32>, tensor<2x4x12x6xf32>) -> (tensor<2x4x16x6xf32>, tensor<2x4x16x1xf32>)
  %qt3 = nn.transpose %q {perm = array<i64: 0, 2, 1, 3>} : (tensor<2x16x4x8xf32>) -> tensor<2x4x16x8xf32>
  %k2 = nn.transpose %k {perm = array<i64: 0, 2, 1, 3>} : (tensor<2x12x4x8xf32>) -> tensor<2x4x12x8xf32>
  %vt3 = nn.transpose %v {perm = array<i64: 0, 2, 1, 3>} : (tensor<2x12x4x6xf32>) -> tensor<2x4x12x6xf32>
  %c, %lse3 = nn.attention %qt3, %k2, %vt3 {scale = 0.125 : f32} : (tensor<2x4x16x8xf32>, tensor<2x4x12x8xf32>, tensor<2x4x12x6xf32>) -> (tensor<2x4x16x6xf32>, tensor<2x4x16x1xf32>)
  return %r, %lse, %b, %c, %k2 : tensor<2x16x24xf32>, tensor<2x4x16x1xf32>, tensor<2x4x16x6xf32>, tensor<2x4x16x6xf32>, tensor<2x4x12x8xf32>
}

// GPT-2's heads as its exports write them: q and v transposed to
// [B, H, S, D], K^T in one transpose of the projection ([B, T, H, D] to
// [B, H, D, T]). The K^T transpose composes with the swap back into the
// head transpose, so the attention becomes sequence-major and no transpose
// is left.
// CHECK-LABEL: func.func @attention_heads_key_transposed_once
// CHECK-NOT: nn.transpose
// CHECK: %[[A:.*]], %{{.*}} = nn.attention %arg0, %arg1, %arg2, %arg3 {fill = -1.000000e+09 : f32, scale = 0.353553385 : f32, sequence_major = true}
// CHECK-NOT: nn.transpose
// CHECK: return
func.func @attention_heads_key_transposed_once(%q: tensor<2x16x4x8xf32>, %k: tensor<2x16x4x8xf32>, %v: tensor<2x16x4x8xf32>, %mask: tensor<1x1x16x16xi1>) -> tensor<2x16x4x8xf32> {
  %qt = nn.transpose %q {perm = array<i64: 0, 2, 1, 3>} : (tensor<2x16x4x8xf32>) -> tensor<2x4x16x8xf32>
  %ktt = nn.transpose %k {perm = array<i64: 0, 2, 3, 1>} : (tensor<2x16x4x8xf32>) -> tensor<2x4x8x16xf32>
  %vt = nn.transpose %v {perm = array<i64: 0, 2, 1, 3>} : (tensor<2x16x4x8xf32>) -> tensor<2x4x16x8xf32>
  %s = nn.matmul %qt, %ktt : (tensor<2x4x16x8xf32>, tensor<2x4x8x16xf32>) -> tensor<2x4x16x16xf32>
  %p = nn.masked_softmax %s, %mask {fill = -1.0e9 : f32, scale = 0.353553385 : f32} : (tensor<2x4x16x16xf32>, tensor<1x1x16x16xi1>) -> tensor<2x4x16x16xf32>
  %a = nn.matmul %p, %vt : (tensor<2x4x16x16xf32>, tensor<2x4x16x8xf32>) -> tensor<2x4x16x8xf32>
  %merged = nn.transpose %a {perm = array<i64: 0, 2, 1, 3>} : (tensor<2x4x16x8xf32>) -> tensor<2x16x4x8xf32>
  return %merged : tensor<2x16x4x8xf32>
}

// A joint q/k/v projection [B, S, 3·H·D] split along its last axis, each
// piece viewed as [B, S, H, D] and transposed to [B, H, S, D] (GPT-2's
// c_attn): the attention reads the projection itself, viewed as
// [B, S, 3·H, D], in three windows (joint_kv_heads = H), and the split
// goes. Grouped heads alike (H = 4, Hkv = 2: [B, S, 8, D]).
// CHECK-LABEL: func.func @attention_joint_projection
// CHECK-NOT: nn.split
// CHECK: %[[J:.*]] = nn.reshape %arg0{{.*}} : tensor<2x16x96xf32> -> tensor<2x16x12x8xf32>
// CHECK: %[[A:.*]], %{{.*}} = nn.attention %[[J]], %[[J]], %[[J]], %arg2 {fill = -1.000000e+09 : f32, joint_kv_heads = 4 : i64, {{.*}}sequence_major = true} : (tensor<2x16x12x8xf32>, tensor<2x16x12x8xf32>, tensor<2x16x12x8xf32>, tensor<1x1x16x16xi1>) -> (tensor<2x16x4x8xf32>, tensor<2x4x16x1xf32>)
// CHECK: %[[G:.*]] = nn.reshape %arg1{{.*}} : tensor<2x16x64xf32> -> tensor<2x16x8x8xf32>
// CHECK: nn.attention %[[G]], %[[G]], %[[G]] {joint_kv_heads = 2 : i64, {{.*}}sequence_major = true} : {{.*}} -> (tensor<2x16x4x8xf32>, tensor<2x4x16x1xf32>)
// CHECK-NOT: nn.split
// CHECK: return
func.func @attention_joint_projection(%x: tensor<2x16x96xf32>, %g: tensor<2x16x64xf32>, %mask: tensor<1x1x16x16xi1>) -> (tensor<2x16x4x8xf32>, tensor<2x16x4x8xf32>) {
  %q, %k, %v = nn.split %x {axis = 2 : i64, sizes = array<i64: 32, 32, 32>} : (tensor<2x16x96xf32>) -> (tensor<2x16x32xf32>, tensor<2x16x32xf32>, tensor<2x16x32xf32>)
  %q4 = nn.reshape %q : tensor<2x16x32xf32> -> tensor<2x16x4x8xf32>
  %k4 = nn.reshape %k : tensor<2x16x32xf32> -> tensor<2x16x4x8xf32>
  %v4 = nn.reshape %v : tensor<2x16x32xf32> -> tensor<2x16x4x8xf32>
  %qt = nn.transpose %q4 {perm = array<i64: 0, 2, 1, 3>} : (tensor<2x16x4x8xf32>) -> tensor<2x4x16x8xf32>
  %kt = nn.transpose %k4 {perm = array<i64: 0, 2, 1, 3>} : (tensor<2x16x4x8xf32>) -> tensor<2x4x16x8xf32>
  %vt = nn.transpose %v4 {perm = array<i64: 0, 2, 1, 3>} : (tensor<2x16x4x8xf32>) -> tensor<2x4x16x8xf32>
  %a, %lse = nn.attention %qt, %kt, %vt, %mask {fill = -1.0e9 : f32, scale = 0.353553385 : f32} : (tensor<2x4x16x8xf32>, tensor<2x4x16x8xf32>, tensor<2x4x16x8xf32>, tensor<1x1x16x16xi1>) -> (tensor<2x4x16x8xf32>, tensor<2x4x16x1xf32>)
  %merged = nn.transpose %a {perm = array<i64: 0, 2, 1, 3>} : (tensor<2x4x16x8xf32>) -> tensor<2x16x4x8xf32>
  %gq, %gk, %gv = nn.split %g {axis = -1 : i64, sizes = array<i64: 32, 16, 16>} : (tensor<2x16x64xf32>) -> (tensor<2x16x32xf32>, tensor<2x16x16xf32>, tensor<2x16x16xf32>)
  %gq4 = nn.reshape %gq : tensor<2x16x32xf32> -> tensor<2x16x4x8xf32>
  %gk4 = nn.reshape %gk : tensor<2x16x16xf32> -> tensor<2x16x2x8xf32>
  %gv4 = nn.reshape %gv : tensor<2x16x16xf32> -> tensor<2x16x2x8xf32>
  %gy, %glse = nn.attention %gq4, %gk4, %gv4 {scale = 0.125 : f32, sequence_major = true} : (tensor<2x16x4x8xf32>, tensor<2x16x2x8xf32>, tensor<2x16x2x8xf32>) -> (tensor<2x16x4x8xf32>, tensor<2x4x16x1xf32>)
  return %merged, %gy : tensor<2x16x4x8xf32>, tensor<2x16x4x8xf32>
}

// Left split: a head size not a multiple of 8 (D = 4), a piece read
// elsewhere too, pieces in another order than q, k, v, a split along
// another axis.
// CHECK-LABEL: func.func @attention_joint_projection_unchanged
// CHECK: nn.split
// CHECK-NOT: joint_kv_heads
// CHECK: nn.split
// CHECK-NOT: joint_kv_heads
// CHECK: nn.split
// CHECK-NOT: joint_kv_heads
// CHECK: nn.split
// CHECK-NOT: joint_kv_heads
// CHECK: return
func.func @attention_joint_projection_unchanged(%x: tensor<2x16x48xf32>, %y: tensor<2x16x96xf32>, %z: tensor<2x48x32xf32>) -> (tensor<2x16x4x4xf32>, tensor<2x16x4x8xf32>, tensor<2x16x32xf32>, tensor<2x16x4x8xf32>, tensor<2x16x4x8xf32>) {
  %q, %k, %v = nn.split %x {axis = 2 : i64, sizes = array<i64: 16, 16, 16>} : (tensor<2x16x48xf32>) -> (tensor<2x16x16xf32>, tensor<2x16x16xf32>, tensor<2x16x16xf32>)
  %q4 = nn.reshape %q : tensor<2x16x16xf32> -> tensor<2x16x4x4xf32>
  %k4 = nn.reshape %k : tensor<2x16x16xf32> -> tensor<2x16x4x4xf32>
  %v4 = nn.reshape %v : tensor<2x16x16xf32> -> tensor<2x16x4x4xf32>
  %a, %la = nn.attention %q4, %k4, %v4 {sequence_major = true} : (tensor<2x16x4x4xf32>, tensor<2x16x4x4xf32>, tensor<2x16x4x4xf32>) -> (tensor<2x16x4x4xf32>, tensor<2x4x16x1xf32>)
  %bq, %bk, %bv = nn.split %y {axis = 2 : i64, sizes = array<i64: 32, 32, 32>} : (tensor<2x16x96xf32>) -> (tensor<2x16x32xf32>, tensor<2x16x32xf32>, tensor<2x16x32xf32>)
  %bq4 = nn.reshape %bq : tensor<2x16x32xf32> -> tensor<2x16x4x8xf32>
  %bk4 = nn.reshape %bk : tensor<2x16x32xf32> -> tensor<2x16x4x8xf32>
  %bv4 = nn.reshape %bv : tensor<2x16x32xf32> -> tensor<2x16x4x8xf32>
  %b, %lb = nn.attention %bq4, %bk4, %bv4 {sequence_major = true} : (tensor<2x16x4x8xf32>, tensor<2x16x4x8xf32>, tensor<2x16x4x8xf32>) -> (tensor<2x16x4x8xf32>, tensor<2x4x16x1xf32>)
  %cq, %ck, %cv = nn.split %y {axis = 2 : i64, sizes = array<i64: 32, 32, 32>} : (tensor<2x16x96xf32>) -> (tensor<2x16x32xf32>, tensor<2x16x32xf32>, tensor<2x16x32xf32>)
  %cq4 = nn.reshape %cq : tensor<2x16x32xf32> -> tensor<2x16x4x8xf32>
  %ck4 = nn.reshape %ck : tensor<2x16x32xf32> -> tensor<2x16x4x8xf32>
  %cv4 = nn.reshape %cv : tensor<2x16x32xf32> -> tensor<2x16x4x8xf32>
  %c, %lc = nn.attention %ck4, %cq4, %cv4 {sequence_major = true} : (tensor<2x16x4x8xf32>, tensor<2x16x4x8xf32>, tensor<2x16x4x8xf32>) -> (tensor<2x16x4x8xf32>, tensor<2x4x16x1xf32>)
  %dq, %dk, %dv = nn.split %z {axis = 1 : i64, sizes = array<i64: 16, 16, 16>} : (tensor<2x48x32xf32>) -> (tensor<2x16x32xf32>, tensor<2x16x32xf32>, tensor<2x16x32xf32>)
  %dq4 = nn.reshape %dq : tensor<2x16x32xf32> -> tensor<2x16x4x8xf32>
  %dk4 = nn.reshape %dk : tensor<2x16x32xf32> -> tensor<2x16x4x8xf32>
  %dv4 = nn.reshape %dv : tensor<2x16x32xf32> -> tensor<2x16x4x8xf32>
  %d, %ld = nn.attention %dq4, %dk4, %dv4 {sequence_major = true} : (tensor<2x16x4x8xf32>, tensor<2x16x4x8xf32>, tensor<2x16x4x8xf32>) -> (tensor<2x16x4x8xf32>, tensor<2x4x16x1xf32>)
  return %a, %b, %bq, %c, %d : tensor<2x16x4x4xf32>, tensor<2x16x4x8xf32>, tensor<2x16x32xf32>, tensor<2x16x4x8xf32>, tensor<2x16x4x8xf32>
}

// Llama-family heads: the rotary applied after the heads' split transpose.
// The transpose moves after the rotary (its [S, D] tables reshaped to
// [1, S, 1, D], their layout over [B, S, H, D]) and then folds into a
// sequence-major attention: no transpose is left. A split transpose read
// elsewhere too (%k2 below) keeps its rotary.
// CHECK-LABEL: func.func @rotary_heads
// CHECK: %[[C:.*]] = nn.reshape %arg3 : tensor<16x8xf32> -> tensor<1x16x1x8xf32>
// CHECK: %[[S:.*]] = nn.reshape %arg4 : tensor<16x8xf32> -> tensor<1x16x1x8xf32>
// CHECK: %[[Q:.*]] = nn.rotary %arg0, %[[C]], %[[S]] : (tensor<2x16x4x8xf32>, tensor<1x16x1x8xf32>, tensor<1x16x1x8xf32>) -> tensor<2x16x4x8xf32>
// CHECK: %[[K:.*]] = nn.rotary %arg1,
// CHECK: %[[A:.*]], %{{.*}} = nn.attention %[[Q]], %[[K]], %arg2 {scale = 0.353553385 : f32, sequence_major = true}
// CHECK-NOT: nn.transpose %[[A]]
// CHECK: %[[KT:.*]] = nn.transpose %arg1 {perm = array<i64: 0, 2, 1, 3>}
// CHECK: nn.rotary %[[KT]]
// CHECK: return
func.func @rotary_heads(%q: tensor<2x16x4x8xf32>, %k: tensor<2x16x4x8xf32>, %v: tensor<2x16x4x8xf32>, %cos: tensor<16x8xf32>, %sin: tensor<16x8xf32>) -> (tensor<2x16x4x8xf32>, tensor<2x4x16x8xf32>, tensor<2x4x16x8xf32>) {
  %qt = nn.transpose %q {perm = array<i64: 0, 2, 1, 3>} : (tensor<2x16x4x8xf32>) -> tensor<2x4x16x8xf32>
  %kt = nn.transpose %k {perm = array<i64: 0, 2, 1, 3>} : (tensor<2x16x4x8xf32>) -> tensor<2x4x16x8xf32>
  %vt = nn.transpose %v {perm = array<i64: 0, 2, 1, 3>} : (tensor<2x16x4x8xf32>) -> tensor<2x4x16x8xf32>
  %qr = nn.rotary %qt, %cos, %sin : (tensor<2x4x16x8xf32>, tensor<16x8xf32>, tensor<16x8xf32>) -> tensor<2x4x16x8xf32>
  %kr = nn.rotary %kt, %cos, %sin : (tensor<2x4x16x8xf32>, tensor<16x8xf32>, tensor<16x8xf32>) -> tensor<2x4x16x8xf32>
  %a, %lse = nn.attention %qr, %kr, %vt {scale = 0.353553385 : f32} : (tensor<2x4x16x8xf32>, tensor<2x4x16x8xf32>, tensor<2x4x16x8xf32>) -> (tensor<2x4x16x8xf32>, tensor<2x4x16x1xf32>)
  %merged = nn.transpose %a {perm = array<i64: 0, 2, 1, 3>} : (tensor<2x4x16x8xf32>) -> tensor<2x16x4x8xf32>
  %k2 = nn.transpose %k {perm = array<i64: 0, 2, 1, 3>} : (tensor<2x16x4x8xf32>) -> tensor<2x4x16x8xf32>
  %kr2 = nn.rotary %k2, %cos, %sin : (tensor<2x4x16x8xf32>, tensor<16x8xf32>, tensor<16x8xf32>) -> tensor<2x4x16x8xf32>
  return %merged, %kr2, %k2 : tensor<2x16x4x8xf32>, tensor<2x4x16x8xf32>, tensor<2x4x16x8xf32>
}

// Grouped-query heads as Llama-family exports repeat them (repeat_kv: an
// unsqueeze, an expand, a reshape of 2 key/value heads to 6): the attention
// reads the 2 heads itself, and with the heads' transposes folded too no
// transpose, unsqueeze or expand is left. The transposes of the grouped key
// and value fold as the query's does.
// CHECK-LABEL: func.func @grouped_heads
// CHECK-NOT: nn.expand
// CHECK-NOT: nn.transpose
// CHECK: %[[A:.*]], %{{.*}} = nn.attention %arg0, %arg1, %arg2, %arg3 {fill = 0xFF800000 : f32, scale = 0.353553385 : f32, sequence_major = true} : (tensor<2x16x6x8xf32>, tensor<2x16x2x8xf32>, tensor<2x16x2x8xf32>, tensor<16x16xi1>) -> (tensor<2x16x6x8xf32>, tensor<2x6x16x1xf32>)
// CHECK-NOT: nn.expand
// CHECK-NOT: nn.transpose
// CHECK: return %[[A]]
func.func @grouped_heads(%q: tensor<2x16x6x8xf32>, %k: tensor<2x16x2x8xf32>, %v: tensor<2x16x2x8xf32>, %mask: tensor<16x16xi1>) -> tensor<2x16x6x8xf32> {
  %qt = nn.transpose %q {perm = array<i64: 0, 2, 1, 3>} : (tensor<2x16x6x8xf32>) -> tensor<2x6x16x8xf32>
  %kt = nn.transpose %k {perm = array<i64: 0, 2, 1, 3>} : (tensor<2x16x2x8xf32>) -> tensor<2x2x16x8xf32>
  %vt = nn.transpose %v {perm = array<i64: 0, 2, 1, 3>} : (tensor<2x16x2x8xf32>) -> tensor<2x2x16x8xf32>
  %ku = nn.unsqueeze %kt {axes = array<i64: 2>} : (tensor<2x2x16x8xf32>) -> tensor<2x2x1x16x8xf32>
  %ke = nn.expand %ku : tensor<2x2x1x16x8xf32> -> tensor<2x2x3x16x8xf32>
  %kr = nn.reshape %ke : tensor<2x2x3x16x8xf32> -> tensor<2x6x16x8xf32>
  %vu = nn.unsqueeze %vt {axes = array<i64: 2>} : (tensor<2x2x16x8xf32>) -> tensor<2x2x1x16x8xf32>
  %ve = nn.expand %vu : tensor<2x2x1x16x8xf32> -> tensor<2x2x3x16x8xf32>
  %vr = nn.reshape %ve : tensor<2x2x3x16x8xf32> -> tensor<2x6x16x8xf32>
  %a, %lse = nn.attention %qt, %kr, %vr, %mask {fill = 0xFF800000 : f32, scale = 0.353553385 : f32} : (tensor<2x6x16x8xf32>, tensor<2x6x16x8xf32>, tensor<2x6x16x8xf32>, tensor<16x16xi1>) -> (tensor<2x6x16x8xf32>, tensor<2x6x16x1xf32>)
  %merged = nn.transpose %a {perm = array<i64: 0, 2, 1, 3>} : (tensor<2x6x16x8xf32>) -> tensor<2x16x6x8xf32>
  return %merged : tensor<2x16x6x8xf32>
}

// Not grouped heads: an expand that tiles the heads (head h reading head
// h mod 2, [B, 1, Hkv, T, D] expanded on axis 1) is another order than
// nn.attention's grouping; key and value repeated by different factors;
// only the key repeated. All keep their repetitions.
// CHECK-LABEL: func.func @not_grouped_heads
// CHECK-COUNT-3: nn.expand
// CHECK-NOT: nn.expand
// CHECK: return
func.func @not_grouped_heads(%q: tensor<2x6x16x8xf32>, %k: tensor<2x2x16x8xf32>, %k3: tensor<2x3x16x8xf32>, %v6: tensor<2x6x16x8xf32>) -> (tensor<2x6x16x8xf32>, tensor<2x6x16x8xf32>, tensor<2x6x16x8xf32>) {
  %ku = nn.reshape %k : tensor<2x2x16x8xf32> -> tensor<2x1x2x16x8xf32>
  %ke = nn.expand %ku : tensor<2x1x2x16x8xf32> -> tensor<2x3x2x16x8xf32>
  %kr = nn.reshape %ke : tensor<2x3x2x16x8xf32> -> tensor<2x6x16x8xf32>
  %a, %l1 = nn.attention %q, %kr, %kr {scale = 0.353553385 : f32} : (tensor<2x6x16x8xf32>, tensor<2x6x16x8xf32>, tensor<2x6x16x8xf32>) -> (tensor<2x6x16x8xf32>, tensor<2x6x16x1xf32>)
  %gu = nn.unsqueeze %k {axes = array<i64: 2>} : (tensor<2x2x16x8xf32>) -> tensor<2x2x1x16x8xf32>
  %ge = nn.expand %gu : tensor<2x2x1x16x8xf32> -> tensor<2x2x3x16x8xf32>
  %gr = nn.reshape %ge : tensor<2x2x3x16x8xf32> -> tensor<2x6x16x8xf32>
  %hu = nn.unsqueeze %k3 {axes = array<i64: 2>} : (tensor<2x3x16x8xf32>) -> tensor<2x3x1x16x8xf32>
  %he = nn.expand %hu : tensor<2x3x1x16x8xf32> -> tensor<2x3x2x16x8xf32>
  %hr = nn.reshape %he : tensor<2x3x2x16x8xf32> -> tensor<2x6x16x8xf32>
  %b, %l2 = nn.attention %q, %gr, %hr {scale = 0.353553385 : f32} : (tensor<2x6x16x8xf32>, tensor<2x6x16x8xf32>, tensor<2x6x16x8xf32>) -> (tensor<2x6x16x8xf32>, tensor<2x6x16x1xf32>)
  %c, %l3 = nn.attention %q, %gr, %v6 {scale = 0.353553385 : f32} : (tensor<2x6x16x8xf32>, tensor<2x6x16x8xf32>, tensor<2x6x16x8xf32>) -> (tensor<2x6x16x8xf32>, tensor<2x6x16x1xf32>)
  return %a, %b, %c : tensor<2x6x16x8xf32>, tensor<2x6x16x8xf32>, tensor<2x6x16x8xf32>
}
