// The verifiers reject wrong ranks, shapes and element types, naming the op.
// RUN: pipec-opt %s -split-input-file -verify-diagnostics

func.func @broadcast(%a: tensor<4x3xf32>, %b: tensor<4xf32>) {
  // expected-error @+2 {{nn.add: shapes [4,3] and [4] are not broadcast-compatible}}
  // expected-error @+1 {{'nn.add' op failed to infer returned types}}
  %0 = nn.add %a, %b : (tensor<4x3xf32>, tensor<4xf32>) -> tensor<4x3xf32>
  return
}

// -----

func.func @element_types(%a: tensor<3xf32>, %b: tensor<3xf64>) {
  // expected-error @+2 {{nn.mul: operand element types differ (f32 vs f64)}}
  // expected-error @+1 {{failed to infer returned types}}
  %0 = nn.mul %a, %b : (tensor<3xf32>, tensor<3xf64>) -> tensor<3xf32>
  return
}

// -----

func.func @wrong_result(%a: tensor<3xf32>, %b: tensor<3xf32>) {
  // expected-error @+2 {{'nn.sub' op inferred type(s) 'tensor<3xf32>' are incompatible with return type(s) of operation 'tensor<4xf32>'}}
  // expected-error @+1 {{failed to infer returned types}}
  %0 = nn.sub %a, %b : (tensor<3xf32>, tensor<3xf32>) -> tensor<4xf32>
  return
}

// -----

func.func @dynamic(%a: tensor<?xf32>) {
  // expected-error @+1 {{'nn.relu' op operand #0 must be statically shaped tensor of floating-point values}}
  %0 = nn.relu %a : tensor<?xf32>
  return
}

// -----

func.func @integer_relu(%a: tensor<3xi64>) {
  // expected-error @+1 {{'nn.relu' op operand #0 must be statically shaped tensor of floating-point values}}
  %0 = nn.relu %a : tensor<3xi64>
  return
}

// -----

func.func @gemm_inner(%a: tensor<8x32xf32>, %b: tensor<64x16xf32>) {
  // expected-error @+2 {{nn.gemm: inner dimensions differ (32 vs 16) for A [8,32] and B [64,16] (transposed)}}
  // expected-error @+1 {{failed to infer returned types}}
  %0 = nn.gemm %a, %b {transB = true} : (tensor<8x32xf32>, tensor<64x16xf32>) -> tensor<8x64xf32>
  return
}

// -----

func.func @gemm_rank(%a: tensor<2x8x32xf32>, %b: tensor<32x16xf32>) {
  // expected-error @+2 {{nn.gemm: A and B must be 2-D, got [2,8,32] and [32,16]}}
  // expected-error @+1 {{failed to infer returned types}}
  %0 = nn.gemm %a, %b : (tensor<2x8x32xf32>, tensor<32x16xf32>) -> tensor<8x16xf32>
  return
}

// -----

func.func @matmul_inner(%a: tensor<2x8x32xf32>, %b: tensor<16x4xf32>) {
  // expected-error @+2 {{nn.matmul: inner dimensions differ for [2,8,32] x [16,4]}}
  // expected-error @+1 {{failed to infer returned types}}
  %0 = nn.matmul %a, %b : (tensor<2x8x32xf32>, tensor<16x4xf32>) -> tensor<2x8x4xf32>
  return
}

// -----

func.func @conv_channels(%x: tensor<1x3x8x8xf32>, %w: tensor<4x2x3x3xf32>) {
  // expected-error @+2 {{nn.conv: 3 input channels, group 1 and weight [4,2,3,3] do not match}}
  // expected-error @+1 {{failed to infer returned types}}
  %0 = nn.conv %x, %w {strides = array<i64: 1, 1>, pads = array<i64: 0, 0, 0, 0>, dilations = array<i64: 1, 1>} : (tensor<1x3x8x8xf32>, tensor<4x2x3x3xf32>) -> tensor<1x4x6x6xf32>
  return
}

// -----

// A convolution's epilogue: the residual has the result's shape and element
// type, the activation is one the kernels apply.
func.func @conv_residual(%x: tensor<1x3x8x8xf32>, %w: tensor<4x3x3x3xf32>, %r: tensor<1x4x8x8xf32>) {
  // expected-error @+2 {{nn.conv: the residual [1,4,8,8] does not have the result's shape and element type [1,4,6,6]}}
  // expected-error @+1 {{failed to infer returned types}}
  %0 = nn.conv %x, %w residual = %r {strides = array<i64: 1, 1>, pads = array<i64: 0, 0, 0, 0>, dilations = array<i64: 1, 1>} : (tensor<1x3x8x8xf32>, tensor<4x3x3x3xf32>, tensor<1x4x8x8xf32>) -> tensor<1x4x6x6xf32>
  return
}

