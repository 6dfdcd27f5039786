// RUN: pipec-opt %s --pipec-pad-classes --split-input-file | FileCheck %s

// A tied vocabulary of 1,001 classes (GPT-2's 50,257 in small): the weight
// gains 23 zero rows, the GEMM a bias of 0 then -inf, the views and the loss
// the rounded 1,024 classes, and the loss the real count.
// CHECK-LABEL: func.func @tied
// CHECK-SAME: (%[[H:.*]]: tensor<256x64xf32>, %[[W:.*]]: tensor<1001x64xf32>, %[[L:.*]]: tensor<256xi64>)
// CHECK-NEXT: %[[WP:.*]] = nn.pad %[[W]] {pads = array<i64: 0, 0, 23, 0>, pipe.stage = 0 : i64} : (tensor<1001x64xf32>) -> tensor<1024x64xf32>
// CHECK-NEXT: %[[C:.*]] = nn.constant {pipe.stage = 0 : i64} dense<"0x{{((00000000){143}){7}((000080FF){23})}}"> : tensor<1024xf32>
// CHECK-NEXT: %[[G:.*]] = nn.gemm %[[H]], %[[WP]], %[[C]] {pipe.stage = 0 : i64, transB = true} : (tensor<256x64xf32>, tensor<1024x64xf32>, tensor<1024xf32>) -> tensor<256x1024xf32>
// CHECK-NEXT: %[[R:.*]] = nn.reshape %[[G]] {pipe.stage = 0 : i64} : tensor<256x1024xf32> -> tensor<2x128x1024xf32>
// CHECK-NEXT: %[[S:.*]] = nn.reshape %[[R]] {pipe.stage = 0 : i64} : tensor<2x128x1024xf32> -> tensor<256x1024xf32>
// CHECK-NEXT: %{{.*}}, %{{.*}} = nn.softmax_cross_entropy_loss %[[S]], %[[L]] {classes = 1001 : i64, pipe.stage = 0 : i64} : (tensor<256x1024xf32>, tensor<256xi64>) -> (tensor<f32>, tensor<256x1024xf32>)
func.func @tied(%h: tensor<256x64xf32>, %w: tensor<1001x64xf32>, %labels: tensor<256xi64>) -> tensor<f32> {
  %g = nn.gemm %h, %w {transB = true, pipe.stage = 0 : i64} : (tensor<256x64xf32>, tensor<1001x64xf32>) -> tensor<256x1001xf32>
  %r = nn.reshape %g {pipe.stage = 0 : i64} : tensor<256x1001xf32> -> tensor<2x128x1001xf32>
  %s = nn.reshape %r {pipe.stage = 0 : i64} : tensor<2x128x1001xf32> -> tensor<256x1001xf32>
  %loss, %lp = nn.softmax_cross_entropy_loss %s, %labels {pipe.stage = 0 : i64} : (tensor<256x1001xf32>, tensor<256xi64>) -> (tensor<f32>, tensor<256x1001xf32>)
  return %loss : tensor<f32>
}

// -----

// A weight [K, N], a bias and class weights: the weight gains columns, the
// bias -inf, the class weights 0; ignore_index and the reduction stay.
// CHECK-LABEL: func.func @bias_and_weights
// CHECK-NEXT: %[[WP:.*]] = nn.pad %arg1 {pads = array<i64: 0, 0, 0, 23>} : (tensor<64x1001xf32>) -> tensor<64x1024xf32>
// CHECK-NEXT: %[[BP:.*]] = nn.pad %arg2 {pads = array<i64: 0, 23>, value = 0xFFF0000000000000 : f64} : (tensor<1001xf32>) -> tensor<1024xf32>
// CHECK-NEXT: %[[G:.*]] = nn.gemm %arg0, %[[WP]], %[[BP]] {alpha = 5.000000e-01 : f32} : (tensor<256x64xf32>, tensor<64x1024xf32>, tensor<1024xf32>) -> tensor<256x1024xf32>
// CHECK-NEXT: %[[CW:.*]] = nn.pad %arg4 {pads = array<i64: 0, 23>} : (tensor<1001xf32>) -> tensor<1024xf32>
// CHECK-NEXT: %{{.*}}, %{{.*}} = nn.softmax_cross_entropy_loss %[[G]], %arg3, %[[CW]] {classes = 1001 : i64, ignore_index = -100 : i64, reduction = "sum"}
func.func @bias_and_weights(%h: tensor<256x64xf32>, %w: tensor<64x1001xf32>, %b: tensor<1001xf32>, %labels: tensor<256xi64>, %cw: tensor<1001xf32>) -> tensor<f32> {
  %g = nn.gemm %h, %w, %b {alpha = 0.5 : f32} : (tensor<256x64xf32>, tensor<64x1001xf32>, tensor<1001xf32>) -> tensor<256x1001xf32>
  %loss, %lp = nn.softmax_cross_entropy_loss %g, %labels, %cw {reduction = "sum", ignore_index = -100 : i64} : (tensor<256x1001xf32>, tensor<256xi64>, tensor<1001xf32>) -> (tensor<f32>, tensor<256x1001xf32>)
  return %loss : tensor<f32>
}

