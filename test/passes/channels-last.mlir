// RUN: pipec-opt %s --pipec-channels-last --split-input-file | FileCheck %s

// A ResNet stem: the input and the weight are transposed in, the conv, the
// norm, the ReLU, the residual add and the pools run channels-last, and the
// global pool's [N, 1, 1, C] goes back by a reshape (only size-1 axes move).
// A returned region tensor is converted back once, next to its producer.
// CHECK-LABEL: func.func @stem
// CHECK: %[[X:.*]] = nn.transpose %arg0 {perm = array<i64: 0, 2, 3, 1>} : (tensor<2x3x8x8xf32>) -> tensor<2x8x8x3xf32>
// CHECK: %[[W:.*]] = nn.transpose %arg1 {perm = array<i64: 0, 2, 3, 1>} : (tensor<4x3x3x3xf32>) -> tensor<4x3x3x3xf32>
// CHECK: %[[Y:.*]] = nn.conv %[[X]], %[[W]] {channels_last = true, {{.*}}} : (tensor<2x8x8x3xf32>, tensor<4x3x3x3xf32>) -> tensor<2x8x8x4xf32>
// CHECK: %[[N:.*]], %{{.*}}, %{{.*}} = nn.batch_norm %[[Y]], {{.*}} {channels_last = true, training = true} : (tensor<2x8x8x4xf32>, {{.*}}) -> (tensor<2x8x8x4xf32>, tensor<4xf32>, tensor<4xf32>)
// CHECK: %[[R:.*]] = nn.relu %[[N]] : tensor<2x8x8x4xf32>
// CHECK: %[[RB:.*]] = nn.transpose %[[R]] {perm = array<i64: 0, 3, 1, 2>} : (tensor<2x8x8x4xf32>) -> tensor<2x4x8x8xf32>
// CHECK: %[[A:.*]] = nn.add %[[R]], %[[Y]] : (tensor<2x8x8x4xf32>, tensor<2x8x8x4xf32>) -> tensor<2x8x8x4xf32>
// CHECK: %[[P:.*]] = nn.max_pool %[[A]] {channels_last = true, {{.*}}} : (tensor<2x8x8x4xf32>) -> tensor<2x4x4x4xf32>
// CHECK: %[[G:.*]] = nn.global_average_pool %[[P]] {channels_last = true} : (tensor<2x4x4x4xf32>) -> tensor<2x1x1x4xf32>
// CHECK: %[[GB:.*]] = nn.reshape %[[G]] : tensor<2x1x1x4xf32> -> tensor<2x4x1x1xf32>
// CHECK: %[[F:.*]] = nn.flatten %[[GB]]
// CHECK-NOT: nn.transpose
// CHECK: return %[[F]], %[[RB]]
func.func @stem(%x: tensor<2x3x8x8xf32>, %w: tensor<4x3x3x3xf32>, %s: tensor<4xf32>, %b: tensor<4xf32>, %m: tensor<4xf32>, %v: tensor<4xf32>) -> (tensor<2x4xf32>, tensor<2x4x8x8xf32>) {
  %y = nn.conv %x, %w {strides = array<i64: 1, 1>, pads = array<i64: 1, 1, 1, 1>, dilations = array<i64: 1, 1>} : (tensor<2x3x8x8xf32>, tensor<4x3x3x3xf32>) -> tensor<2x4x8x8xf32>
  %n, %nm, %nv = nn.batch_norm %y, %s, %b, %m, %v {training = true} : (tensor<2x4x8x8xf32>, tensor<4xf32>, tensor<4xf32>, tensor<4xf32>, tensor<4xf32>) -> (tensor<2x4x8x8xf32>, tensor<4xf32>, tensor<4xf32>)
  %r = nn.relu %n : tensor<2x4x8x8xf32>
  %a = nn.add %r, %y : (tensor<2x4x8x8xf32>, tensor<2x4x8x8xf32>) -> tensor<2x4x8x8xf32>
  %p = nn.max_pool %a {kernel_shape = array<i64: 2, 2>, strides = array<i64: 2, 2>, pads = array<i64: 0, 0, 0, 0>, dilations = array<i64: 1, 1>} : (tensor<2x4x8x8xf32>) -> tensor<2x4x4x4xf32>
  %g = nn.global_average_pool %p : (tensor<2x4x4x4xf32>) -> tensor<2x4x1x1xf32>
  %f = nn.flatten %g : (tensor<2x4x1x1xf32>) -> tensor<2x4xf32>
  return %f, %r : tensor<2x4xf32>, tensor<2x4x8x8xf32>
}

