// RUN: pipec-opt %s -split-input-file --pipec-append-loss | FileCheck %s
// RUN: not pipec-opt %s -split-input-file --pipec-append-loss="loss=mse" | FileCheck %s --check-prefix=MSE
// RUN: not pipec-opt %s -split-input-file --pipec-append-loss="loss=mse" 2>&1 | FileCheck %s --check-prefix=SCALAR-MSE
// RUN: not pipec-opt %s -split-input-file --pipec-append-loss="loss=hinge" 2>&1 | FileCheck %s --check-prefix=UNKNOWN

// Logits of shape [B, T, V] are flattened to [B·T, V]; the labels [B, T]
// become an argument.
// CHECK-LABEL: func.func @forward
// CHECK-SAME: %[[LABELS:arg[0-9]+]]: tensor<2x4xi64> {nn.name = "labels", nn.role = #nn.role<label>}) -> (tensor<f32> {nn.name = "loss", nn.role = #nn.role<loss>})
// CHECK: %[[SCORES:.*]] = nn.reshape %{{.*}} : tensor<2x4x10xf32> -> tensor<8x10xf32>
// CHECK: %[[FLAT:.*]] = nn.reshape %[[LABELS]] : tensor<2x4xi64> -> tensor<8xi64>
// CHECK: %[[LOSS:.*]], %{{.*}} = nn.softmax_cross_entropy_loss %[[SCORES]], %[[FLAT]]
// CHECK: return %[[LOSS]] : tensor<f32>
// MSE-LABEL: func.func @forward
// MSE-SAME: %[[LABELS:arg[0-9]+]]: tensor<2x4x10xf32> {nn.name = "labels", nn.role = #nn.role<label>})
// MSE: %[[D:.*]] = nn.sub %{{.*}}, %[[LABELS]]
// MSE: %[[S:.*]] = nn.mul %[[D]], %[[D]]
// MSE: nn.reduce_mean %[[S]] {axes = array<i64: 0, 1, 2>, keepdims = false} : (tensor<2x4x10xf32>) -> tensor<f32>
// UNKNOWN: error: pipec-append-loss: loss=hinge: expected auto, softmax-cross-entropy or mse
func.func @forward(%x: tensor<2x4x10xf32> {nn.name = "x", nn.role = #nn.role<input>}) -> tensor<2x4x10xf32> {
  %0 = nn.relu %x : tensor<2x4x10xf32>
  return %0 : tensor<2x4x10xf32>
}

// -----

// A model that computes its own loss keeps it; its labels get the role.
// CHECK-LABEL: func.func @forward
// CHECK-SAME: %{{.*}}: tensor<8xi64> {nn.name = "y", nn.role = #nn.role<label>}
// CHECK-NOT: nn.reshape
// CHECK: return %{{.*}} : tensor<f32>
func.func @forward(%x: tensor<8x10xf32> {nn.name = "x", nn.role = #nn.role<input>}, %y: tensor<8xi64> {nn.name = "y", nn.role = #nn.role<input>}) -> tensor<f32> {
  %0:2 = nn.softmax_cross_entropy_loss %x, %y : (tensor<8x10xf32>, tensor<8xi64>) -> (tensor<f32>, tensor<8x10xf32>)
  return %0#0 : tensor<f32>
}

// -----

// A scalar first output is the model's own loss (here a mean squared error
// against an input): under the default (auto) it is kept as it is, no labels
// added; an explicit --loss asks for logits, which this model has not.
// CHECK-LABEL: func.func @forward
// CHECK-SAME: (%{{.*}}: tensor<4x3xf32> {nn.name = "x", nn.role = #nn.role<input>}, %[[T:.*]]: tensor<4x3xf32> {nn.name = "target", nn.role = #nn.role<input>}) -> (tensor<f32> {nn.name = "loss", nn.role = #nn.role<loss>})
// CHECK: %[[LOSS:.*]] = nn.reduce_mean
// CHECK-NEXT: return %[[LOSS]] : tensor<f32>
// SCALAR-MSE: error: the first result of @forward is a scalar, the model's own loss; --loss mse needs logits (leave --loss out, or give --loss auto, to train on it)
func.func @forward(%x: tensor<4x3xf32> {nn.name = "x", nn.role = #nn.role<input>}, %t: tensor<4x3xf32> {nn.name = "target", nn.role = #nn.role<input>}) -> tensor<f32> {
  %d = nn.sub %x, %t : (tensor<4x3xf32>, tensor<4x3xf32>) -> tensor<4x3xf32>
  %s = nn.mul %d, %d : (tensor<4x3xf32>, tensor<4x3xf32>) -> tensor<4x3xf32>
  %m = nn.reduce_mean %s {axes = array<i64: 0, 1>, keepdims = false} : (tensor<4x3xf32>) -> tensor<f32>
  return %m : tensor<f32>
}