// -----

// A bias row [1, N] gains -inf columns; beta, which scales C, becomes 1 only
// where the GEMM had no C (here it has one, read with beta 1).
// CHECK-LABEL: func.func @row_bias
// CHECK-NEXT: %[[WP:.*]] = nn.pad %arg1 {pads = array<i64: 0, 0, 23, 0>}
// CHECK-NEXT: %[[BP:.*]] = nn.pad %arg2 {pads = array<i64: 0, 0, 0, 23>, value = 0xFFF0000000000000 : f64} : (tensor<1x1001xf32>) -> tensor<1x1024xf32>
// CHECK-NEXT: nn.gemm %arg0, %[[WP]], %[[BP]] {transB = true} : (tensor<256x64xf32>, tensor<1024x64xf32>, tensor<1x1024xf32>) -> tensor<256x1024xf32>
// CHECK-LABEL: func.func @beta_without_c
// CHECK: nn.gemm %arg0, %{{.*}}, %{{.*}} {transB = true} : (tensor<256x64xf32>, tensor<1024x64xf32>, tensor<1024xf32>) -> tensor<256x1024xf32>
func.func @row_bias(%h: tensor<256x64xf32>, %w: tensor<1001x64xf32>, %b: tensor<1x1001xf32>, %labels: tensor<256xi64>) -> tensor<f32> {
  %g = nn.gemm %h, %w, %b {transB = true} : (tensor<256x64xf32>, tensor<1001x64xf32>, tensor<1x1001xf32>) -> tensor<256x1001xf32>
  %loss, %lp = nn.softmax_cross_entropy_loss %g, %labels : (tensor<256x1001xf32>, tensor<256xi64>) -> (tensor<f32>, tensor<256x1001xf32>)
  return %loss : tensor<f32>
}
func.func @beta_without_c(%h: tensor<256x64xf32>, %w: tensor<1001x64xf32>, %labels: tensor<256xi64>) -> tensor<f32> {
  %g = nn.gemm %h, %w {transB = true, beta = 3.0 : f32} : (tensor<256x64xf32>, tensor<1001x64xf32>) -> tensor<256x1001xf32>
  %loss, %lp = nn.softmax_cross_entropy_loss %g, %labels : (tensor<256x1001xf32>, tensor<256xi64>) -> (tensor<f32>, tensor<256x1001xf32>)
  return %loss : tensor<f32>
}

// -----