// -----

// Concat along the channels (DenseNet, Inception) becomes a concat of the
// last axis; a pad's and a slice's per-axis attributes are reordered; a
// depthwise convolution's weight [C, 1, k, k] becomes [C, k, k, 1].
// CHECK-LABEL: func.func @axes
// CHECK: nn.conv {{.*}} {channels_last = true, {{.*}}group = 4 : i64{{.*}}} : (tensor<1x6x6x4xf32>, tensor<4x3x3x1xf32>) -> tensor<1x6x6x4xf32>
// CHECK: %[[C:.*]] = nn.concat {{.*}} {axis = 3 : i64} : (tensor<1x6x6x4xf32>, tensor<1x6x6x4xf32>) -> tensor<1x6x6x8xf32>
// CHECK: nn.pad %[[C]] {pads = array<i64: 0, 1, 2, 0, 0, 3, 4, 0>} : (tensor<1x6x6x8xf32>) -> tensor<1x10x12x8xf32>
// CHECK: nn.slice {{.*}} {ends = array<i64: 1, 10, 12, 4>, starts = array<i64: 0, 0, 0, 0>, steps = array<i64: 1, 1, 1, 1>} : (tensor<1x10x12x8xf32>) -> tensor<1x10x12x4xf32>
// CHECK: nn.transpose {{.*}} {perm = array<i64: 0, 3, 1, 2>} : (tensor<1x10x12x4xf32>) -> tensor<1x4x10x12xf32>
func.func @axes(%x: tensor<1x4x6x6xf32>, %w: tensor<4x1x3x3xf32>) -> tensor<1x4x10x12xf32> {
  %y = nn.conv %x, %w {strides = array<i64: 1, 1>, pads = array<i64: 1, 1, 1, 1>, dilations = array<i64: 1, 1>, group = 4 : i64} : (tensor<1x4x6x6xf32>, tensor<4x1x3x3xf32>) -> tensor<1x4x6x6xf32>
  %c = nn.concat %y, %y {axis = 1 : i64} : (tensor<1x4x6x6xf32>, tensor<1x4x6x6xf32>) -> tensor<1x8x6x6xf32>
  %p = nn.pad %c {pads = array<i64: 0, 0, 1, 2, 0, 0, 3, 4>} : (tensor<1x8x6x6xf32>) -> tensor<1x8x10x12xf32>
  %s = nn.slice %p {starts = array<i64: 0, 0, 0, 0>, ends = array<i64: 1, 4, 10, 12>, steps = array<i64: 1, 1, 1, 1>} : (tensor<1x8x10x12xf32>) -> tensor<1x4x10x12xf32>
  return %s : tensor<1x4x10x12xf32>
}

// -----

