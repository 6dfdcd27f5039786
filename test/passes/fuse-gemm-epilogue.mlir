// RUN: pipec-opt %s --pipec-fuse-gemm-epilogue | FileCheck %s
// RUN: pipec-opt %s --pipec-fuse-gemm-epilogue="target=cuda" | FileCheck %s --check-prefix=CUDA

// For the CUDA target only what cuBLASLt applies (ReLU, the tanh GELU and
// its gradient) becomes an epilogue; tanh, the exact GELU and sigmoid stay
// ops, for element-wise fusion to put in their readers' loops.
// CUDA-LABEL: func.func @fwd
// CUDA: nn.gemm %arg0, %arg1, %arg2 {activation = #nn.unary<relu>, transB = true}
// CUDA: %[[G:.*]] = nn.gemm %{{.*}}, %arg3 :
// CUDA-NEXT: %[[V:.*]] = nn.reshape %[[G]]
// CUDA-NEXT: nn.tanh %[[V]]
// CUDA-LABEL: func.func @kept
// CUDA: %[[P:.*]] = nn.gemm %arg0, %arg1 :
// CUDA-NEXT: nn.gelu %[[P]]
// CUDA: nn.sigmoid
// CUDA: nn.gemm %arg0, %arg1 {activation = #nn.unary<relu>}
// CUDA-LABEL: func.func @bwd
// CUDA: nn.gemm_activation_grad %arg0, %arg1, %{{.*}} {alpha = 5.000000e-01 : f32, function = #nn.unary<gelu_tanh>, transB = true}