// Left alone: too few rows for the padded copy of the weight to pay (64
// rows, 128 needed); a class count that is a multiple of 8; log_prob read;
// the logits read by something else; a bias scaled by beta; padding that
// would add more than 1/8 (100 classes -> 128); a GEMM with an epilogue;
// a stage cut between the GEMM and the loss; a view read by another op.
// CHECK-LABEL: func.func @left_alone
// CHECK-NOT: nn.pad
// CHECK-NOT: classes =
// CHECK: return
func.func @left_alone(%h64: tensor<64x64xf32>, %h: tensor<256x64xf32>, %w: tensor<1001x64xf32>, %w8: tensor<1000x64xf32>,
                      %w100: tensor<100x64xf32>, %b: tensor<1001xf32>, %l64: tensor<64xi64>, %l: tensor<256xi64>)
    -> (tensor<f32>, tensor<f32>, tensor<f32>, tensor<256x1001xf32>, tensor<f32>, tensor<256x1001xf32>, tensor<f32>, tensor<f32>, tensor<f32>, tensor<f32>, tensor<f32>, tensor<2x128x1001xf32>) {
  %g0 = nn.gemm %h64, %w {transB = true} : (tensor<64x64xf32>, tensor<1001x64xf32>) -> tensor<64x1001xf32>
  %loss0, %lp0 = nn.softmax_cross_entropy_loss %g0, %l64 : (tensor<64x1001xf32>, tensor<64xi64>) -> (tensor<f32>, tensor<64x1001xf32>)
  %g1 = nn.gemm %h, %w8 {transB = true} : (tensor<256x64xf32>, tensor<1000x64xf32>) -> tensor<256x1000xf32>
  %loss1, %lp1 = nn.softmax_cross_entropy_loss %g1, %l : (tensor<256x1000xf32>, tensor<256xi64>) -> (tensor<f32>, tensor<256x1000xf32>)
  %g2 = nn.gemm %h, %w {transB = true} : (tensor<256x64xf32>, tensor<1001x64xf32>) -> tensor<256x1001xf32>
  %loss2, %lp2 = nn.softmax_cross_entropy_loss %g2, %l : (tensor<256x1001xf32>, tensor<256xi64>) -> (tensor<f32>, tensor<256x1001xf32>)
  %g3 = nn.gemm %h, %w {transB = true} : (tensor<256x64xf32>, tensor<1001x64xf32>) -> tensor<256x1001xf32>
  %loss3, %lp3 = nn.softmax_cross_entropy_loss %g3, %l : (tensor<256x1001xf32>, tensor<256xi64>) -> (tensor<f32>, tensor<256x1001xf32>)
  %g4 = nn.gemm %h, %w, %b {transB = true, beta = 2.0 : f32} : (tensor<256x64xf32>, tensor<1001x64xf32>, tensor<1001xf32>) -> tensor<256x1001xf32>
  %loss4, %lp4 = nn.softmax_cross_entropy_loss %g4, %l : (tensor<256x1001xf32>, tensor<256xi64>) -> (tensor<f32>, tensor<256x1001xf32>)
  %g5 = nn.gemm %h, %w100 {transB = true} : (tensor<256x64xf32>, tensor<100x64xf32>) -> tensor<256x100xf32>
  %loss5, %lp5 = nn.softmax_cross_entropy_loss %g5, %l : (tensor<256x100xf32>, tensor<256xi64>) -> (tensor<f32>, tensor<256x100xf32>)
  %g6 = nn.gemm %h, %w {transB = true, activation = #nn.unary<relu>} : (tensor<256x64xf32>, tensor<1001x64xf32>) -> tensor<256x1001xf32>
  %loss6, %lp6 = nn.softmax_cross_entropy_loss %g6, %l : (tensor<256x1001xf32>, tensor<256xi64>) -> (tensor<f32>, tensor<256x1001xf32>)
  %g7 = nn.gemm %h, %w {transB = true, pipe.stage = 0 : i64} : (tensor<256x64xf32>, tensor<1001x64xf32>) -> tensor<256x1001xf32>
  %loss7, %lp7 = nn.softmax_cross_entropy_loss %g7, %l {pipe.stage = 1 : i64} : (tensor<256x1001xf32>, tensor<256xi64>) -> (tensor<f32>, tensor<256x1001xf32>)
  %g8 = nn.gemm %h, %w {transB = true} : (tensor<256x64xf32>, tensor<1001x64xf32>) -> tensor<256x1001xf32>
  %r8 = nn.reshape %g8 : tensor<256x1001xf32> -> tensor<2x128x1001xf32>
  %s8 = nn.reshape %r8 : tensor<2x128x1001xf32> -> tensor<256x1001xf32>
  %loss8, %lp8 = nn.softmax_cross_entropy_loss %s8, %l : (tensor<256x1001xf32>, tensor<256xi64>) -> (tensor<f32>, tensor<256x1001xf32>)
  return %loss0, %loss1, %loss2, %lp2, %loss3, %g3, %loss4, %loss5, %loss6, %loss7, %loss8, %r8 : tensor<f32>, tensor<f32>, tensor<f32>, tensor<256x1001xf32>, tensor<f32>, tensor<256x1001xf32>, tensor<f32>, tensor<f32>, tensor<f32>, tensor<f32>, tensor<f32>, tensor<2x128x1001xf32>
}