// A bias broadcast over the channels ([3, 1] against [2, 3, 5]) joins the
// region: given the result's rank, then moved (both reshapes: only size-1
// axes move). A dropout, whose mask is drawn per element index, reads the
// region's tensor channels-first. A 1-D convolution's region is [N, L, C];
// its weight [3, 4, 1] moves only an axis of size 1.
// CHECK-LABEL: func.func @edges
// CHECK: nn.reshape %arg1 : tensor<3x4x1xf32> -> tensor<3x1x4xf32>
// CHECK: %[[Y:.*]] = nn.conv {{.*}} -> tensor<2x5x3xf32>
// CHECK: %[[YB:.*]] = nn.transpose %[[Y]] {perm = array<i64: 0, 2, 1>} : (tensor<2x5x3xf32>) -> tensor<2x3x5xf32>
// CHECK: %[[B1:.*]] = nn.reshape %arg2 : tensor<3x1xf32> -> tensor<1x3x1xf32>
// CHECK: %[[B2:.*]] = nn.reshape %[[B1]] : tensor<1x3x1xf32> -> tensor<1x1x3xf32>
// CHECK: %[[A:.*]] = nn.add %[[Y]], %[[B2]] : (tensor<2x5x3xf32>, tensor<1x1x3xf32>) -> tensor<2x5x3xf32>
// CHECK: nn.transpose %[[A]] {perm = array<i64: 0, 2, 1>}
// CHECK: nn.dropout %[[YB]]
func.func @edges(%x: tensor<2x4x5xf32>, %w: tensor<3x4x1xf32>, %bias: tensor<3x1xf32>) -> (tensor<2x3x5xf32>, tensor<2x3x5xf32>) {
  %y = nn.conv %x, %w {strides = array<i64: 1>, pads = array<i64: 0, 0>, dilations = array<i64: 1>} : (tensor<2x4x5xf32>, tensor<3x4x1xf32>) -> tensor<2x3x5xf32>
  %a = nn.add %y, %bias : (tensor<2x3x5xf32>, tensor<3x1xf32>) -> tensor<2x3x5xf32>
  %d, %mask = nn.dropout %y {ratio = 0.1 : f32, training = true} : (tensor<2x3x5xf32>) -> (tensor<2x3x5xf32>, tensor<2x3x5xi1>)
  return %a, %d : tensor<2x3x5xf32>, tensor<2x3x5xf32>
}

// -----

// A squeeze-excitation block (EfficientNet, MobileNet-V3): the pooled
// [N, C, 1, 1] scale multiplies the region's tensor in the region, and a
// model's own permute of a region tensor (ConvNeXt's to [N, H, W, C]) is
// the stored tensor itself: no transpose is left.
// CHECK-LABEL: func.func @squeeze_excitation
// CHECK: %[[Y:.*]] = nn.conv {{.*}} -> tensor<1x4x4x8xf32>
// CHECK: %[[G:.*]] = nn.global_average_pool %[[Y]] {channels_last = true}
// CHECK: %[[S:.*]] = nn.sigmoid %[[G]] : tensor<1x1x1x8xf32>
// CHECK: %[[M:.*]] = nn.mul %[[Y]], %[[S]] : (tensor<1x4x4x8xf32>, tensor<1x1x1x8xf32>) -> tensor<1x4x4x8xf32>
// CHECK-NOT: nn.transpose
// CHECK: return %[[M]]
func.func @squeeze_excitation(%x: tensor<1x8x4x4xf32>, %w: tensor<8x1x3x3xf32>) -> tensor<1x4x4x8xf32> {
  %y = nn.conv %x, %w {strides = array<i64: 1, 1>, pads = array<i64: 1, 1, 1, 1>, dilations = array<i64: 1, 1>, group = 8 : i64} : (tensor<1x8x4x4xf32>, tensor<8x1x3x3xf32>) -> tensor<1x8x4x4xf32>
  %g = nn.global_average_pool %y : (tensor<1x8x4x4xf32>) -> tensor<1x8x1x1xf32>
  %s = nn.sigmoid %g : tensor<1x8x1x1xf32>
  %m = nn.mul %y, %s : (tensor<1x8x4x4xf32>, tensor<1x8x1x1xf32>) -> tensor<1x8x4x4xf32>
  %p = nn.transpose %m {perm = array<i64: 0, 2, 3, 1>} : (tensor<1x8x4x4xf32>) -> tensor<1x4x4x8xf32>
  return %p : tensor<1x4x4x8xf32>
}

