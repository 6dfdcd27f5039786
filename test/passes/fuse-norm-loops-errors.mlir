// RUN: not pipec-opt %s --pipec-plan-memory=target=cuda 2>&1 | FileCheck %s

// A loop marked to run in a norm's kernel (pipec-fuse-norm-loops) whose norm
// is not next to it cannot be planned as one kernel: the plan refuses it
// rather than place the pair's values apart.
pipe.stage @stage_0 attributes {id = 0 : i64, replicas = 1 : i64} {
  // CHECK: error: 'pipe.fused' op is marked to run in a norm's kernel, but the norm is not next to it (pipec-fuse-norm-loops)
  func.func @fwd(%x: tensor<4x16xf32>, %g: tensor<16xf32>) -> (tensor<4x16xf32>, tensor<4x16xf32>) {
    %s = pipe.fused(%x) attributes {pipe.norm_prologue} : (tensor<4x16xf32>) -> tensor<4x16xf32> {
    ^bb0(%p: tensor<4x16xf32>):
      %r = nn.relu %p : tensor<4x16xf32>
      pipe.yield %r : tensor<4x16xf32>
    }
    %a = nn.relu %x : tensor<4x16xf32>
    %n, %mean, %inv = nn.layer_norm %s, %g : (tensor<4x16xf32>, tensor<16xf32>) -> (tensor<4x16xf32>, tensor<4x1xf32>, tensor<4x1xf32>)
    return %a, %n : tensor<4x16xf32>, tensor<4x16xf32>
  }
}