// -----

func.func @conv_residual_type(%x: tensor<1x3x8x8xf32>, %w: tensor<4x3x3x3xf32>, %r: tensor<1x4x6x6xbf16>) {
  // expected-error @+2 {{nn.conv: the residual [1,4,6,6] does not have the result's shape and element type [1,4,6,6]}}
  // expected-error @+1 {{failed to infer returned types}}
  %0 = nn.conv %x, %w residual = %r {strides = array<i64: 1, 1>, pads = array<i64: 0, 0, 0, 0>, dilations = array<i64: 1, 1>} : (tensor<1x3x8x8xf32>, tensor<4x3x3x3xf32>, tensor<1x4x6x6xbf16>) -> tensor<1x4x6x6xf32>
  return
}

// -----

func.func @conv_activation(%x: tensor<1x3x8x8xf32>, %w: tensor<4x3x3x3xf32>) {
  // expected-error @+2 {{nn.conv: the only activations its epilogue applies are relu and relu6}}
  // expected-error @+1 {{failed to infer returned types}}
  %0 = nn.conv %x, %w {strides = array<i64: 1, 1>, pads = array<i64: 0, 0, 0, 0>, dilations = array<i64: 1, 1>, activation = #nn.unary<tanh>} : (tensor<1x3x8x8xf32>, tensor<4x3x3x3xf32>) -> tensor<1x4x6x6xf32>
  return
}

// -----

// Channels-last: the channels are the last axis of x and of the weight.
func.func @conv_channels_last(%x: tensor<1x8x8x3xf32>, %w: tensor<4x3x3x2xf32>) {
  // expected-error @+2 {{nn.conv: 3 input channels, group 1 and weight [4,3,3,2] do not match}}
  // expected-error @+1 {{failed to infer returned types}}
  %0 = nn.conv %x, %w {strides = array<i64: 1, 1>, pads = array<i64: 0, 0, 0, 0>, dilations = array<i64: 1, 1>, channels_last = true} : (tensor<1x8x8x3xf32>, tensor<4x3x3x2xf32>) -> tensor<1x6x6x4xf32>
  return
}

// -----

func.func @conv_input_grad_channels_last(%dy: tensor<1x6x6x4xf32>, %w: tensor<4x3x3x3xf32>) {
  // expected-error @+1 {{convolving the result [1, 8, 9, 3] gives 7 on spatial axis 1, not dy's 6}}
  %0 = nn.conv_input_grad %dy, %w {strides = array<i64: 1, 1>, pads = array<i64: 0, 0, 0, 0>, dilations = array<i64: 1, 1>, channels_last = true} : (tensor<1x6x6x4xf32>, tensor<4x3x3x3xf32>) -> tensor<1x8x9x3xf32>
  return
}

// -----

func.func @batch_norm_channels_last(%x: tensor<2x5x5x3xf32>, %s: tensor<5xf32>) {
  // expected-error @+2 {{nn.batch_norm: scale, bias, mean and variance must have shape [3], got [5]}}
  // expected-error @+1 {{failed to infer returned types}}
  %0:3 = nn.batch_norm %x, %s, %s, %s, %s {channels_last = true} : (tensor<2x5x5x3xf32>, tensor<5xf32>, tensor<5xf32>, tensor<5xf32>, tensor<5xf32>) -> (tensor<2x5x5x3xf32>, tensor<5xf32>, tensor<5xf32>)
  return
}

// -----

func.func @conv_pads(%x: tensor<1x3x8x8xf32>, %w: tensor<4x3x3x3xf32>) {
  // expected-error @+2 {{nn.conv: kernel_shape, strides and dilations need 2 entries and pads 4 for input [1,3,8,8]}}
  // expected-error @+1 {{failed to infer returned types}}
  %0 = nn.conv %x, %w {strides = array<i64: 1, 1>, pads = array<i64: 0, 0>, dilations = array<i64: 1, 1>} : (tensor<1x3x8x8xf32>, tensor<4x3x3x3xf32>) -> tensor<1x4x6x6xf32>
  return
}

// -----

func.func @batch_norm_stats(%x: tensor<4x8x2x2xf32>, %s: tensor<8xf32>, %m: tensor<4xf32>) {
  // expected-error @+2 {{nn.batch_norm: scale, bias, mean and variance must have shape [8], got [4]}}
  // expected-error @+1 {{failed to infer returned types}}
  %0:3 = nn.batch_norm %x, %s, %s, %m, %s : (tensor<4x8x2x2xf32>, tensor<8xf32>, tensor<8xf32>, tensor<4xf32>, tensor<8xf32>) -> (tensor<4x8x2x2xf32>, tensor<4xf32>, tensor<8xf32>)
  return
}

// -----

func.func @pool_window(%x: tensor<1x3x2x2xf32>) {
  // expected-error @+2 {{nn.max_pool: window larger than the padded input [1,3,2,2]}}
  // expected-error @+1 {{failed to infer returned types}}
  %0 = nn.max_pool %x {kernel_shape = array<i64: 3, 3>, strides = array<i64: 1, 1>, pads = array<i64: 0, 0, 0, 0>, dilations = array<i64: 1, 1>} : (tensor<1x3x2x2xf32>) -> tensor<1x3x1x1xf32>
  return
}

// -----

func.func @reshape_count(%x: tensor<2x3xf32>) {
  // expected-error @+1 {{'nn.reshape' op cannot reshape [2,3] (6 elements) into [4,2] (8 elements)}}
  %0 = nn.reshape %x : tensor<2x3xf32> -> tensor<4x2xf32>
  return
}

// -----

func.func @expand_shape(%x: tensor<2x3xf32>) {
  // expected-error @+1 {{'nn.expand' op cannot expand [2,3] to [4,3]}}
  %0 = nn.expand %x : tensor<2x3xf32> -> tensor<4x3xf32>
  return
}

// -----

func.func @transpose_perm(%x: tensor<2x3xf32>) {
  // expected-error @+2 {{nn.transpose: perm is not a permutation}}
  // expected-error @+1 {{failed to infer returned types}}
  %0 = nn.transpose %x {perm = array<i64: 0, 0>} : (tensor<2x3xf32>) -> tensor<2x2xf32>
  return
}

// -----

func.func @split_sizes(%x: tensor<2x6xf32>) {
  // expected-error @+2 {{nn.split: piece sizes sum to 5 but axis 1 has size 6}}
  // expected-error @+1 {{failed to infer returned types}}
  %0:2 = nn.split %x {axis = 1 : i64, sizes = array<i64: 2, 3>} : (tensor<2x6xf32>) -> (tensor<2x2xf32>, tensor<2x3xf32>)
  return
}

// -----

func.func @squeeze_size(%x: tensor<2x6xf32>) {
  // expected-error @+2 {{nn.squeeze: axis 1 of [2,6] is not a size-1 axis}}
  // expected-error @+1 {{failed to infer returned types}}
  %0 = nn.squeeze %x {axes = array<i64: 1>} : (tensor<2x6xf32>) -> tensor<2xf32>
  return
}

// -----

func.func @concat_shapes(%a: tensor<2x6xf32>, %b: tensor<3x6xf32>) {
  // expected-error @+2 {{nn.concat: input shapes [2,6] and [3,6] differ outside axis 1}}
  // expected-error @+1 {{failed to infer returned types}}
  %0 = nn.concat %a, %b {axis = 1 : i64} : (tensor<2x6xf32>, tensor<3x6xf32>) -> tensor<2x12xf32>
  return
}

// -----

func.func @slice_bounds(%x: tensor<4xf32>) {
  // expected-error @+2 {{nn.slice: bounds of axis 0 are not normalized for size 4}}
  // expected-error @+1 {{failed to infer returned types}}
  %0 = nn.slice %x {starts = array<i64: 0>, ends = array<i64: 9>, steps = array<i64: 1>} : (tensor<4xf32>) -> tensor<4xf32>
  return
}

// -----

func.func @gather_axis(%x: tensor<4x2xf32>, %i: tensor<3xi64>) {
  // expected-error @+2 {{nn.gather: axis 2 out of range for rank 2}}
  // expected-error @+1 {{failed to infer returned types}}
  %0 = nn.gather %x, %i {axis = 2 : i64} : (tensor<4x2xf32>, tensor<3xi64>) -> tensor<4x3xf32>
  return
}

// -----

func.func @gather_float_indices(%x: tensor<4x2xf32>, %i: tensor<3xf32>) {
  // expected-error @+1 {{'nn.gather' op operand #1 must be statically shaped tensor of 32-bit signless integer or 64-bit signless integer values}}
  %0 = nn.gather %x, %i : (tensor<4x2xf32>, tensor<3xf32>) -> tensor<3x2xf32>
  return
}

// -----

func.func @layer_norm_scale(%x: tensor<2x8xf32>, %g: tensor<4xf32>) {
  // expected-error @+2 {{nn.layer_norm: scale/bias of shape [4] does not broadcast to [8]}}
  // expected-error @+1 {{failed to infer returned types}}
  %0:3 = nn.layer_norm %x, %g : (tensor<2x8xf32>, tensor<4xf32>) -> (tensor<2x8xf32>, tensor<2x1xf32>, tensor<2x1xf32>)
  return
}

// -----

func.func @dropout_ratio(%x: tensor<2x8xf32>) {
  // expected-error @+2 {{nn.dropout: ratio must be in [0, 1), got 1.5}}
  // expected-error @+1 {{failed to infer returned types}}
  %0:2 = nn.dropout %x {ratio = 1.5 : f32} : (tensor<2x8xf32>) -> (tensor<2x8xf32>, tensor<2x8xi1>)
  return
}

// -----

func.func @loss_labels(%s: tensor<4x10xf32>, %l: tensor<5xi64>) {
  // expected-error @+2 {{nn.softmax_cross_entropy_loss: labels must have shape [4], got [5]}}
  // expected-error @+1 {{failed to infer returned types}}
  %0:2 = nn.softmax_cross_entropy_loss %s, %l : (tensor<4x10xf32>, tensor<5xi64>) -> (tensor<f32>, tensor<4x10xf32>)
  return
}

// -----

func.func @masked_softmax_mask(%x: tensor<2x8xf32>, %m: tensor<3x8xi1>) {
  // expected-error @+2 {{nn.masked_softmax: mask of shape [3,8] does not broadcast to the input's [2,8]}}
  // expected-error @+1 {{failed to infer returned types}}
  %0 = nn.masked_softmax %x, %m {scale = 1.0 : f32, fill = -1.0e4 : f32} : (tensor<2x8xf32>, tensor<3x8xi1>) -> tensor<2x8xf32>
  return
}

// -----

func.func @masked_softmax_grad_mask(%dy: tensor<2x8xf32>, %y: tensor<2x8xf32>, %m: tensor<8x1xi1>) {
  // expected-error @+1 {{'nn.masked_softmax_grad' op mask of shape [8,1] does not broadcast to the input's [2,8]}}
  %0 = nn.masked_softmax_grad %dy, %y, %m {scale = 1.0 : f32} : (tensor<2x8xf32>, tensor<2x8xf32>, tensor<8x1xi1>) -> tensor<2x8xf32>
  return
}

// -----

func.func @gelu_mode(%x: tensor<2xf32>) {
  // expected-error @+1 {{'nn.gelu' op approximate must be "none" or "tanh", got "erf"}}
  %0 = nn.gelu %x {approximate = "erf"} : tensor<2xf32>
  return
}

// -----

func.func @cast_shape(%x: tensor<2xf32>) {
  // expected-error @+1 {{'nn.cast' op changes the shape from [2] to [3]}}
  %0 = nn.cast %x : tensor<2xf32> -> tensor<3xf64>
  return
}

// -----

func.func @reduce_axes(%x: tensor<2x3xf32>) {
  // expected-error @+2 {{nn.reduce_mean: axes must be sorted, unique and in [0, 2)}}
  // expected-error @+1 {{failed to infer returned types}}
  %0 = nn.reduce_mean %x {axes = array<i64: 1, 0>} : (tensor<2x3xf32>) -> tensor<1x1xf32>
  return
}

// -----

// Kinds are pipec/vocabulary.h's spellings; the parser names the accepted ones.
func.func @unknown_unary_function(%dy: tensor<3xf32>) {
  // expected-error @+2 {{unknown unary function 'softmax' (relu, relu6, tanh, sigmoid, erf, sqrt, gelu, gelu_tanh, neg, reciprocal, abs, exp, log, sin, cos, softplus, softsign, floor, ceil, round, sign, tan, atan, asin, acos, sinh, cosh, asinh, acosh, atanh)}}
  // expected-error @+1 {{failed to parse NN_UnaryFunctionAttr parameter 'value'}}
  %0 = nn.unary_grad <softmax> %dy, x = %dy : tensor<3xf32>
  return
}

// -----

func.func @unknown_binary_gradient(%dy: tensor<3xf32>) {
  // expected-error @+2 {{unknown binary gradient 'add_rhs' (sub_rhs, div_rhs, pow_lhs, pow_rhs, max_lhs, max_rhs, min_lhs, min_rhs)}}
  // expected-error @+1 {{failed to parse NN_BinaryGradientAttr parameter 'value'}}
  %0 = nn.binary_grad <add_rhs> %dy, %dy, %dy : (tensor<3xf32>, tensor<3xf32>, tensor<3xf32>) -> tensor<3xf32>
  return
}

// -----

// nn.unary_grad takes exactly the forward value its kind's derivative reads.
func.func @unary_grad_missing_forward_value(%dy: tensor<3xf32>) {
  // expected-error @+1 {{'gelu' reads the forward input: needs x = ...}}
  %0 = nn.unary_grad <gelu> %dy, y = %dy : tensor<3xf32>
  return
}

// -----

func.func @unary_grad_unread_forward_value(%dy: tensor<3xf32>, %x: tensor<3xf32>) {
  // expected-error @+1 {{'relu' does not read x: give only y}}
  %0 = nn.unary_grad <relu> %dy, x = %x y = %dy : tensor<3xf32>
  return
}

// -----

// A training dropout's gradient needs the mask or the key to draw it again.
func.func @dropout_grad_without_mask(%dy: tensor<3xf32>) {
  // expected-error @+1 {{'nn.dropout_grad' op in training needs its mask or the forward dropout's dropout_op_id}}
  %0 = nn.dropout_grad %dy {ratio = 0.1 : f32, training = true} : (tensor<3xf32>) -> tensor<3xf32>
  return
}

// -----

func.func @dropout_grad_mask_and_key(%dy: tensor<3xf32>, %m: tensor<3xi1>) {
  // expected-error @+1 {{'nn.dropout_grad' op has both a mask and a dropout_op_id to draw one}}
  %0 = nn.dropout_grad %dy, %m {ratio = 0.1 : f32, training = true, dropout_op_id = 7 : i64} : (tensor<3xf32>, tensor<3xi1>) -> tensor<3xf32>
  return
}

// -----

// Only bf16 storage's float32 beside bf16: a float32 mask for f64 queries is refused.
func.func @attention_mask_type(%q: tensor<2x16x8xf64>, %m: tensor<16x16xf32>) {
  // expected-error @+2 {{nn.attention: an additive mask must have the query's element type (or be float32 with bf16 storage)}}
  // expected-error @+1 {{'nn.attention' op failed to infer returned types}}
  %0, %1 = nn.attention %q, %q, %q, %m {scale = 1.0 : f32} : (tensor<2x16x8xf64>, tensor<2x16x8xf64>, tensor<2x16x8xf64>, tensor<16x16xf32>) -> (tensor<2x16x8xf64>, tensor<2x16x1xf64>)
  return
}

// -----

func.func @rotary_table_type(%x: tensor<2x16x8xf64>, %t: tensor<16x8xf32>) {
  // expected-error @+2 {{nn.rotary: cos/sin of type tensor<16x8xf32> does not broadcast to the input tensor<2x16x8xf64>}}
  // expected-error @+1 {{'nn.rotary' op failed to infer returned types}}
  %0 = nn.rotary %x, %t, %t : (tensor<2x16x8xf64>, tensor<16x8xf32>, tensor<16x8xf32>) -> tensor<2x16x8xf64>
  return
}

// -----

// Sequence-major attention needs the heads axis: rank 3 at least, and key
// and value heads that divide the query's.
func.func @attention_sequence_major_rank(%q: tensor<16x8xf32>) {
  // expected-error @+2 {{nn.attention: query, key and value must have one rank >= 3, got [16,8], [16,8], [16,8]}}
  // expected-error @+1 {{'nn.attention' op failed to infer returned types}}
  %0, %1 = nn.attention %q, %q, %q {sequence_major = true} : (tensor<16x8xf32>, tensor<16x8xf32>, tensor<16x8xf32>) -> (tensor<16x8xf32>, tensor<16x1xf32>)
  return
}

// -----

func.func @attention_sequence_major_heads(%q: tensor<2x16x4x8xf32>, %k: tensor<2x16x3x8xf32>) {
  // expected-error @+2 {{nn.attention: query [L..., S, H, D], key [L..., T, H, D] and value [L..., T, H, Dv] (key and value may have a divisor of the query's heads H) do not agree: [2,16,4,8], [2,16,3,8], [2,16,3,8]}}
  // expected-error @+1 {{'nn.attention' op failed to infer returned types}}
  %0, %1 = nn.attention %q, %k, %k {sequence_major = true} : (tensor<2x16x4x8xf32>, tensor<2x16x3x8xf32>, tensor<2x16x3x8xf32>) -> (tensor<2x16x4x8xf32>, tensor<2x4x16x1xf32>)
  return
}

// -----

// Joint q/k/v: sequence-major, one value, heads H + 2·Hkv with Hkv
// dividing H; the gradient is the joint operand's alone.
func.func @attention_joint_head_major(%j: tensor<2x16x8x8xf32>) {
  // expected-error @+2 {{nn.attention: joint_kv_heads needs sequence_major and one value as query, key and value}}
  // expected-error @+1 {{'nn.attention' op failed to infer returned types}}
  %0, %1 = nn.attention %j, %j, %j {joint_kv_heads = 2 : i64} : (tensor<2x16x8x8xf32>, tensor<2x16x8x8xf32>, tensor<2x16x8x8xf32>) -> (tensor<2x16x4x8xf32>, tensor<2x4x16x1xf32>)
  return
}

// -----

func.func @attention_joint_two_values(%j: tensor<2x16x8x8xf32>, %k: tensor<2x16x8x8xf32>) {
  // expected-error @+2 {{nn.attention: joint_kv_heads needs sequence_major and one value as query, key and value}}
  // expected-error @+1 {{'nn.attention' op failed to infer returned types}}
  %0, %1 = nn.attention %j, %k, %j {joint_kv_heads = 2 : i64, sequence_major = true} : (tensor<2x16x8x8xf32>, tensor<2x16x8x8xf32>, tensor<2x16x8x8xf32>) -> (tensor<2x16x4x8xf32>, tensor<2x4x16x1xf32>)
  return
}

// -----

func.func @attention_joint_heads(%j: tensor<2x16x8x8xf32>) {
  // expected-error @+2 {{nn.attention: a joint query, key and value [2,16,8,8] must be [L'..., S, H + 2·Hkv, D] with Hkv = 3 dividing H > 0}}
  // expected-error @+1 {{'nn.attention' op failed to infer returned types}}
  %0, %1 = nn.attention %j, %j, %j {joint_kv_heads = 3 : i64, sequence_major = true} : (tensor<2x16x8x8xf32>, tensor<2x16x8x8xf32>, tensor<2x16x8x8xf32>) -> (tensor<2x16x2x8xf32>, tensor<2x2x16x1xf32>)
  return
}

// -----

func.func @attention_joint_grads(%j: tensor<2x16x8x8xf32>, %y: tensor<2x16x4x8xf32>, %lse: tensor<2x4x16x1xf32>) {
  // expected-error @+1 {{'nn.attention_grad' op dy must match the forward result, and the gradients their operands (the joint operand alone with joint_kv_heads)}}
  %0, %1, %2 = nn.attention_grad %y, %j, %j, %j, %y, %lse {joint_kv_heads = 2 : i64, sequence_major = true} : (tensor<2x16x4x8xf32>, tensor<2x16x8x8xf32>, tensor<2x16x8x8xf32>, tensor<2x16x8x8xf32>, tensor<2x16x4x8xf32>, tensor<2x4x16x1xf32>) -> (tensor<2x16x8x8xf32>, tensor<2x16x8x8xf32>, tensor<2x16x8x8xf32>)
  return
}

// -----

// Grouped key and value heads must agree with each other.
func.func @attention_grouped_heads_disagree(%q: tensor<2x4x16x8xf32>, %k: tensor<2x2x16x8xf32>, %v: tensor<2x1x16x8xf32>) {
  // expected-error @+2 {{nn.attention: query [L..., S, D], key [L..., T, D] and value [L..., T, Dv] (key and value may have a divisor of the query's heads H) do not agree: [2,4,16,8], [2,2,16,8], [2,1,16,8]}}
  // expected-error @+1 {{'nn.attention' op failed to infer returned types}}
  %0, %1 = nn.attention %q, %k, %v : (tensor<2x4x16x8xf32>, tensor<2x2x16x8xf32>, tensor<2x1x16x8xf32>) -> (tensor<2x4x16x8xf32>, tensor<2x4x16x1xf32>)
  return
}
