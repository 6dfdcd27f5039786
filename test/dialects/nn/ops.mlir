// Every nn op parses, verifies and prints back in its custom form.
// RUN: pipec-opt %s | FileCheck %s
// RUN: pipec-opt %s | pipec-opt | FileCheck %s

// CHECK-LABEL: func @elementwise
func.func @elementwise(%a: tensor<4x3xf32>, %b: tensor<3xf32>, %c: tensor<4x1xi1>) -> tensor<4x3xf32> {
  // CHECK: nn.add %{{.*}}, %{{.*}} : (tensor<4x3xf32>, tensor<3xf32>) -> tensor<4x3xf32>
  %0 = nn.add %a, %b : (tensor<4x3xf32>, tensor<3xf32>) -> tensor<4x3xf32>
  %1 = nn.sub %0, %b : (tensor<4x3xf32>, tensor<3xf32>) -> tensor<4x3xf32>
  %2 = nn.mul %1, %a : (tensor<4x3xf32>, tensor<4x3xf32>) -> tensor<4x3xf32>
  %3 = nn.div %2, %b : (tensor<4x3xf32>, tensor<3xf32>) -> tensor<4x3xf32>
  %4 = nn.pow %3, %b : (tensor<4x3xf32>, tensor<3xf32>) -> tensor<4x3xf32>
  // CHECK: nn.equal {{.*}} -> tensor<4x3xi1>
  %5 = nn.equal %4, %b : (tensor<4x3xf32>, tensor<3xf32>) -> tensor<4x3xi1>
  // CHECK: nn.where {{.*}} : (tensor<4x1xi1>, tensor<4x3xf32>, tensor<3xf32>) -> tensor<4x3xf32>
  %6 = nn.where %c, %4, %b : (tensor<4x1xi1>, tensor<4x3xf32>, tensor<3xf32>) -> tensor<4x3xf32>
  // CHECK: nn.relu %{{.*}} : tensor<4x3xf32>
  %7 = nn.relu %6 : tensor<4x3xf32>
  %8 = nn.tanh %7 : tensor<4x3xf32>
  %9 = nn.sigmoid %8 : tensor<4x3xf32>
  %10 = nn.erf %9 : tensor<4x3xf32>
  %11 = nn.sqrt %10 : tensor<4x3xf32>
  // CHECK: nn.gelu %{{.*}} {approximate = "tanh"} : tensor<4x3xf32>
  %12 = nn.gelu %11 {approximate = "tanh"} : tensor<4x3xf32>
  // CHECK: nn.cast %{{.*}} : tensor<4x3xf32> -> tensor<4x3xf64>
  %13 = nn.cast %12 : tensor<4x3xf32> -> tensor<4x3xf64>
  return %12 : tensor<4x3xf32>
}

// CHECK-LABEL: func @linear_algebra
func.func @linear_algebra(%x: tensor<8x32xf32>, %w: tensor<64x32xf32>, %bias: tensor<64xf32>,
                          %q: tensor<2x4x16x8xf32>, %k: tensor<2x4x8x16xf32>, %v: tensor<8xf32>) {
  // CHECK: nn.gemm {{.*}} {transB = true} : (tensor<8x32xf32>, tensor<64x32xf32>, tensor<64xf32>) -> tensor<8x64xf32>
  %0 = nn.gemm %x, %w, %bias {transB = true} : (tensor<8x32xf32>, tensor<64x32xf32>, tensor<64xf32>) -> tensor<8x64xf32>
  // CHECK: nn.gemm {{.*}} {alpha = 2.000000e+00 : f32, transA = true}
  %1 = nn.gemm %x, %x {alpha = 2.0 : f32, transA = true} : (tensor<8x32xf32>, tensor<8x32xf32>) -> tensor<32x32xf32>
  // CHECK: nn.matmul {{.*}} -> tensor<2x4x16x16xf32>
  %2 = nn.matmul %q, %k : (tensor<2x4x16x8xf32>, tensor<2x4x8x16xf32>) -> tensor<2x4x16x16xf32>
  // CHECK: nn.matmul {{.*}} -> tensor<2x4x16xf32>
  %3 = nn.matmul %q, %v : (tensor<2x4x16x8xf32>, tensor<8xf32>) -> tensor<2x4x16xf32>
  return
}

