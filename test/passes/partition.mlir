// RUN: pipec-opt %s --pipec-estimate-costs --pipec-partition="gpus=1x2 stages=2 no-replication=true" | FileCheck %s
// RUN: pipec-opt %s --pipec-estimate-costs --pipec-partition="gpus=1x4" | FileCheck %s --check-prefix=AUTO
// RUN: not pipec-opt %s --pipec-estimate-costs --pipec-partition="gpus=1x2 memory-limit=1KiB" 2>&1 | FileCheck %s --check-prefix=MEMORY
// RUN: not pipec-opt %s --pipec-partition="gpus=1x2" 2>&1 | FileCheck %s --check-prefix=UNCOSTED

// Four equal layers on two devices: two per stage.
// CHECK: module attributes {pipe.plan = #pipe.plan<{{.*}}>, pipe.stages = [{first_op = "nn.matmul", id = 0 : i64, last_op = "nn.relu#1", ranks = array<i64: 0>, replicas = 1 : i64}, {first_op = "nn.matmul#2", id = 1 : i64, last_op = "nn.relu#3", ranks = array<i64: 1>, replicas = 1 : i64}]}
// CHECK-COUNT-4: pipe.stage = 0 : i64
// CHECK-COUNT-4: pipe.stage = 1 : i64
// AUTO: pipe.stages = [{{.*}}]
// MEMORY: error: {{.*}}
// UNCOSTED: error: 'nn.matmul' op has no pipe.cost; run pipec-estimate-costs first

func.func @forward(%x: tensor<256x1024xf32> {nn.name = "x", nn.role = #nn.role<input>},
                   %w0: tensor<1024x1024xf32> {nn.name = "w0", nn.role = #nn.role<param>},
                   %w1: tensor<1024x1024xf32> {nn.name = "w1", nn.role = #nn.role<param>},
                   %w2: tensor<1024x1024xf32> {nn.name = "w2", nn.role = #nn.role<param>},
                   %w3: tensor<1024x1024xf32> {nn.name = "w3", nn.role = #nn.role<param>}) -> tensor<256x1024xf32> {
  %0 = nn.matmul %x, %w0 : (tensor<256x1024xf32>, tensor<1024x1024xf32>) -> tensor<256x1024xf32>
  %1 = nn.relu %0 : tensor<256x1024xf32>
  %2 = nn.matmul %1, %w1 : (tensor<256x1024xf32>, tensor<1024x1024xf32>) -> tensor<256x1024xf32>
  %3 = nn.relu %2 : tensor<256x1024xf32>
  %4 = nn.matmul %3, %w2 : (tensor<256x1024xf32>, tensor<1024x1024xf32>) -> tensor<256x1024xf32>
  %5 = nn.relu %4 : tensor<256x1024xf32>
  %6 = nn.matmul %5, %w3 : (tensor<256x1024xf32>, tensor<1024x1024xf32>) -> tensor<256x1024xf32>
  %7 = nn.relu %6 : tensor<256x1024xf32>
  return %7 : tensor<256x1024xf32>
}
