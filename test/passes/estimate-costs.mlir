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
