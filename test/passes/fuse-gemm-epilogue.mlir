// RUN: pipec-opt %s --pipec-fuse-gemm-epilogue | FileCheck %s

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

  // Left alone: a pre-activation that is also returned (saved for a
  // gradient that reads the GELU's input), a view with a second reader, an
  // activation of an activated GEMM (the first becomes the epilogue, the
  // second stays), and a unary of something that is not a GEMM.
  // CHECK-LABEL: func.func @kept
  // CHECK: %[[P:.*]] = nn.gemm %arg0, %arg1 :
  // CHECK-NEXT: nn.gelu %[[P]]
  // CHECK: %[[Q:.*]] = nn.gemm %arg0, %arg1 :
  // CHECK-NEXT: %[[QV:.*]] = nn.reshape %[[Q]]
  // CHECK-NEXT: nn.sigmoid %[[QV]]
  // CHECK: %[[R:.*]] = nn.gemm %arg0, %arg1 {activation = #nn.unary<relu>}
  // CHECK-NEXT: nn.relu %[[R]]
  // CHECK: nn.sqrt %arg0
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
}

// Outside a stage nothing changes.
// CHECK-LABEL: func.func @outside
// CHECK: nn.relu
func.func @outside(%x: tensor<4x4xf32>, %w: tensor<4x4xf32>) -> tensor<4x4xf32> {
  %g = nn.gemm %x, %w : (tensor<4x4xf32>, tensor<4x4xf32>) -> tensor<4x4xf32>
  %r = nn.relu %g : tensor<4x4xf32>
  return %r : tensor<4x4xf32>
}
