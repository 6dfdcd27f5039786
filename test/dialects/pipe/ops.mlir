// The pipe ops parse, verify and print back.
// RUN: pipec-opt %s | FileCheck %s
// RUN: pipec-opt %s | pipec-opt | FileCheck %s

// CHECK-LABEL: pipe.stage @stage0 attributes {id = 0 : i64, ranks = array<i64: 0, 1>, replicas = 2 : i64}
pipe.stage @stage0 attributes {id = 0 : i64, replicas = 2 : i64, ranks = array<i64: 0, 1>} {
  // CHECK: func.func @fwd
  func.func @fwd(%x: tensor<8x32xf32>, %w: tensor<32x32xf32>, %mb: index) -> tensor<8x32xf32> {
    // CHECK: pipe.stash %{{.*}} for %{{.*}} {name = "fc.weight", slots = 3 : i64} : tensor<32x32xf32>
    pipe.stash %w for %mb {name = "fc.weight", slots = 3 : i64} : tensor<32x32xf32>
    %y = nn.matmul %x, %w : (tensor<8x32xf32>, tensor<32x32xf32>) -> tensor<8x32xf32>
    // CHECK: pipe.send %{{.*}} to 1 tag 7 : tensor<8x32xf32>
    pipe.send %y to 1 tag 7 : tensor<8x32xf32>
    return %y : tensor<8x32xf32>
  }
  // CHECK: func.func @bwd_weight
  func.func @bwd_weight(%g: tensor<32x32xf32>, %mb: index) -> tensor<32x32xf32> {
    // CHECK: pipe.restore %{{.*}} {name = "fc.weight", slots = 3 : i64} : tensor<32x32xf32>
    %w = pipe.restore %mb {name = "fc.weight", slots = 3 : i64} : tensor<32x32xf32>
    // CHECK: pipe.allreduce %{{.*}} : tensor<32x32xf32>
    %r = pipe.allreduce %g : tensor<32x32xf32>
    // CHECK: pipe.allreduce %{{.*}} {reduction = "sum"} : tensor<32x32xf32>
    %s = pipe.allreduce %r {reduction = "sum"} : tensor<32x32xf32>
    return %s : tensor<32x32xf32>
  }
}

// CHECK-LABEL: pipe.stage @stage1
pipe.stage @stage1 attributes {id = 1 : i64} {
  func.func @bwd_input(%w: tensor<32x32xf32>) -> tensor<8x32xf32> {
    // CHECK: pipe.recv from 0 tag 7 : tensor<8x32xf32>
    %x = pipe.recv from 0 tag 7 : tensor<8x32xf32>
    // CHECK: pipe.recompute(%{{.*}}, %{{.*}}) : (tensor<8x32xf32>, tensor<32x32xf32>) -> tensor<8x32xf32>
    %y = pipe.recompute(%x, %w) : (tensor<8x32xf32>, tensor<32x32xf32>) -> tensor<8x32xf32> {
    ^bb0(%a: tensor<8x32xf32>, %b: tensor<32x32xf32>):
      %m = nn.matmul %a, %b : (tensor<8x32xf32>, tensor<32x32xf32>) -> tensor<8x32xf32>
      // CHECK: pipe.yield %{{.*}} : tensor<8x32xf32>
      pipe.yield %m : tensor<8x32xf32>
    }
    return %y : tensor<8x32xf32>
  }
}