pipe.stage @stage_0 attributes {id = 0 : i64, replicas = 1 : i64} {
  // A ReLU read by nothing but the next layer and the gradient (which reads
  // the ReLU's result) becomes its GEMM's epilogue; so does a tanh behind a
  // view, and the view then reads the GEMM.
  // CHECK-LABEL: func.func @fwd
  // CHECK: %[[H:.*]] = nn.gemm %arg0, %arg1, %arg2 {activation = #nn.unary<relu>, transB = true}
  // CHECK-NOT: nn.relu
  // CHECK: %[[G:.*]] = nn.gemm %[[H]], %arg3 {activation = #nn.unary<tanh>}
  // CHECK-NEXT: %[[V:.*]] = nn.reshape %[[G]]
  // CHECK-NOT: nn.tanh
  // CHECK: return %[[V]], %[[H]]
  func.func @fwd(%x: tensor<8x32xf32>, %w: tensor<64x32xf32>, %b: tensor<64xf32>, %w2: tensor<64x16xf32>)
      -> (tensor<2x4x16xf32>, tensor<8x64xf32> {pipe.saved = "relu"}) {
    %g = nn.gemm %x, %w, %b {transB = true} : (tensor<8x32xf32>, tensor<64x32xf32>, tensor<64xf32>) -> tensor<8x64xf32>
    %r = nn.relu %g : tensor<8x64xf32>
    %g2 = nn.gemm %r, %w2 : (tensor<8x64xf32>, tensor<64x16xf32>) -> tensor<8x16xf32>
    %v = nn.reshape %g2 : tensor<8x16xf32> -> tensor<2x4x16xf32>
    %t = nn.tanh %v : tensor<2x4x16xf32>
    return %t, %r : tensor<2x4x16xf32>, tensor<8x64xf32>
  }

  // A pre-activation that is also returned (saved for a gradient that reads
  // the GELU's input) and a view with a second reader: the GEMM returns
  // both (keeps_pre_activation), the other readers take the pre-activation.
  // Left alone: an activation of an activated GEMM (the first becomes the
  // epilogue, the second stays) and a unary of something that is not a GEMM.
  // CHECK-LABEL: func.func @kept
  // CHECK: %[[P:.*]], %[[PRE:.*]] = nn.gemm %arg0, %arg1 {activation = #nn.unary<gelu>, keeps_pre_activation = true}
  // CHECK-NEXT: %[[Q:.*]], %[[QPRE:.*]] = nn.gemm %arg0, %arg1 {activation = #nn.unary<sigmoid>, keeps_pre_activation = true}
  // CHECK-NEXT: %[[S:.*]] = nn.reshape %[[Q]] : tensor<4x4xf32> -> tensor<16xf32>
  // CHECK-NEXT: %[[QV:.*]] = nn.reshape %[[QPRE]] : tensor<4x4xf32> -> tensor<16xf32>
  // CHECK-NOT: nn.gelu
  // CHECK-NOT: nn.sigmoid
  // CHECK: %[[R:.*]] = nn.gemm %arg0, %arg1 {activation = #nn.unary<relu>}
  // CHECK-NEXT: nn.relu %[[R]]
  // CHECK: nn.sqrt %arg0
  // CHECK: return %[[P]], %[[PRE]], %[[S]], %[[QV]]
  func.func @kept(%x: tensor<4x4xf32>, %w: tensor<4x4xf32>)
      -> (tensor<4x4xf32>, tensor<4x4xf32> {pipe.saved = "gemm"}, tensor<16xf32>, tensor<16xf32>, tensor<4x4xf32>, tensor<4x4xf32>) {
    %p = nn.gemm %x, %w : (tensor<4x4xf32>, tensor<4x4xf32>) -> tensor<4x4xf32>
    %gelu = nn.gelu %p : tensor<4x4xf32>
    %q = nn.gemm %x, %w : (tensor<4x4xf32>, tensor<4x4xf32>) -> tensor<4x4xf32>
    %qv = nn.reshape %q : tensor<4x4xf32> -> tensor<16xf32>
    %s = nn.sigmoid %qv : tensor<16xf32>
    %r = nn.gemm %x, %w : (tensor<4x4xf32>, tensor<4x4xf32>) -> tensor<4x4xf32>
    %r1 = nn.relu %r : tensor<4x4xf32>
    %r2 = nn.relu %r1 : tensor<4x4xf32>
    %sq = nn.sqrt %x : tensor<4x4xf32>
    return %gelu, %p, %s, %qv, %r2, %sq : tensor<4x4xf32>, tensor<4x4xf32>, tensor<16xf32>, tensor<16xf32>, tensor<4x4xf32>, tensor<4x4xf32>
  }

  // An activation's gradient whose incoming gradient is a GEMM's product
  // (through a view) read by nothing else: one nn.gemm_activation_grad, x
  // seen in the product's shape. Left alone: a product with C, one read
  // elsewhere too, and a derivative that reads the result (relu).
  // CHECK-LABEL: func.func @bwd
  // CHECK: %[[X2:.*]] = nn.reshape %arg2 : tensor<2x4x64xf32> -> tensor<8x64xf32>
  // CHECK-NEXT: %[[D:.*]] = nn.gemm_activation_grad %arg0, %arg1, %[[X2]] {alpha = 5.000000e-01 : f32, function = #nn.unary<gelu_tanh>, transB = true}
  // CHECK-NEXT: %[[DV:.*]] = nn.reshape %[[D]] : tensor<8x64xf32> -> tensor<2x4x64xf32>
  // CHECK: %[[C:.*]] = nn.gemm %arg0, %arg1, %arg3 {transB = true}
  // CHECK-NEXT: nn.unary_grad <gelu_tanh> %[[C]]
  // CHECK: %[[E:.*]] = nn.gemm %arg0, %arg1 {transB = true}
  // CHECK-NEXT: nn.unary_grad <gelu_tanh> %[[E]]
  // CHECK: %[[F:.*]] = nn.gemm %arg0, %arg1 {transB = true}
  // CHECK-NEXT: nn.unary_grad <relu> %[[F]]
  // CHECK: return %[[DV]]
  func.func @bwd(%dy: tensor<8x16xf32>, %w: tensor<64x16xf32>, %x: tensor<2x4x64xf32>, %b: tensor<64xf32>, %x2: tensor<8x64xf32>)
      -> (tensor<2x4x64xf32>, tensor<8x64xf32>, tensor<8x64xf32>, tensor<8x64xf32>, tensor<8x64xf32>) {
    %g = nn.gemm %dy, %w {transB = true, alpha = 0.5 : f32} : (tensor<8x16xf32>, tensor<64x16xf32>) -> tensor<8x64xf32>
    %gv = nn.reshape %g : tensor<8x64xf32> -> tensor<2x4x64xf32>
    %d = nn.unary_grad <gelu_tanh> %gv, x = %x : tensor<2x4x64xf32>
    %c = nn.gemm %dy, %w, %b {transB = true} : (tensor<8x16xf32>, tensor<64x16xf32>, tensor<64xf32>) -> tensor<8x64xf32>
    %dc = nn.unary_grad <gelu_tanh> %c, x = %x2 : tensor<8x64xf32>
    %e = nn.gemm %dy, %w {transB = true} : (tensor<8x16xf32>, tensor<64x16xf32>) -> tensor<8x64xf32>
    %de = nn.unary_grad <gelu_tanh> %e, x = %x2 : tensor<8x64xf32>
    %f = nn.gemm %dy, %w {transB = true} : (tensor<8x16xf32>, tensor<64x16xf32>) -> tensor<8x64xf32>
    %df = nn.unary_grad <relu> %f, y = %x2 : tensor<8x64xf32>
    return %d, %dc, %de, %e, %df : tensor<2x4x64xf32>, tensor<8x64xf32>, tensor<8x64xf32>, tensor<8x64xf32>, tensor<8x64xf32>
  }
}

// Outside a stage nothing changes.
// CHECK-LABEL: func.func @outside
// CHECK: nn.relu
func.func @outside(%x: tensor<4x4xf32>, %w: tensor<4x4xf32>) -> tensor<4x4xf32> {
  %g = nn.gemm %x, %w : (tensor<4x4xf32>, tensor<4x4xf32>) -> tensor<4x4xf32>
  %r = nn.relu %g : tensor<4x4xf32>
  return %r : tensor<4x4xf32>
}