// CHECK-LABEL: func @cnn
func.func @cnn(%x: tensor<4x3x16x16xf32>, %w: tensor<8x3x3x3xf32>, %b: tensor<8xf32>,
               %s: tensor<8xf32>, %m: tensor<8xf32>, %var: tensor<8xf32>) -> tensor<4x8x1x1xf32> {
  // CHECK: nn.conv {{.*}} {dilations = array<i64: 1, 1>, pads = array<i64: 1, 1, 1, 1>, strides = array<i64: 1, 1>}
  // CHECK-SAME: -> tensor<4x8x16x16xf32>
  %0 = nn.conv %x, %w, %b {strides = array<i64: 1, 1>, pads = array<i64: 1, 1, 1, 1>, dilations = array<i64: 1, 1>} : (tensor<4x3x16x16xf32>, tensor<8x3x3x3xf32>, tensor<8xf32>) -> tensor<4x8x16x16xf32>
  // The epilogue pipec-fuse-norm-epilogue writes: the residual named.
  // CHECK: nn.conv %{{.*}}, %{{.*}}, %{{.*}} residual = %{{.*}} {activation = #nn.unary<relu6>, dilations
  %e = nn.conv %x, %w, %b residual = %0 {strides = array<i64: 1, 1>, pads = array<i64: 1, 1, 1, 1>, dilations = array<i64: 1, 1>, activation = #nn.unary<relu6>} : (tensor<4x3x16x16xf32>, tensor<8x3x3x3xf32>, tensor<8xf32>, tensor<4x8x16x16xf32>) -> tensor<4x8x16x16xf32>
  // CHECK: nn.conv %{{.*}}, %{{.*}} residual = %{{.*}} {dilations
  %f = nn.conv %x, %w residual = %e {strides = array<i64: 1, 1>, pads = array<i64: 1, 1, 1, 1>, dilations = array<i64: 1, 1>} : (tensor<4x3x16x16xf32>, tensor<8x3x3x3xf32>, tensor<4x8x16x16xf32>) -> tensor<4x8x16x16xf32>
  // CHECK: nn.batch_norm {{.*}} {training = true}
  %1:3 = nn.batch_norm %0, %s, %b, %m, %var {training = true} : (tensor<4x8x16x16xf32>, tensor<8xf32>, tensor<8xf32>, tensor<8xf32>, tensor<8xf32>) -> (tensor<4x8x16x16xf32>, tensor<8xf32>, tensor<8xf32>)
  // CHECK: nn.max_pool {{.*}} -> tensor<4x8x8x8xf32>
  %2 = nn.max_pool %1#0 {kernel_shape = array<i64: 2, 2>, strides = array<i64: 2, 2>, pads = array<i64: 0, 0, 0, 0>, dilations = array<i64: 1, 1>} : (tensor<4x8x16x16xf32>) -> tensor<4x8x8x8xf32>
  // CHECK: nn.average_pool {{.*}} -> tensor<4x8x5x5xf32>
  %3 = nn.average_pool %2 {kernel_shape = array<i64: 3, 3>, strides = array<i64: 2, 2>, pads = array<i64: 1, 1, 1, 1>, ceil_mode = true} : (tensor<4x8x8x8xf32>) -> tensor<4x8x5x5xf32>
  // CHECK: nn.pad {{.*}} -> tensor<4x8x7x7xf32>
  %4 = nn.pad %3 {pads = array<i64: 0, 0, 1, 1, 0, 0, 1, 1>} : (tensor<4x8x5x5xf32>) -> tensor<4x8x7x7xf32>
  // CHECK: nn.global_average_pool {{.*}} -> tensor<4x8x1x1xf32>
  %5 = nn.global_average_pool %4 : (tensor<4x8x7x7xf32>) -> tensor<4x8x1x1xf32>
  // CHECK: nn.global_average_pool {{.*}} {channels_last = true} {{.*}} -> tensor<4x1x1x7xf32>
  %cl = nn.global_average_pool %4 {channels_last = true} : (tensor<4x8x7x7xf32>) -> tensor<4x1x1x7xf32>
  return %5 : tensor<4x8x1x1xf32>
}

// CHECK-LABEL: func @transformer
func.func @transformer(%x: tensor<2x16x32xf32>, %g: tensor<32xf32>, %tokens: tensor<2x16xi64>,
                       %emb: tensor<64x32xf32>, %labels: tensor<32xi64>) -> tensor<f32> {
  // CHECK: nn.layer_norm %{{.*}}, %{{.*}}, %{{.*}} {epsilon = 1.000000e-03 : f32} : (tensor<2x16x32xf32>, tensor<32xf32>, tensor<32xf32>) -> (tensor<2x16x32xf32>, tensor<2x16x1xf32>, tensor<2x16x1xf32>)
  %0:3 = nn.layer_norm %x, %g, %g {epsilon = 1.0e-3 : f32} : (tensor<2x16x32xf32>, tensor<32xf32>, tensor<32xf32>) -> (tensor<2x16x32xf32>, tensor<2x16x1xf32>, tensor<2x16x1xf32>)
  // CHECK: nn.gather {{.*}} -> tensor<2x16x32xf32>
  %1 = nn.gather %emb, %tokens : (tensor<64x32xf32>, tensor<2x16xi64>) -> tensor<2x16x32xf32>
  // CHECK: nn.reduce_mean {{.*}} {axes = array<i64: 2>} : (tensor<2x16x32xf32>) -> tensor<2x16x1xf32>
  %2 = nn.reduce_mean %1 {axes = array<i64: 2>} : (tensor<2x16x32xf32>) -> tensor<2x16x1xf32>
  // CHECK: nn.reshape %{{.*}} : tensor<2x16x32xf32> -> tensor<2x16x2x16xf32>
  %3 = nn.reshape %0#0 : tensor<2x16x32xf32> -> tensor<2x16x2x16xf32>
  // CHECK: nn.transpose {{.*}} {perm = array<i64: 0, 2, 1, 3>}
  %4 = nn.transpose %3 {perm = array<i64: 0, 2, 1, 3>} : (tensor<2x16x2x16xf32>) -> tensor<2x2x16x16xf32>
  // CHECK: nn.softmax
  %5 = nn.softmax %4 {axis = -1 : i64} : (tensor<2x2x16x16xf32>) -> tensor<2x2x16x16xf32>
  // CHECK: nn.dropout {{.*}} {ratio = 1.000000e-01 : f32, training = true}
  %6:2 = nn.dropout %5 {ratio = 0.1 : f32, training = true} : (tensor<2x2x16x16xf32>) -> (tensor<2x2x16x16xf32>, tensor<2x2x16x16xi1>)
  // CHECK: nn.split {{.*}} -> (tensor<2x16x8xf32>, tensor<2x16x24xf32>)
  %7:2 = nn.split %x {axis = 2 : i64, sizes = array<i64: 8, 24>} : (tensor<2x16x32xf32>) -> (tensor<2x16x8xf32>, tensor<2x16x24xf32>)
  // CHECK: nn.concat {{.*}} -> tensor<2x16x32xf32>
  %8 = nn.concat %7#1, %7#0 {axis = -1 : i64} : (tensor<2x16x24xf32>, tensor<2x16x8xf32>) -> tensor<2x16x32xf32>
  // CHECK: nn.slice {{.*}} -> tensor<2x8x16xf32>
  %9 = nn.slice %8 {starts = array<i64: 0, 15, 0>, ends = array<i64: 2, -1, 32>, steps = array<i64: 1, -2, 2>} : (tensor<2x16x32xf32>) -> tensor<2x8x16xf32>
  // CHECK: nn.unsqueeze {{.*}} -> tensor<1x2x8x1x16xf32>
  %10 = nn.unsqueeze %9 {axes = array<i64: 0, 3>} : (tensor<2x8x16xf32>) -> tensor<1x2x8x1x16xf32>
  // CHECK: nn.squeeze {{.*}} -> tensor<2x8x16xf32>
  %11 = nn.squeeze %10 {axes = array<i64: 0, 3>} : (tensor<1x2x8x1x16xf32>) -> tensor<2x8x16xf32>
  // CHECK: nn.expand %{{.*}} : tensor<2x8x16xf32> -> tensor<3x2x8x16xf32>
  %12 = nn.expand %11 : tensor<2x8x16xf32> -> tensor<3x2x8x16xf32>
  // CHECK: nn.flatten {{.*}} -> tensor<48x16xf32>
  %13 = nn.flatten %12 {axis = 3 : i64} : (tensor<3x2x8x16xf32>) -> tensor<48x16xf32>
  // CHECK: nn.constant dense<[1, 2]> : tensor<2xi64>
  %14 = nn.constant dense<[1, 2]> : tensor<2xi64>
  %15 = nn.reshape %0#0 : tensor<2x16x32xf32> -> tensor<32x32xf32>
  // CHECK: nn.softmax_cross_entropy_loss {{.*}} -> (tensor<f32>, tensor<32x32xf32>)
  %16:2 = nn.softmax_cross_entropy_loss %15, %labels : (tensor<32x32xf32>, tensor<32xi64>) -> (tensor<f32>, tensor<32x32xf32>)
  return %16#0 : tensor<f32>
}

// Gradient kinds are typed attributes spelled as pipec/vocabulary.h's tables.
// CHECK-LABEL: func @gradient_kinds
func.func @gradient_kinds(%dy: tensor<4x3xf32>, %x: tensor<4x3xf32>, %r: tensor<3xf32>) -> tensor<4x3xf32> {
  // CHECK: nn.unary_grad <gelu_tanh> %{{.*}}, x = %{{.*}} : tensor<4x3xf32>
  %0 = nn.unary_grad <gelu_tanh> %dy, x = %x : tensor<4x3xf32>
  // CHECK: nn.binary_grad <div_rhs> %{{.*}}, %{{.*}}, %{{.*}} : (tensor<4x3xf32>, tensor<4x3xf32>, tensor<3xf32>) -> tensor<4x3xf32>
  %1 = nn.binary_grad <div_rhs> %0, %x, %r : (tensor<4x3xf32>, tensor<4x3xf32>, tensor<3xf32>) -> tensor<4x3xf32>
  return %1 : tensor<4x3xf32>
}

// bf16 storage (pipec-bf16-storage) keeps rotary tables and an additive
// attention mask float32 beside bf16 activations.
// CHECK-LABEL: func @bf16_storage
func.func @bf16_storage(%x: tensor<2x4x16x8xbf16>, %t: tensor<16x8xf32>, %m: tensor<1x1x16x16xf32>) -> tensor<2x4x16x8xbf16> {
  // CHECK: nn.rotary %{{.*}}, %{{.*}}, %{{.*}} : (tensor<2x4x16x8xbf16>, tensor<16x8xf32>, tensor<16x8xf32>) -> tensor<2x4x16x8xbf16>
  %0 = nn.rotary %x, %t, %t : (tensor<2x4x16x8xbf16>, tensor<16x8xf32>, tensor<16x8xf32>) -> tensor<2x4x16x8xbf16>
  // CHECK: nn.attention %{{.*}}, %{{.*}}, %{{.*}}, %{{.*}} {{.*}}: (tensor<2x4x16x8xbf16>, tensor<2x4x16x8xbf16>, tensor<2x4x16x8xbf16>, tensor<1x1x16x16xf32>) -> (tensor<2x4x16x8xbf16>, tensor<2x4x16x1xf32>)
  %1, %lse = nn.attention %0, %0, %0, %m {scale = 0.353553385 : f32} : (tensor<2x4x16x8xbf16>, tensor<2x4x16x8xbf16>, tensor<2x4x16x8xbf16>, tensor<1x1x16x16xf32>) -> (tensor<2x4x16x8xbf16>, tensor<2x4x16x1xf32>)
  return %1 : tensor<2x4x16x8xbf16>
}

// Sequence-major attention (heads after the sequence axis): the result in
// the operands' layout, log_sum_exp head-major; its gradient likewise.
// CHECK-LABEL: func @attention_sequence_major
func.func @attention_sequence_major(%q: tensor<2x16x4x8xf32>, %k: tensor<2x12x4x8xf32>, %v: tensor<2x12x4x6xf32>, %m: tensor<1x1x16x12xi1>) -> (tensor<2x16x4x8xf32>, tensor<2x12x4x8xf32>, tensor<2x12x4x6xf32>) {
  // CHECK: nn.attention {{.*}} sequence_major = true} : (tensor<2x16x4x8xf32>, tensor<2x12x4x8xf32>, tensor<2x12x4x6xf32>, tensor<1x1x16x12xi1>) -> (tensor<2x16x4x6xf32>, tensor<2x4x16x1xf32>)
  %y, %lse = nn.attention %q, %k, %v, %m {scale = 0.5 : f32, sequence_major = true} : (tensor<2x16x4x8xf32>, tensor<2x12x4x8xf32>, tensor<2x12x4x6xf32>, tensor<1x1x16x12xi1>) -> (tensor<2x16x4x6xf32>, tensor<2x4x16x1xf32>)
  // CHECK: nn.attention_grad {{.*}} sequence_major = true}
  %dq, %dk, %dv = nn.attention_grad %y, %q, %k, %v, %m, %y, %lse {scale = 0.5 : f32, sequence_major = true} : (tensor<2x16x4x6xf32>, tensor<2x16x4x8xf32>, tensor<2x12x4x8xf32>, tensor<2x12x4x6xf32>, tensor<1x1x16x12xi1>, tensor<2x16x4x6xf32>, tensor<2x4x16x1xf32>) -> (tensor<2x16x4x8xf32>, tensor<2x12x4x8xf32>, tensor<2x12x4x6xf32>)
  return %dq, %dk, %dv : tensor<2x16x4x8xf32>, tensor<2x12x4x8xf32>, tensor<2x12x4x6xf32>
}

// Joint q/k/v: one [B, S, H + 2·Hkv, D] operand read as its three windows
// (H = 4, Hkv = 2 here); the gradient is the joint operand's alone.
// CHECK-LABEL: func @attention_joint
func.func @attention_joint(%j: tensor<2x16x8x8xf32>, %m: tensor<1x1x16x16xi1>) -> tensor<2x16x8x8xf32> {
  // CHECK: nn.attention {{.*}}joint_kv_heads = 2 : i64{{.*}}sequence_major = true} : (tensor<2x16x8x8xf32>, tensor<2x16x8x8xf32>, tensor<2x16x8x8xf32>, tensor<1x1x16x16xi1>) -> (tensor<2x16x4x8xf32>, tensor<2x4x16x1xf32>)
  %y, %lse = nn.attention %j, %j, %j, %m {joint_kv_heads = 2 : i64, scale = 0.5 : f32, sequence_major = true} : (tensor<2x16x8x8xf32>, tensor<2x16x8x8xf32>, tensor<2x16x8x8xf32>, tensor<1x1x16x16xi1>) -> (tensor<2x16x4x8xf32>, tensor<2x4x16x1xf32>)
  // CHECK: nn.attention_grad {{.*}} -> tensor<2x16x8x8xf32>
  %dj = nn.attention_grad %y, %j, %j, %j, %m, %y, %lse {joint_kv_heads = 2 : i64, scale = 0.5 : f32, sequence_major = true} : (tensor<2x16x4x8xf32>, tensor<2x16x8x8xf32>, tensor<2x16x8x8xf32>, tensor<2x16x8x8xf32>, tensor<1x1x16x16xi1>, tensor<2x16x4x8xf32>, tensor<2x4x16x1xf32>) -> tensor<2x16x8x8xf32>
  return %dj : tensor<2x16x8x8xf32>
}

// Grouped-query heads: key and value with a divisor of the query's heads
// (axis -3 head-major, -2 sequence-major); their gradients keep their shapes.
// CHECK-LABEL: func @attention_grouped_heads
func.func @attention_grouped_heads(%q: tensor<2x6x16x8xbf16>, %k: tensor<2x2x16x8xbf16>, %qs: tensor<2x16x6x8xf32>, %ks: tensor<2x16x3x8xf32>) -> (tensor<2x6x16x8xbf16>, tensor<2x2x16x8xbf16>, tensor<2x16x3x8xf32>) {
  // CHECK: nn.attention {{.*}} : (tensor<2x6x16x8xbf16>, tensor<2x2x16x8xbf16>, tensor<2x2x16x8xbf16>) -> (tensor<2x6x16x8xbf16>, tensor<2x6x16x1xf32>)
  %y, %lse = nn.attention %q, %k, %k {scale = 0.5 : f32} : (tensor<2x6x16x8xbf16>, tensor<2x2x16x8xbf16>, tensor<2x2x16x8xbf16>) -> (tensor<2x6x16x8xbf16>, tensor<2x6x16x1xf32>)
  // CHECK: nn.attention_grad {{.*}} -> (tensor<2x6x16x8xbf16>, tensor<2x2x16x8xbf16>, tensor<2x2x16x8xbf16>)
  %dq, %dk, %dv = nn.attention_grad %y, %q, %k, %k, %y, %lse {scale = 0.5 : f32} : (tensor<2x6x16x8xbf16>, tensor<2x6x16x8xbf16>, tensor<2x2x16x8xbf16>, tensor<2x2x16x8xbf16>, tensor<2x6x16x8xbf16>, tensor<2x6x16x1xf32>) -> (tensor<2x6x16x8xbf16>, tensor<2x2x16x8xbf16>, tensor<2x2x16x8xbf16>)
  // CHECK: nn.attention {{.*}} sequence_major = true} : (tensor<2x16x6x8xf32>, tensor<2x16x3x8xf32>, tensor<2x16x3x8xf32>) -> (tensor<2x16x6x8xf32>, tensor<2x6x16x1xf32>)
  %ys, %lses = nn.attention %qs, %ks, %ks {scale = 0.5 : f32, sequence_major = true} : (tensor<2x16x6x8xf32>, tensor<2x16x3x8xf32>, tensor<2x16x3x8xf32>) -> (tensor<2x16x6x8xf32>, tensor<2x6x16x1xf32>)
  %dqs, %dks, %dvs = nn.attention_grad %ys, %qs, %ks, %ks, %ys, %lses {scale = 0.5 : f32, sequence_major = true} : (tensor<2x16x6x8xf32>, tensor<2x16x6x8xf32>, tensor<2x16x3x8xf32>, tensor<2x16x3x8xf32>, tensor<2x16x6x8xf32>, tensor<2x6x16x1xf32>) -> (tensor<2x16x6x8xf32>, tensor<2x16x3x8xf32>, tensor<2x16x3x8xf32>)
  return %y, %dk, %dks : tensor<2x6x16x8xbf16>, tensor<2x2x16x8xbf16>, tensor<2x16x3x8xf32>
}
