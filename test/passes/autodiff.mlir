// RUN: pipec-opt %s -split-input-file --pipec-autodiff | FileCheck %s
// RUN: pipec-opt %s -split-input-file --pipec-autodiff 2>&1 | pipec-opt -split-input-file | FileCheck %s --check-prefix=ROUNDTRIP

// Linear layer + loss: the weight gradient is W work, the activation
// gradient B; the first layer's input needs no gradient at all.
// CHECK-LABEL: func.func @train_step
// CHECK-SAME: -> (tensor<f32> {nn.name = "loss", nn.role = #nn.role<loss>}, tensor<4x3xf32> {nn.name = "w", nn.role = #nn.role<grad>}, tensor<4xf32> {nn.name = "b", nn.role = #nn.role<grad>})
// CHECK: %[[Y:.*]] = nn.gemm %[[X:.*]], %[[W:.*]], %{{.*}} {pipe.phase = #pipe.phase<fwd>, pipe.stage = 0 : i64, transB = true}
// CHECK: %[[LOSS:.*]], %{{.*}} = nn.softmax_cross_entropy_loss %[[Y]]{{.*}}pipe.phase = #pipe.phase<fwd>, pipe.stage = 1 : i64
// CHECK: %[[SEED:.*]] = nn.constant {pipe.phase = #pipe.phase<bwd_input>, pipe.stage = 1 : i64} dense<1.000000e+00> : tensor<f32>
// CHECK: %[[DY:.*]] = nn.softmax_cross_entropy_loss_grad %[[SEED]], %[[Y]], %{{.*}} {pipe.phase = #pipe.phase<bwd_input>, pipe.stage = 1 : i64}
// CHECK-NOT: pipe.phase = #pipe.phase<bwd_input>, pipe.stage = 0
// CHECK: %[[DW:.*]] = nn.gemm %[[DY]], %[[X]] {pipe.phase = #pipe.phase<bwd_weight>, pipe.stage = 0 : i64, transA = true} : (tensor<2x4xf32>, tensor<2x3xf32>) -> tensor<4x3xf32>
// CHECK: %[[DB:.*]] = nn.reduce_sum %[[DY]] {axes = array<i64: 0>, pipe.phase = #pipe.phase<bwd_weight>, pipe.stage = 0 : i64}
// CHECK: %[[DBR:.*]] = nn.reshape %[[DB]]
// CHECK: return %[[LOSS]], %[[DW]], %[[DBR]]
// ROUNDTRIP: func.func @train_step
func.func @forward(%w: tensor<4x3xf32> {nn.name = "w", nn.role = #nn.role<param>}, %b: tensor<4xf32> {nn.name = "b", nn.role = #nn.role<param>},
                   %x: tensor<2x3xf32> {nn.name = "x", nn.role = #nn.role<input>}, %t: tensor<2xi64> {nn.name = "t", nn.role = #nn.role<label>}) -> tensor<f32> {
  %0 = nn.gemm %x, %w, %b {transB = true, pipe.stage = 0 : i64} : (tensor<2x3xf32>, tensor<4x3xf32>, tensor<4xf32>) -> tensor<2x4xf32>
  %1:2 = nn.softmax_cross_entropy_loss %0, %t {pipe.stage = 1 : i64} : (tensor<2x4xf32>, tensor<2xi64>) -> (tensor<f32>, tensor<2x4xf32>)
  return %1#0 : tensor<f32>
}

// -----

// A tied weight (embedding and output head) gets the sum of both uses; the
// transposed weight's gradient stays W work.
// CHECK-LABEL: func.func @train_step
// CHECK-DAG: %[[HEAD:.*]] = nn.transpose %{{.*}} {{.*}}pipe.phase = #pipe.phase<bwd_weight>
// CHECK-DAG: %[[EMB:.*]] = nn.gather_grad %{{.*}} {pipe.phase = #pipe.phase<bwd_weight>} : (tensor<2x3x4xf32>, tensor<2x3xi64>) -> tensor<10x4xf32>
// CHECK: %[[SUM:.*]] = nn.add %{{.*}}, %{{.*}} {pipe.phase = #pipe.phase<bwd_weight>} : (tensor<10x4xf32>, tensor<10x4xf32>) -> tensor<10x4xf32>
// CHECK: return %{{.*}}, %[[SUM]] : tensor<f32>, tensor<10x4xf32>
func.func @forward(%e: tensor<10x4xf32> {nn.name = "e", nn.role = #nn.role<param>}, %tok: tensor<2x3xi64> {nn.name = "tok", nn.role = #nn.role<input>},
                   %t: tensor<6xi64> {nn.name = "t", nn.role = #nn.role<label>}) -> tensor<f32> {
  %0 = nn.gather %e, %tok : (tensor<10x4xf32>, tensor<2x3xi64>) -> tensor<2x3x4xf32>
  %1 = nn.transpose %e {perm = array<i64: 1, 0>} : (tensor<10x4xf32>) -> tensor<4x10xf32>
  %2 = nn.matmul %0, %1 : (tensor<2x3x4xf32>, tensor<4x10xf32>) -> tensor<2x3x10xf32>
  %3 = nn.reshape %2 : tensor<2x3x10xf32> -> tensor<6x10xf32>
  %4:2 = nn.softmax_cross_entropy_loss %3, %t : (tensor<6x10xf32>, tensor<6xi64>) -> (tensor<f32>, tensor<6x10xf32>)
  return %4#0 : tensor<f32>
}

// -----

// BatchNormalization in training mode: its updated statistics are results.
// The scale's and the bias's gradients come from one nn.batch_norm_param_grad
// (its rule builds one per parameter; the twins merge).
// CHECK-LABEL: func.func @train_step
// CHECK-SAME: tensor<3xf32> {nn.name = "mean", nn.role = #nn.role<buffer_update>}, tensor<3xf32> {nn.name = "var", nn.role = #nn.role<buffer_update>})
// CHECK: nn.batch_norm_grad {{.*}}pipe.phase = #pipe.phase<bwd_input>
// CHECK: %[[DS:[a-z_0-9]+]], %[[DB:[a-z_0-9]+]] = nn.batch_norm_param_grad {{.*}}pipe.phase = #pipe.phase<bwd_weight>
// CHECK-NOT: nn.batch_norm_param_grad
// CHECK: return %{{.*}}, %[[DS]], %[[DB]], 
func.func @forward(%s: tensor<3xf32> {nn.name = "s", nn.role = #nn.role<param>}, %b: tensor<3xf32> {nn.name = "b", nn.role = #nn.role<param>},
                   %m: tensor<3xf32> {nn.name = "mean", nn.role = #nn.role<buffer>}, %v: tensor<3xf32> {nn.name = "var", nn.role = #nn.role<buffer>},
                   %w: tensor<3x3x1x1xf32> {nn.name = "w", nn.role = #nn.role<param>},
                   %x: tensor<2x3x4x4xf32> {nn.name = "x", nn.role = #nn.role<input>}) -> tensor<f32> {
  %c = nn.conv %x, %w {strides = array<i64: 1, 1>, pads = array<i64: 0, 0, 0, 0>, dilations = array<i64: 1, 1>} : (tensor<2x3x4x4xf32>, tensor<3x3x1x1xf32>) -> tensor<2x3x4x4xf32>
  %0:3 = nn.batch_norm %c, %s, %b, %m, %v {training = true} : (tensor<2x3x4x4xf32>, tensor<3xf32>, tensor<3xf32>, tensor<3xf32>, tensor<3xf32>) -> (tensor<2x3x4x4xf32>, tensor<3xf32>, tensor<3xf32>)
  %1 = nn.reduce_mean %0#0 {axes = array<i64: 0, 1, 2, 3>, keepdims = false} : (tensor<2x3x4x4xf32>) -> tensor<f32>
  return %1 : tensor<f32>
}

// -----

// nn.masked_softmax (pipec-recognize-composites): one gradient op, reading
// the result and the mask; the mask gets none.
// CHECK-LABEL: func.func @train_step
// CHECK: %[[Y:.*]] = nn.masked_softmax %{{.*}}, %[[M:[^ ]*]] {fill = 0xFF800000 : f32, pipe.phase = #pipe.phase<fwd>, scale = 1.250000e-01 : f32}
// CHECK: nn.masked_softmax_grad %{{.*}}, %[[Y]], %[[M]] {pipe.phase = #pipe.phase<bwd_input>, scale = 1.250000e-01 : f32} : (tensor<2x4x4xf32>, tensor<2x4x4xf32>, tensor<1x4x4xi1>) -> tensor<2x4x4xf32>
func.func @forward(%w: tensor<4x4xf32> {nn.name = "w", nn.role = #nn.role<param>}, %x: tensor<2x4x4xf32> {nn.name = "x", nn.role = #nn.role<input>},
                   %mask: tensor<1x4x4xi1> {nn.name = "mask", nn.role = #nn.role<input>}) -> tensor<f32> {
  %0 = nn.matmul %x, %w : (tensor<2x4x4xf32>, tensor<4x4xf32>) -> tensor<2x4x4xf32>
  %1 = nn.masked_softmax %0, %mask {scale = 0.125 : f32, fill = 0xFF800000 : f32} : (tensor<2x4x4xf32>, tensor<1x4x4xi1>) -> tensor<2x4x4xf32>
  %2 = nn.reduce_mean %1 {axes = array<i64: 0, 1, 2>, keepdims = false} : (tensor<2x4x4xf32>) -> tensor<f32>
  return %2 : tensor<f32>
}

// -----

// A cut at an antichain: %r (stage 0) is read by stage-1 matmuls before and
// after a stage-0 matmul in the forward order (query, key and value
// projections split between stages). Its contributions are summed per stage
// (the two of stage 1 on stage 1), then the stage-1 sum is added to stage
// 0's on stage 0: one gradient crosses the boundary, towards the earlier
// stage (the outliner refused a sum on stage 1 that read stage 0's part, and
// the emitter a boundary crossed by more gradients than activations).
// CHECK-LABEL: func.func @train_step
// CHECK: %[[D2:.*]] = nn.matmul {{.*}}pipe.phase = #pipe.phase<bwd_input>, pipe.stage = 1 : i64
// CHECK: %[[D0:.*]] = nn.matmul {{.*}}pipe.phase = #pipe.phase<bwd_input>, pipe.stage = 0 : i64
// CHECK: %[[D1:.*]] = nn.matmul {{.*}}pipe.phase = #pipe.phase<bwd_input>, pipe.stage = 1 : i64
// CHECK: %[[S1:.*]] = nn.add %[[D2]], %[[D1]] {pipe.phase = #pipe.phase<bwd_input>, pipe.stage = 1 : i64}
// CHECK: nn.add %[[S1]], %[[D0]] {pipe.phase = #pipe.phase<bwd_input>, pipe.stage = 0 : i64}
func.func @forward(%w0: tensor<4x4xf32> {nn.name = "w0", nn.role = #nn.role<param>}, %w1: tensor<4x4xf32> {nn.name = "w1", nn.role = #nn.role<param>},
                   %w2: tensor<4x4xf32> {nn.name = "w2", nn.role = #nn.role<param>}, %w3: tensor<4x4xf32> {nn.name = "w3", nn.role = #nn.role<param>},
                   %x: tensor<2x4xf32> {nn.name = "x", nn.role = #nn.role<input>}, %t: tensor<2xi64> {nn.name = "t", nn.role = #nn.role<label>}) -> tensor<f32> {
  %h = nn.matmul %x, %w0 {pipe.stage = 0 : i64} : (tensor<2x4xf32>, tensor<4x4xf32>) -> tensor<2x4xf32>
  %r = nn.relu %h {pipe.stage = 0 : i64} : tensor<2x4xf32>
  %late = nn.matmul %r, %w1 {pipe.stage = 1 : i64} : (tensor<2x4xf32>, tensor<4x4xf32>) -> tensor<2x4xf32>
  %early = nn.matmul %r, %w2 {pipe.stage = 0 : i64} : (tensor<2x4xf32>, tensor<4x4xf32>) -> tensor<2x4xf32>
  %later = nn.matmul %r, %w3 {pipe.stage = 1 : i64} : (tensor<2x4xf32>, tensor<4x4xf32>) -> tensor<2x4xf32>
  %sum = nn.add %late, %early {pipe.stage = 1 : i64} : (tensor<2x4xf32>, tensor<2x4xf32>) -> tensor<2x4xf32>
  %all = nn.add %sum, %later {pipe.stage = 1 : i64} : (tensor<2x4xf32>, tensor<2x4xf32>) -> tensor<2x4xf32>
  %l:2 = nn.softmax_cross_entropy_loss %all, %t {pipe.stage = 1 : i64} : (tensor<2x4xf32>, tensor<2xi64>) -> (tensor<f32>, tensor<2x4xf32>)
  return %l#0 : tensor<f32>
}