// -----

// ShuffleNet's channel shuffle (reshape to [N, groups, C/groups, H, W], swap
// of axes 1 and 2, reshape back) moves along the stored channel axis: the
// conv's result stays channels-last into the next conv; a shuffle whose
// swap is not of those two axes is left at the region's edge.
// CHECK-LABEL: func.func @shuffle
// CHECK: %[[Y:.*]] = nn.conv {{.*}} -> tensor<2x3x3x8xf32>
// CHECK-NEXT: %[[BY:.*]] = nn.transpose %[[Y]] {perm = array<i64: 0, 3, 1, 2>}
// CHECK-NEXT: %[[V:.*]] = nn.reshape %[[Y]] : tensor<2x3x3x8xf32> -> tensor<2x3x3x2x4xf32>
// CHECK-NEXT: %[[T:.*]] = nn.transpose %[[V]] {perm = array<i64: 0, 1, 2, 4, 3>} : (tensor<2x3x3x2x4xf32>) -> tensor<2x3x3x4x2xf32>
// CHECK-NEXT: %[[M:.*]] = nn.reshape %[[T]] : tensor<2x3x3x4x2xf32> -> tensor<2x3x3x8xf32>
// CHECK-NEXT: %[[Z:.*]] = nn.conv %[[M]], {{.*}} -> tensor<2x3x3x8xf32>
// CHECK-NEXT: %[[B:.*]] = nn.transpose %[[Z]] {perm = array<i64: 0, 3, 1, 2>}
// CHECK-NEXT: nn.reshape %[[BY]] : tensor<2x8x3x3xf32> -> tensor<2x2x4x3x3xf32>
// CHECK-NEXT: nn.transpose {{.*}} {perm = array<i64: 0, 1, 2, 4, 3>}
// CHECK-NEXT: %[[K:.*]] = nn.reshape
// CHECK-NEXT: return %[[B]], %[[K]]
func.func @shuffle(%x: tensor<2x8x3x3xf32>, %w: tensor<8x1x1x1xf32>) -> (tensor<2x8x3x3xf32>, tensor<2x8x3x3xf32>) {
  %y = nn.conv %x, %w {strides = array<i64: 1, 1>, pads = array<i64: 0, 0, 0, 0>, dilations = array<i64: 1, 1>, group = 8 : i64} : (tensor<2x8x3x3xf32>, tensor<8x1x1x1xf32>) -> tensor<2x8x3x3xf32>
  %v = nn.reshape %y : tensor<2x8x3x3xf32> -> tensor<2x2x4x3x3xf32>
  %t = nn.transpose %v {perm = array<i64: 0, 2, 1, 3, 4>} : (tensor<2x2x4x3x3xf32>) -> tensor<2x4x2x3x3xf32>
  %m = nn.reshape %t : tensor<2x4x2x3x3xf32> -> tensor<2x8x3x3xf32>
  %z = nn.conv %m, %w {strides = array<i64: 1, 1>, pads = array<i64: 0, 0, 0, 0>, dilations = array<i64: 1, 1>, group = 8 : i64} : (tensor<2x8x3x3xf32>, tensor<8x1x1x1xf32>) -> tensor<2x8x3x3xf32>
  %v2 = nn.reshape %y : tensor<2x8x3x3xf32> -> tensor<2x2x4x3x3xf32>
  %t2 = nn.transpose %v2 {perm = array<i64: 0, 1, 2, 4, 3>} : (tensor<2x2x4x3x3xf32>) -> tensor<2x2x4x3x3xf32>
  %m2 = nn.reshape %t2 : tensor<2x2x4x3x3xf32> -> tensor<2x8x3x3xf32>
  return %z, %m2 : tensor<2x8x3x3xf32>, tensor<2x8x3x3xf32>
}
