// The whole chain in one process, from a forward function to stage modules
// (the pipe dialect is loaded by the passes, not by the input).
// RUN: pipec-opt %s --pipec-append-loss --pipec-estimate-costs --pipec-partition="gpus=1x2 stages=2 no-replication=true" --pipec-autodiff --pipec-optimizer --pipec-outline-stages --pipec-recompute=mode=all --pipec-weight-stashing=versions=2 --pipec-verify-pipeline | FileCheck %s

// CHECK-LABEL: pipe.stage @stage_0
// CHECK: func.func @fwd(
// CHECK: pipe.send %{{.*}} to 1 tag [[ACT:[0-9]+]]
// CHECK: func.func @bwd_input(
// CHECK: pipe.recv from 1 tag [[GRAD:[0-9]+]]
// CHECK: func.func @bwd_weight(
// CHECK: nn.name = "w0", nn.role = #nn.role<grad>
// CHECK: func.func @step(
// CHECK: nn.adamw_update
// CHECK-LABEL: pipe.stage @stage_1
// CHECK: func.func @fwd(
// CHECK-SAME: nn.role = #nn.role<loss>
// CHECK: pipe.recv from 0 tag [[ACT]]
// CHECK: func.func @bwd_input(
// CHECK-SAME: nn.role = #nn.role<loss_scale>
// CHECK: pipe.send %{{.*}} to 0 tag [[GRAD]]
// CHECK: func.func @step(
// CHECK-NOT: func.func @train_step

func.func @forward(%x: tensor<64x256xf32> {nn.name = "x", nn.role = #nn.role<input>},
                   %w0: tensor<256x256xf32> {nn.name = "w0", nn.role = #nn.role<param>},
                   %w1: tensor<256x256xf32> {nn.name = "w1", nn.role = #nn.role<param>},
                   %w2: tensor<256x256xf32> {nn.name = "w2", nn.role = #nn.role<param>},
                   %w3: tensor<256x10xf32> {nn.name = "w3", nn.role = #nn.role<param>}) -> tensor<64x10xf32> {
  %0 = nn.matmul %x, %w0 : (tensor<64x256xf32>, tensor<256x256xf32>) -> tensor<64x256xf32>
  %1 = nn.relu %0 : tensor<64x256xf32>
  %2 = nn.matmul %1, %w1 : (tensor<64x256xf32>, tensor<256x256xf32>) -> tensor<64x256xf32>
  %3 = nn.relu %2 : tensor<64x256xf32>
  %4 = nn.matmul %3, %w2 : (tensor<64x256xf32>, tensor<256x256xf32>) -> tensor<64x256xf32>
  %5 = nn.relu %4 : tensor<64x256xf32>
  %6 = nn.matmul %5, %w3 : (tensor<64x256xf32>, tensor<256x10xf32>) -> tensor<64x10xf32>
  return %6 : tensor<64x10xf32>
}
