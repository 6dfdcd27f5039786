// RUN: pipec-opt %s --pipec-fuse-norm-epilogue | FileCheck %s
// RUN: pipec-opt %s --pipec-fuse-norm-epilogue --mlir-print-op-generic | pipec-opt | FileCheck %s --check-prefix=ROUNDTRIP

// The IR the pass writes verifies and prints back.
// ROUNDTRIP: pipe.stage @stage_0

pipe.stage @stage_0 attributes {id = 0 : i64, replicas = 1 : i64} {
  // A ResNet block: conv-norm-ReLU, then conv-norm plus the projected
  // shortcut's norm, ReLU. The first ReLU becomes its norm's activation;
  // the add's second norm (the shortcut's, computed after the main branch's)
  // takes the first as its residual and applies the ReLU after it. The
  // running statistics still come out.
  // CHECK-LABEL: func.func @fwd
  // CHECK: %[[A:.*]], %{{.*}}, %{{.*}} = nn.batch_norm %arg0, %arg1, %arg2, %arg3, %arg4 {activation = #nn.unary<relu>, training = true}
  // CHECK-NEXT: %[[B:.*]], %[[M:.*]], %[[V:.*]] = nn.batch_norm %[[A]], %arg1, %arg2, %arg3, %arg4 {training = true}
  // CHECK-NEXT: %[[Y:.*]], %{{.*}}, %{{.*}} = nn.batch_norm %arg0, %arg1, %arg2, %arg3, %arg4, %[[B]] {activation = #nn.unary<relu>, training = true}
  // CHECK-NEXT: return %[[Y]], %[[M]], %[[V]]
  func.func @fwd(%x: tensor<2x4x3x3xf32>, %s: tensor<4xf32>, %b: tensor<4xf32>, %m: tensor<4xf32>, %v: tensor<4xf32>)
      -> (tensor<2x4x3x3xf32>, tensor<4xf32>, tensor<4xf32>) {
    %n1:3 = nn.batch_norm %x, %s, %b, %m, %v {training = true} : (tensor<2x4x3x3xf32>, tensor<4xf32>, tensor<4xf32>, tensor<4xf32>, tensor<4xf32>) -> (tensor<2x4x3x3xf32>, tensor<4xf32>, tensor<4xf32>)
    %r1 = nn.relu %n1#0 : tensor<2x4x3x3xf32>
    %n2:3 = nn.batch_norm %r1, %s, %b, %m, %v {training = true} : (tensor<2x4x3x3xf32>, tensor<4xf32>, tensor<4xf32>, tensor<4xf32>, tensor<4xf32>) -> (tensor<2x4x3x3xf32>, tensor<4xf32>, tensor<4xf32>)
    %n3:3 = nn.batch_norm %x, %s, %b, %m, %v {training = true} : (tensor<2x4x3x3xf32>, tensor<4xf32>, tensor<4xf32>, tensor<4xf32>, tensor<4xf32>) -> (tensor<2x4x3x3xf32>, tensor<4xf32>, tensor<4xf32>)
    %sum = nn.add %n2#0, %n3#0 : (tensor<2x4x3x3xf32>, tensor<2x4x3x3xf32>) -> tensor<2x4x3x3xf32>
    %y = nn.relu %sum : tensor<2x4x3x3xf32>
    return %y, %n2#1, %n2#2 : tensor<2x4x3x3xf32>, tensor<4xf32>, tensor<4xf32>
  }

  // A residual computed after the norm: the norm moves to the add (its
  // running statistics are read after it), without an activation.
  // CHECK-LABEL: func.func @moved
  // CHECK: %[[Z:.*]] = nn.neg %arg0
  // CHECK-NEXT: %[[Y:.*]], %[[M:.*]], %{{.*}} = nn.batch_norm %arg0, %arg1, %arg2, %arg3, %arg4, %[[Z]] {training = true}
  // CHECK-NEXT: return %[[Y]], %[[M]]
  func.func @moved(%x: tensor<2x4x3x3xf32>, %s: tensor<4xf32>, %b: tensor<4xf32>, %m: tensor<4xf32>, %v: tensor<4xf32>)
      -> (tensor<2x4x3x3xf32>, tensor<4xf32>) {
    %n:3 = nn.batch_norm %x, %s, %b, %m, %v {training = true} : (tensor<2x4x3x3xf32>, tensor<4xf32>, tensor<4xf32>, tensor<4xf32>, tensor<4xf32>) -> (tensor<2x4x3x3xf32>, tensor<4xf32>, tensor<4xf32>)
    %z = nn.neg %x : tensor<2x4x3x3xf32>
    %sum = nn.add %n#0, %z : (tensor<2x4x3x3xf32>, tensor<2x4x3x3xf32>) -> tensor<2x4x3x3xf32>
    return %sum, %n#1 : tensor<2x4x3x3xf32>, tensor<4xf32>
  }

  // Backward: ReLU's gradient read by one norm gradient and returned (saved
  // for the norm's parameter gradient) becomes part of the norm's gradient,
  // which returns the masked gradient; one read by nothing else leaves no
  // masked result; one also read by a residual branch's add stays.
  // CHECK-LABEL: func.func @bwd_input
  // CHECK: %[[DX:.*]], %[[G:.*]] = nn.batch_norm_grad %arg0, %arg2, %arg3, %arg4, %arg5, %arg1 {activation = #nn.unary<relu>, keeps_masked_dy = true, training = true}
  // CHECK-NEXT: %[[DX2:.*]] = nn.batch_norm_grad %arg0, %arg2, %arg3, %arg4, %arg5, %arg1 {activation = #nn.unary<relu>, training = true}
  // CHECK-NEXT: %[[G3:.*]] = nn.unary_grad <relu> %arg0, y = %arg1
  // CHECK-NEXT: nn.batch_norm_grad %[[G3]], %arg2, %arg3, %arg4, %arg5 {training = true}
  // CHECK-NEXT: nn.add %[[G3]], %arg0
  // CHECK-NOT: nn.unary_grad
  // CHECK: return %[[DX]], %[[G]], %[[DX2]]
  func.func @bwd_input(%dy: tensor<2x4x3x3xf32>, %y: tensor<2x4x3x3xf32>, %x: tensor<2x4x3x3xf32>,
                       %s: tensor<4xf32>, %m: tensor<4xf32>, %v: tensor<4xf32>)
      -> (tensor<2x4x3x3xf32>, tensor<2x4x3x3xf32> {pipe.saved = "g"}, tensor<2x4x3x3xf32>, tensor<2x4x3x3xf32>,
          tensor<2x4x3x3xf32>) {
    %g = nn.unary_grad <relu> %dy, y = %y : tensor<2x4x3x3xf32>
    %dx = nn.batch_norm_grad %g, %x, %s, %m, %v {training = true} : (tensor<2x4x3x3xf32>, tensor<2x4x3x3xf32>, tensor<4xf32>, tensor<4xf32>, tensor<4xf32>) -> tensor<2x4x3x3xf32>
    %g2 = nn.unary_grad <relu> %dy, y = %y : tensor<2x4x3x3xf32>
    %dx2 = nn.batch_norm_grad %g2, %x, %s, %m, %v {training = true} : (tensor<2x4x3x3xf32>, tensor<2x4x3x3xf32>, tensor<4xf32>, tensor<4xf32>, tensor<4xf32>) -> tensor<2x4x3x3xf32>
    %g3 = nn.unary_grad <relu> %dy, y = %y : tensor<2x4x3x3xf32>
    %dx3 = nn.batch_norm_grad %g3, %x, %s, %m, %v {training = true} : (tensor<2x4x3x3xf32>, tensor<2x4x3x3xf32>, tensor<4xf32>, tensor<4xf32>, tensor<4xf32>) -> tensor<2x4x3x3xf32>
    %branch = nn.add %g3, %dy : (tensor<2x4x3x3xf32>, tensor<2x4x3x3xf32>) -> tensor<2x4x3x3xf32>
    return %dx, %g, %dx2, %dx3, %branch
        : tensor<2x4x3x3xf32>, tensor<2x4x3x3xf32>, tensor<2x4x3x3xf32>, tensor<2x4x3x3xf32>, tensor<2x4x3x3xf32>
  }

  // ReLU6 (the importer's nn.relu6 for Clip(0, 6), MobileNet-V2's): the
  // norm's activation, with a residual too; its gradient likewise; a tanh
  // is no norm activation and stays.
  // CHECK-LABEL: func.func @relu6
  // CHECK: %[[A:.*]], %{{.*}}, %{{.*}} = nn.batch_norm %arg0, %arg1, %arg2, %arg3, %arg4 {activation = #nn.unary<relu6>, training = true}
  // CHECK-NEXT: %[[B:.*]], %{{.*}}, %{{.*}} = nn.batch_norm %arg0, %arg1, %arg2, %arg3, %arg4, %[[A]] {activation = #nn.unary<relu6>, training = true}
  // CHECK-NEXT: %[[N:.*]], %{{.*}}, %{{.*}} = nn.batch_norm %arg0, %arg1, %arg2, %arg3, %arg4 {training = true}
  // CHECK-NEXT: %[[T:.*]] = nn.tanh %[[N]]
  // CHECK-NEXT: %[[DX:.*]] = nn.batch_norm_grad %arg5, %arg0, %arg1, %arg3, %arg4, %[[B]] {activation = #nn.unary<relu6>, training = true}
  // CHECK-NEXT: return %[[B]], %[[T]], %[[DX]]
  func.func @relu6(%x: tensor<2x4x3x3xf32>, %s: tensor<4xf32>, %b: tensor<4xf32>, %m: tensor<4xf32>, %v: tensor<4xf32>,
                   %dy: tensor<2x4x3x3xf32>)
      -> (tensor<2x4x3x3xf32>, tensor<2x4x3x3xf32>, tensor<2x4x3x3xf32>) {
    %n1:3 = nn.batch_norm %x, %s, %b, %m, %v {training = true} : (tensor<2x4x3x3xf32>, tensor<4xf32>, tensor<4xf32>, tensor<4xf32>, tensor<4xf32>) -> (tensor<2x4x3x3xf32>, tensor<4xf32>, tensor<4xf32>)
    %r1 = nn.relu6 %n1#0 : tensor<2x4x3x3xf32>
    %n2:3 = nn.batch_norm %x, %s, %b, %m, %v {training = true} : (tensor<2x4x3x3xf32>, tensor<4xf32>, tensor<4xf32>, tensor<4xf32>, tensor<4xf32>) -> (tensor<2x4x3x3xf32>, tensor<4xf32>, tensor<4xf32>)
    %sum = nn.add %n2#0, %r1 : (tensor<2x4x3x3xf32>, tensor<2x4x3x3xf32>) -> tensor<2x4x3x3xf32>
    %y = nn.relu6 %sum : tensor<2x4x3x3xf32>
    %n3:3 = nn.batch_norm %x, %s, %b, %m, %v {training = true} : (tensor<2x4x3x3xf32>, tensor<4xf32>, tensor<4xf32>, tensor<4xf32>, tensor<4xf32>) -> (tensor<2x4x3x3xf32>, tensor<4xf32>, tensor<4xf32>)
    %t = nn.tanh %n3#0 : tensor<2x4x3x3xf32>
    %g = nn.unary_grad <relu6> %dy, y = %y : tensor<2x4x3x3xf32>
    %dx = nn.batch_norm_grad %g, %x, %s, %m, %v {training = true} : (tensor<2x4x3x3xf32>, tensor<2x4x3x3xf32>, tensor<4xf32>, tensor<4xf32>, tensor<4xf32>) -> tensor<2x4x3x3xf32>
    return %y, %t, %dx : tensor<2x4x3x3xf32>, tensor<2x4x3x3xf32>, tensor<2x4x3x3xf32>
  }

  // Left alone: a normalized value something else reads too (returned: a
  // saved pre-activation), a broadcast add, an add of a residual computed
  // after the norm whose running mean is read before the add, and a ReLU of
  // something that is no norm.
  // CHECK-LABEL: func.func @kept
  // CHECK: nn.batch_norm %arg0, %arg1, %arg2, %arg3, %arg4 {training = true}
  // CHECK-NEXT: nn.relu
  // CHECK-NEXT: nn.batch_norm %arg0, %arg1, %arg2, %arg3, %arg4 {training = true}
  // CHECK-NEXT: nn.add
  // CHECK-NEXT: nn.batch_norm %arg0, %arg1, %arg2, %arg3, %arg4 {training = true}
  // CHECK-NEXT: nn.neg
  // CHECK-NEXT: nn.neg
  // CHECK-NEXT: nn.add
  // CHECK-NEXT: nn.relu %arg0
  func.func @kept(%x: tensor<2x4x3x3xf32>, %s: tensor<4xf32>, %b: tensor<4xf32>, %m: tensor<4xf32>, %v: tensor<4xf32>,
                  %row: tensor<3xf32>)
      -> (tensor<2x4x3x3xf32>, tensor<2x4x3x3xf32>, tensor<2x4x3x3xf32>, tensor<4xf32>, tensor<2x4x3x3xf32>, tensor<2x4x3x3xf32>) {
    %n1:3 = nn.batch_norm %x, %s, %b, %m, %v {training = true} : (tensor<2x4x3x3xf32>, tensor<4xf32>, tensor<4xf32>, tensor<4xf32>, tensor<4xf32>) -> (tensor<2x4x3x3xf32>, tensor<4xf32>, tensor<4xf32>)
    %r1 = nn.relu %n1#0 : tensor<2x4x3x3xf32>
    %n2:3 = nn.batch_norm %x, %s, %b, %m, %v {training = true} : (tensor<2x4x3x3xf32>, tensor<4xf32>, tensor<4xf32>, tensor<4xf32>, tensor<4xf32>) -> (tensor<2x4x3x3xf32>, tensor<4xf32>, tensor<4xf32>)
    %broadcast = nn.add %n2#0, %row : (tensor<2x4x3x3xf32>, tensor<3xf32>) -> tensor<2x4x3x3xf32>
    %n3:3 = nn.batch_norm %x, %s, %b, %m, %v {training = true} : (tensor<2x4x3x3xf32>, tensor<4xf32>, tensor<4xf32>, tensor<4xf32>, tensor<4xf32>) -> (tensor<2x4x3x3xf32>, tensor<4xf32>, tensor<4xf32>)
    %early = nn.neg %n3#1 : tensor<4xf32>
    %z = nn.neg %x : tensor<2x4x3x3xf32>
    %late = nn.add %n3#0, %z : (tensor<2x4x3x3xf32>, tensor<2x4x3x3xf32>) -> tensor<2x4x3x3xf32>
    %plain = nn.relu %x : tensor<2x4x3x3xf32>
    return %r1, %n1#0, %broadcast, %early, %late, %plain
        : tensor<2x4x3x3xf32>, tensor<2x4x3x3xf32>, tensor<2x4x3x3xf32>, tensor<4xf32>, tensor<2x4x3x3xf32>, tensor<2x4x3x3xf32>
  }

  // Channels-last convolutions (x [N, H, W, C]): a pre-activation ResNet's
  // conv + shortcut then ReLU, a VGG conv-ReLU, and a depthwise conv
  // without bias and ReLU6. The add's convolution takes the shortcut as its
  // residual, computed where the convolution was; a residual computed after
  // it moves the convolution to the add.
  // CHECK-LABEL: func.func @convs
  // CHECK: %[[A:.*]] = nn.conv %arg0, %arg1, %arg2 {activation = #nn.unary<relu>, channels_last = true
  // CHECK-NEXT: %[[B:.*]] = nn.conv %[[A]], %arg1, %arg2 residual = %arg0 {activation = #nn.unary<relu>, channels_last = true
  // CHECK-NEXT: %[[C:.*]] = nn.conv %[[B]], %arg3 {activation = #nn.unary<relu6>, channels_last = true
  // CHECK-NEXT: %[[Z:.*]] = nn.neg %[[C]]
  // CHECK-NEXT: %[[D:.*]] = nn.conv %[[C]], %arg3 residual = %[[Z]] {channels_last = true
  // CHECK-NEXT: return %[[D]]
  func.func @convs(%x: tensor<2x3x3x4xf32>, %w: tensor<4x3x3x4xf32>, %b: tensor<4xf32>, %dw: tensor<4x3x3x1xf32>)
      -> tensor<2x3x3x4xf32> {
    %c1 = nn.conv %x, %w, %b {channels_last = true, dilations = array<i64: 1, 1>, pads = array<i64: 1, 1, 1, 1>, strides = array<i64: 1, 1>} : (tensor<2x3x3x4xf32>, tensor<4x3x3x4xf32>, tensor<4xf32>) -> tensor<2x3x3x4xf32>
    %r1 = nn.relu %c1 : tensor<2x3x3x4xf32>
    %c2 = nn.conv %r1, %w, %b {channels_last = true, dilations = array<i64: 1, 1>, pads = array<i64: 1, 1, 1, 1>, strides = array<i64: 1, 1>} : (tensor<2x3x3x4xf32>, tensor<4x3x3x4xf32>, tensor<4xf32>) -> tensor<2x3x3x4xf32>
    %sum = nn.add %x, %c2 : (tensor<2x3x3x4xf32>, tensor<2x3x3x4xf32>) -> tensor<2x3x3x4xf32>
    %r2 = nn.relu %sum : tensor<2x3x3x4xf32>
    %c3 = nn.conv %r2, %dw {channels_last = true, dilations = array<i64: 1, 1>, group = 4 : i64, pads = array<i64: 1, 1, 1, 1>, strides = array<i64: 1, 1>} : (tensor<2x3x3x4xf32>, tensor<4x3x3x1xf32>) -> tensor<2x3x3x4xf32>
    %r3 = nn.relu6 %c3 : tensor<2x3x3x4xf32>
    %c4 = nn.conv %r3, %dw {channels_last = true, dilations = array<i64: 1, 1>, group = 4 : i64, pads = array<i64: 1, 1, 1, 1>, strides = array<i64: 1, 1>} : (tensor<2x3x3x4xf32>, tensor<4x3x3x1xf32>) -> tensor<2x3x3x4xf32>
    %z = nn.neg %r3 : tensor<2x3x3x4xf32>
    %late = nn.add %c4, %z : (tensor<2x3x3x4xf32>, tensor<2x3x3x4xf32>) -> tensor<2x3x3x4xf32>
    return %late : tensor<2x3x3x4xf32>
  }

  // Left alone: a channels-first convolution (fp32: pipec's kernels, shared
  // with the CPU), a convolution whose result is also returned, and a
  // sigmoid (not an epilogue activation).
  // CHECK-LABEL: func.func @convs_kept
  // CHECK: nn.conv %arg0, %arg1 {dilations
  // CHECK-NEXT: nn.relu
  // CHECK-NEXT: nn.conv %arg2, %arg3 {channels_last = true
  // CHECK-NEXT: nn.relu
  // CHECK-NEXT: nn.conv %arg2, %arg3 {channels_last = true
  // CHECK-NEXT: nn.sigmoid
  func.func @convs_kept(%x: tensor<2x4x3x3xf32>, %w: tensor<4x4x1x1xf32>, %xl: tensor<2x3x3x4xf32>, %wl: tensor<4x1x1x4xf32>)
      -> (tensor<2x4x3x3xf32>, tensor<2x3x3x4xf32>, tensor<2x3x3x4xf32>, tensor<2x3x3x4xf32>) {
    %c1 = nn.conv %x, %w {dilations = array<i64: 1, 1>, pads = array<i64: 0, 0, 0, 0>, strides = array<i64: 1, 1>} : (tensor<2x4x3x3xf32>, tensor<4x4x1x1xf32>) -> tensor<2x4x3x3xf32>
    %r1 = nn.relu %c1 : tensor<2x4x3x3xf32>
    %c2 = nn.conv %xl, %wl {channels_last = true, dilations = array<i64: 1, 1>, pads = array<i64: 0, 0, 0, 0>, strides = array<i64: 1, 1>} : (tensor<2x3x3x4xf32>, tensor<4x1x1x4xf32>) -> tensor<2x3x3x4xf32>
    %r2 = nn.relu %c2 : tensor<2x3x3x4xf32>
    %c3 = nn.conv %xl, %wl {channels_last = true, dilations = array<i64: 1, 1>, pads = array<i64: 0, 0, 0, 0>, strides = array<i64: 1, 1>} : (tensor<2x3x3x4xf32>, tensor<4x1x1x4xf32>) -> tensor<2x3x3x4xf32>
    %s3 = nn.sigmoid %c3 : tensor<2x3x3x4xf32>
    return %r1, %r2, %c2, %s3 : tensor<2x4x3x3xf32>, tensor<2x3x3x4xf32>, tensor<2x3x3x4xf32>, tensor<2x3x3x4xf32>
  }
}
