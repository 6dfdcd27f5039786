// RUN: pipec-opt %s -split-input-file --pipec-estimate-costs | FileCheck %s
// RUN: pipec-opt %s -split-input-file --pipec-estimate-costs="device=V100 optimizer=sgd" | FileCheck %s --check-prefix=V100

// A two-layer perceptron: the first layer's input gradient is not needed (it
// would flow into the model's input), its weight gradient is W; the second
// layer has both. Parameter bytes count at the first user; AdamW keeps two
// values per trained weight. Saved bytes (what a micro-batch keeps until its
// backward): a layer with a weight gradient keeps the gradient of its result
// from B to W; ReLU keeps its result, which its gradient and the second
// layer's weight gradient read; the first layer's result no gradient reads.
// CHECK-LABEL: func @mlp
func.func @mlp(%w1: tensor<64x32xf32> {nn.name = "w1", nn.role = #nn.role<param>},
               %w2: tensor<10x64xf32> {nn.name = "w2", nn.role = #nn.role<param>},
               %x: tensor<8x32xf32> {nn.name = "x", nn.role = #nn.role<input>}) -> tensor<8x10xf32> {
  // CHECK: nn.gemm {{.*}}pipe.cost = #pipe.cost<name = "nn.gemm", fwd = {{.*}}, bwd_input = 0.0, bwd_weight = [[W1:[^,]*]], fwd_flops = 32768.0, activation_bytes = 2048, saved_bytes = 2048, param_bytes = 8192, optimizer_bytes = 16384, source = "estimate">
  %0 = nn.gemm %x, %w1 {transB = true} : (tensor<8x32xf32>, tensor<64x32xf32>) -> tensor<8x64xf32>
  // CHECK: nn.relu {{.*}}pipe.cost = #pipe.cost<name = "nn.relu", fwd = {{[^,]*}}, bwd_input = {{[1-9][^,]*}}, bwd_weight = 0.0, {{.*}}activation_bytes = 2048, saved_bytes = 2048,
  %1 = nn.relu %0 : tensor<8x64xf32>
  // CHECK: nn.gemm {{.*}}pipe.cost = #pipe.cost<name = "nn.gemm#1", fwd = {{[^,]*}}, bwd_input = {{[1-9][^,]*}}, bwd_weight = {{[1-9][^,]*}}, fwd_flops = 10240.0, activation_bytes = 320, saved_bytes = 320, param_bytes = 2560, optimizer_bytes = 5120
  %2 = nn.gemm %1, %w2 {transB = true} : (tensor<8x64xf32>, tensor<10x64xf32>) -> tensor<8x10xf32>
  return %2 : tensor<8x10xf32>
}
// V100-LABEL: func @mlp
// V100: nn.gemm {{.*}}param_bytes = 8192, optimizer_bytes = 0,

// -----

// Large matrix products are compute bound: 2·1024³ FLOPs at the H100's fp32
// peak (67 TFLOP/s) take about 32 µs, plus the 4 µs launch.
// CHECK-LABEL: func @big
func.func @big(%a: tensor<1024x1024xf32> {nn.name = "a", nn.role = #nn.role<input>},
               %w: tensor<1024x1024xf32> {nn.name = "w", nn.role = #nn.role<param>}) -> tensor<1024x1024xf32> {
  // CHECK: nn.matmul {{.*}}fwd = 3.6{{[0-9]*}}e-05,
  %0 = nn.matmul %a, %w : (tensor<1024x1024xf32>, tensor<1024x1024xf32>) -> tensor<1024x1024xf32>
  return %0 : tensor<1024x1024xf32>
}

// -----

// Views run no kernel; a weight transposed before a MatMul (PyTorch's Linear
// on 3-D input) keeps the MatMul's gradient for it a weight gradient. Neither
// the transposed weight (computed from the weight alone) nor the view is kept
// for the backward.
// CHECK-LABEL: func @views
func.func @views(%x: tensor<2x4x8xf32> {nn.name = "x", nn.role = #nn.role<input>},
                 %w: tensor<16x8xf32> {nn.name = "w", nn.role = #nn.role<param>}) -> tensor<8x16xf32> {
  // CHECK: nn.transpose {{.*}}bwd_input = 0.0, bwd_weight = {{[1-9][^,]*}}, {{.*}}activation_bytes = 512, saved_bytes = 0,
  %t = nn.transpose %w {perm = array<i64: 1, 0>} : (tensor<16x8xf32>) -> tensor<8x16xf32>
  // CHECK: nn.matmul {{.*}}bwd_input = 0.0, bwd_weight = {{[1-9][^,]*}},
  %m = nn.matmul %x, %t : (tensor<2x4x8xf32>, tensor<8x16xf32>) -> tensor<2x4x16xf32>
  // CHECK: nn.reshape {{.*}}pipe.cost = #pipe.cost<name = "{{[^"]*}}", fwd = 0.0, bwd_input = 0.0, bwd_weight = 0.0, {{.*}}activation_bytes = 512, saved_bytes = 0,
  %r = nn.reshape %m : tensor<2x4x16xf32> -> tensor<8x16xf32>
  return %r : tensor<8x16xf32>
}

// -----

// At bf16, convolutions and batch norms run at the preset's convolution
// efficiency (dense 0.29, grouped 0.15) and batch-norm efficiency (0.23) of
// the rates other ops get (docs/cost-model.md); other precisions were not
// fitted and keep the common ones. The dense convolution (2·8·256·256·9·784
// = 7.4e9 FLOPs) is compute bound: on an H100 at bf16 989.4e12 · 0.36 · 0.29
// FLOP/s, 71.7 µs plus the launch; at tf32 494.7e12 · 0.36, 41.6 µs.
// The depthwise one (256 groups) and the batch norm are bound by their bytes:
// 4.04 µs of them at tf32 (float storage, bandwidth 3.35e12 · 0.95), half
// the bytes at bf16 divided by 0.15 and 0.23: 13.5 and 8.8 µs.
// RUN: pipec-opt %s -split-input-file --pipec-estimate-costs="precision=bf16" | FileCheck %s --check-prefix=BF16
// RUN: pipec-opt %s -split-input-file --pipec-estimate-costs="precision=tf32" | FileCheck %s --check-prefix=TF32
// BF16-LABEL: func @convolutions
// TF32-LABEL: func @convolutions
func.func @convolutions(%x: tensor<8x256x28x28xf32> {nn.name = "x", nn.role = #nn.role<input>},
                        %w: tensor<256x256x3x3xf32> {nn.name = "w", nn.role = #nn.role<param>},
                        %d: tensor<256x1x3x3xf32> {nn.name = "d", nn.role = #nn.role<param>},
                        %s: tensor<256xf32> {nn.name = "s", nn.role = #nn.role<param>},
                        %b: tensor<256xf32> {nn.name = "b", nn.role = #nn.role<param>},
                        %m: tensor<256xf32> {nn.name = "m", nn.role = #nn.role<buffer>},
                        %v: tensor<256xf32> {nn.name = "v", nn.role = #nn.role<buffer>}) -> tensor<8x256x28x28xf32> {
  // BF16: nn.conv {{.*}}fwd = 7.5{{[0-9]*}}e-05,
  // TF32: nn.conv {{.*}}fwd = 4.5{{[0-9]*}}e-05,
  %c = nn.conv %x, %w {strides = array<i64: 1, 1>, pads = array<i64: 1, 1, 1, 1>, dilations = array<i64: 1, 1>} : (tensor<8x256x28x28xf32>, tensor<256x256x3x3xf32>) -> tensor<8x256x28x28xf32>
  // BF16: nn.conv {{.*}}fwd = 1.74{{[0-9]*}}e-05,
  // TF32: nn.conv {{.*}}fwd = 8.03{{[0-9]*}}e-06,
  %g = nn.conv %c, %d {strides = array<i64: 1, 1>, pads = array<i64: 1, 1, 1, 1>, dilations = array<i64: 1, 1>, group = 256 : i64} : (tensor<8x256x28x28xf32>, tensor<256x1x3x3xf32>) -> tensor<8x256x28x28xf32>
  // BF16: nn.batch_norm {{.*}}fwd = 1.27{{[0-9]*}}e-05,
  // TF32: nn.batch_norm {{.*}}fwd = 8.03{{[0-9]*}}e-06,
  %n:3 = nn.batch_norm %g, %s, %b, %m, %v {training = true} : (tensor<8x256x28x28xf32>, tensor<256xf32>, tensor<256xf32>, tensor<256xf32>, tensor<256xf32>) -> (tensor<8x256x28x28xf32>, tensor<256xf32>, tensor<256xf32>)
  return %n#0 : tensor<8x256x28x28xf32>
}
