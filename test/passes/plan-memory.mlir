// RUN: pipec-opt %s --pipec-plan-memory | FileCheck %s --check-prefixes=CHECK,CPU
// RUN: pipec-opt %s --pipec-plan-memory=target=cuda | FileCheck %s --check-prefix=CUDA
// RUN: not pipec-opt %s --pipec-plan-memory=target=gpu 2>&1 | FileCheck %s --check-prefix=BAD
// BAD: error: pipec-plan-memory: target=gpu: expected cpu or cuda

pipe.stage @stage_0 attributes {id = 0 : i64, replicas = 1 : i64} {
  // %a dies at %b's op; %c, computed after, reuses its bytes. %h is
  // returned as pipe.saved: it is computed into its workspace slot.
  // CHECK-LABEL: func.func @fwd
  // CHECK-SAME: pipe.arena_size = 512 : i64
  // CHECK: nn.relu %arg0 {pipe.storage = [#pipe.storage<arena, 0>]}
  // CHECK: nn.relu %{{.*}} {pipe.storage = [#pipe.storage<arena, 256>]}
  // CHECK: nn.relu %{{.*}} {pipe.storage = [#pipe.storage<arena, 0>]}
  // CHECK: nn.gemm %{{.*}}, %arg1 {pipe.storage = [#pipe.storage<saved, 0>]}
  func.func @fwd(%x: tensor<4x16xf32> {nn.name = "x", nn.role = #nn.role<input>},
                 %w: tensor<16x16xf32> {nn.name = "w", nn.role = #nn.role<param>})
      -> (tensor<4x16xf32> {pipe.saved = "h"}) {
    %a = nn.relu %x : tensor<4x16xf32>
    %b = nn.relu %a : tensor<4x16xf32>
    %c = nn.relu %b : tensor<4x16xf32>
    %h = nn.gemm %c, %w : (tensor<4x16xf32>, tensor<16x16xf32>) -> tensor<4x16xf32>
    return %h : tensor<4x16xf32>
  }

  // A returned view is saved in place too: the GEMM whose rows it reshapes
  // is computed into the view's slot (result 1). A second saved result of
  // the same storage (result 2) shares that slot.
  // CHECK-LABEL: func.func @fwd_views
  // CHECK-SAME: {pipe.saved = "rows"}
  // CHECK-SAME: {pipe.saved = "flat", pipe.saved_slot_of = 1 : i64}
  // CHECK: nn.relu %arg0 {pipe.storage = [#pipe.storage<arena, 0>]}
  // CHECK: nn.gemm %{{.*}}, %arg1 {pipe.storage = [#pipe.storage<saved, 1>]}
  func.func @fwd_views(%x: tensor<4x16xf32> {nn.name = "x", nn.role = #nn.role<input>},
                       %w: tensor<16x16xf32> {nn.name = "w", nn.role = #nn.role<param>})
      -> (tensor<4x16xf32>, tensor<2x2x16xf32> {pipe.saved = "rows"}, tensor<64xf32> {pipe.saved = "flat"}) {
    %a = nn.relu %x : tensor<4x16xf32>
    %h = nn.gemm %a, %w : (tensor<4x16xf32>, tensor<16x16xf32>) -> tensor<4x16xf32>
    %v = nn.reshape %h : tensor<4x16xf32> -> tensor<2x2x16xf32>
    %f = nn.reshape %h : tensor<4x16xf32> -> tensor<64xf32>
    return %a, %v, %f : tensor<4x16xf32>, tensor<2x2x16xf32>, tensor<64xf32>
  }

  // A view keeps its source alive (here to the end: it is returned); an
  // op's result never shares bytes with its operands (%c and %b), and a
  // result nobody reads still gets bytes.
  // CHECK-LABEL: func.func @bwd_input
  // CHECK-SAME: pipe.arena_size = 768 : i64
  // CHECK: nn.relu %arg0 {pipe.storage = [#pipe.storage<arena, 0>]}
  // CHECK-NEXT: nn.reshape
  // CHECK-NOT: pipe.storage
  // CHECK-SAME: -> tensor<64xf32>
  // CHECK-NEXT: nn.relu %arg0 {pipe.storage = [#pipe.storage<arena, 256>]}
  // CHECK-NEXT: nn.relu %{{.*}} {pipe.storage = [#pipe.storage<arena, 512>]}
  func.func @bwd_input(%x: tensor<4x16xf32>) -> tensor<64xf32> {
    %a = nn.relu %x : tensor<4x16xf32>
    %v = nn.reshape %a : tensor<4x16xf32> -> tensor<64xf32>
    %b = nn.relu %x : tensor<4x16xf32>
    %c = nn.relu %b : tensor<4x16xf32>
    return %v : tensor<64xf32>
  }

  // A C-less GEMM returned as a parameter's gradient accumulates into the
  // gradient buffer (result 0), and so does the bias gradient (a reduction,
  // result 1): only the reduction's scratch (16 double sums, 128 bytes) is
  // in the arena.
  // CHECK-LABEL: func.func @bwd_weight
  // CHECK-SAME: pipe.arena_size = 128 : i64
  // CHECK: nn.gemm %arg0, %arg1 {pipe.storage = [#pipe.storage<gradient, 0>], transA = true}
  // CHECK: nn.reduce_sum %arg0 {axes = array<i64: 0>, keepdims = false, pipe.scratch = array<i64: 0, 128>, pipe.storage = [#pipe.storage<gradient, 1>]}
  func.func @bwd_weight(%dy: tensor<4x16xf32> {pipe.saved = "dy"}, %h: tensor<4x16xf32> {pipe.saved = "h"})
      -> (tensor<16x16xf32> {nn.name = "w", nn.role = #nn.role<grad>},
          tensor<16xf32> {nn.name = "b", nn.role = #nn.role<grad>}) {
    %dw = nn.gemm %dy, %h {transA = true} : (tensor<4x16xf32>, tensor<4x16xf32>) -> tensor<16x16xf32>
    %db = nn.reduce_sum %dy {axes = array<i64: 0>, keepdims = false} : (tensor<4x16xf32>) -> tensor<16xf32>
    return %dw, %db : tensor<16x16xf32>, tensor<16xf32>
  }

  // Through a view, and both results of a layer-norm parameter gradient;
  // not a gradient read by anything else (the reduction kept in the arena),
  // nor one of the layer norm's results alone (both stay in the arena).
  // CHECK-LABEL: func.func @bwd_weight_views
  // CHECK: nn.reduce_sum %arg0 {{.*}}pipe.storage = [#pipe.storage<gradient, 0>]
  // CHECK: nn.layer_norm_param_grad {{.*}}pipe.storage = [#pipe.storage<gradient, 1>, #pipe.storage<gradient, 2>]
  // CHECK: nn.reduce_sum %arg0 {{.*}}pipe.storage = [#pipe.storage<arena,
  // CHECK: nn.layer_norm_param_grad {{.*}}pipe.storage = [#pipe.storage<arena, {{[0-9]+}}>, #pipe.storage<arena,
  func.func @bwd_weight_views(%dy: tensor<4x16xf32> {pipe.saved = "dy"}, %x: tensor<4x16xf32> {pipe.saved = "x"})
      -> (tensor<1x16xf32> {nn.name = "b", nn.role = #nn.role<grad>},
          tensor<16xf32> {nn.name = "g", nn.role = #nn.role<grad>}, tensor<16xf32> {nn.name = "beta", nn.role = #nn.role<grad>},
          tensor<16xf32> {nn.name = "b2", nn.role = #nn.role<grad>}, tensor<16xf32> {nn.name = "c", nn.role = #nn.role<grad>},
          tensor<16xf32> {nn.name = "g2", nn.role = #nn.role<grad>}) {
    %db = nn.reduce_sum %dy {axes = array<i64: 0>, keepdims = false} : (tensor<4x16xf32>) -> tensor<16xf32>
    %dbv = nn.reshape %db : tensor<16xf32> -> tensor<1x16xf32>
    %dg, %dbeta = nn.layer_norm_param_grad %dy, %x {axis = 1 : i64, epsilon = 1.0e-05 : f32} : (tensor<4x16xf32>, tensor<4x16xf32>) -> (tensor<16xf32>, tensor<16xf32>)
    %db2 = nn.reduce_sum %dy {axes = array<i64: 0>, keepdims = false} : (tensor<4x16xf32>) -> tensor<16xf32>
    %twice = nn.add %db2, %db2 : (tensor<16xf32>, tensor<16xf32>) -> tensor<16xf32>
    %dg2, %unused = nn.layer_norm_param_grad %dy, %x {axis = 1 : i64, epsilon = 1.0e-05 : f32} : (tensor<4x16xf32>, tensor<4x16xf32>) -> (tensor<16xf32>, tensor<16xf32>)
    return %dbv, %dg, %dbeta, %twice, %db2, %dg2 : tensor<1x16xf32>, tensor<16xf32>, tensor<16xf32>, tensor<16xf32>, tensor<16xf32>, tensor<16xf32>
  }

  // A batch norm's new running statistics, returned as the updates of the
  // buffers it reads, are written in place into those buffers (storage
  // `buffer`, the index of the result that returns them); a running mean
  // also read elsewhere (%m2 by the add) keeps its update in the arena.
  // Both parameter gradients of a batch norm add into their buffers.
  // CHECK-LABEL: func.func @bwd_weight_batch_norm
  // CHECK: nn.batch_norm_param_grad {{.*}}pipe.storage = [#pipe.storage<gradient, 0>, #pipe.storage<gradient, 1>]
  func.func @bwd_weight_batch_norm(%dy: tensor<2x4x3x3xf32> {pipe.saved = "dy"}, %x: tensor<2x4x3x3xf32> {pipe.saved = "x"},
                                   %m: tensor<4xf32> {nn.name = "m", nn.role = #nn.role<buffer>},
                                   %v: tensor<4xf32> {nn.name = "v", nn.role = #nn.role<buffer>})
      -> (tensor<4xf32> {nn.name = "g", nn.role = #nn.role<grad>}, tensor<4xf32> {nn.name = "b", nn.role = #nn.role<grad>}) {
    %dg, %db = nn.batch_norm_param_grad %dy, %x, %m, %v {training = true} : (tensor<2x4x3x3xf32>, tensor<2x4x3x3xf32>, tensor<4xf32>, tensor<4xf32>) -> (tensor<4xf32>, tensor<4xf32>)
    return %dg, %db : tensor<4xf32>, tensor<4xf32>
  }

  // A convolution's weight gradient returned as the parameter's gradient
  // adds into its buffer; on the CPU its scratch then holds the sum too
  // (128 bytes where the one kept in the arena, also read by the add,
  // needs 64: one slice's partial sums).
  // CHECK-LABEL: func.func @bwd_weight_conv
  // CPU: nn.conv_weight_grad %arg0, %arg1 {{.*}}pipe.scratch = array<i64: {{[0-9]+}}, 128>, pipe.storage = [#pipe.storage<gradient, 0>]
  // CUDA: nn.conv_weight_grad %arg0, %arg1 {{.*}}pipe.storage = [#pipe.storage<gradient, 0>]
  // CPU: nn.conv_weight_grad %arg0, %arg1 {{.*}}pipe.scratch = array<i64: {{[0-9]+}}, 64>, pipe.storage = [#pipe.storage<arena,
  // CUDA: nn.conv_weight_grad %arg0, %arg1 {{.*}}pipe.storage = [#pipe.storage<arena,
  func.func @bwd_weight_conv(%dy: tensor<2x4x3x3xf32> {pipe.saved = "dy"}, %x: tensor<2x4x3x3xf32> {pipe.saved = "x"})
      -> (tensor<4x4x1x1xf32> {nn.name = "w", nn.role = #nn.role<grad>}, tensor<4x4x1x1xf32> {nn.name = "u", nn.role = #nn.role<grad>}) {
    %dw = nn.conv_weight_grad %dy, %x {strides = array<i64: 1, 1>, pads = array<i64: 0, 0, 0, 0>, dilations = array<i64: 1, 1>} : (tensor<2x4x3x3xf32>, tensor<2x4x3x3xf32>) -> tensor<4x4x1x1xf32>
    %du = nn.conv_weight_grad %dy, %x {strides = array<i64: 1, 1>, pads = array<i64: 0, 0, 0, 0>, dilations = array<i64: 1, 1>} : (tensor<2x4x3x3xf32>, tensor<2x4x3x3xf32>) -> tensor<4x4x1x1xf32>
    %twice = nn.add %du, %du : (tensor<4x4x1x1xf32>, tensor<4x4x1x1xf32>) -> tensor<4x4x1x1xf32>
    return %dw, %twice : tensor<4x4x1x1xf32>, tensor<4x4x1x1xf32>
  }

  // CHECK-LABEL: func.func @fwd_batch_norm
  // CHECK: nn.batch_norm %arg0, %arg1, %arg2, %arg3, %arg4 {pipe.storage = [#pipe.storage<arena, 0>, #pipe.storage<buffer, 1>, #pipe.storage<buffer, 2>], training = true}
  // CHECK: nn.batch_norm %arg0, %arg1, %arg2, %arg5, %arg6 {pipe.storage = [#pipe.storage<arena, {{[0-9]+}}>, #pipe.storage<arena, {{[0-9]+}}>, #pipe.storage<buffer, 4>], training = true}
  func.func @fwd_batch_norm(%x: tensor<2x4x3x3xf32> {nn.name = "x", nn.role = #nn.role<input>},
                            %g: tensor<4xf32> {nn.name = "g", nn.role = #nn.role<param>},
                            %b: tensor<4xf32> {nn.name = "b", nn.role = #nn.role<param>},
                            %m: tensor<4xf32> {nn.name = "m", nn.role = #nn.role<buffer>},
                            %v: tensor<4xf32> {nn.name = "v", nn.role = #nn.role<buffer>},
                            %m2: tensor<4xf32> {nn.name = "m2", nn.role = #nn.role<buffer>},
                            %v2: tensor<4xf32> {nn.name = "v2", nn.role = #nn.role<buffer>})
      -> (tensor<2x4x3x3xf32>, tensor<4xf32> {nn.name = "m", nn.role = #nn.role<buffer_update>},
          tensor<4xf32> {nn.name = "v", nn.role = #nn.role<buffer_update>},
          tensor<4xf32> {nn.name = "m2", nn.role = #nn.role<buffer_update>},
          tensor<4xf32> {nn.name = "v2", nn.role = #nn.role<buffer_update>}, tensor<4xf32>) {
    %y, %nm, %nv = nn.batch_norm %x, %g, %b, %m, %v {training = true} : (tensor<2x4x3x3xf32>, tensor<4xf32>, tensor<4xf32>, tensor<4xf32>, tensor<4xf32>) -> (tensor<2x4x3x3xf32>, tensor<4xf32>, tensor<4xf32>)
    %y2, %nm2, %nv2 = nn.batch_norm %x, %g, %b, %m2, %v2 {training = true} : (tensor<2x4x3x3xf32>, tensor<4xf32>, tensor<4xf32>, tensor<4xf32>, tensor<4xf32>) -> (tensor<2x4x3x3xf32>, tensor<4xf32>, tensor<4xf32>)
    %s = nn.add %m2, %nm2 : (tensor<4xf32>, tensor<4xf32>) -> tensor<4xf32>
    return %y, %nm, %nv, %nm2, %nv2, %s : tensor<2x4x3x3xf32>, tensor<4xf32>, tensor<4xf32>, tensor<4xf32>, tensor<4xf32>, tensor<4xf32>
  }
}

// A kernel call's scratch is live during the call only: the convolution's
// shares bytes with %a (dead by then), never with its operand %b or its
// result. The CPU runs it as Winograd F(2x2, 3x3): the transformed weights
// [16, F, C] are shared (16 x 1040 floats), each thread's transformed tiles
// and products (2 x 33074 floats) lie after the arena, one part per thread.
// CUDA's im2col of both samples is shared, and nothing is per thread.
pipe.stage @stage_1 attributes {id = 1 : i64, replicas = 1 : i64} {
  // CPU-LABEL: func.func @fwd
  // CPU-SAME: pipe.arena_size = 82944 : i64, pipe.thread_scratch_size = 264704 : i64
  // CPU: nn.relu %arg0 {pipe.storage = [#pipe.storage<arena, 0>]}
  // CPU: nn.relu %{{.*}} {pipe.storage = [#pipe.storage<arena, 66560>]}
  // CPU: nn.conv {{.*}}pipe.scratch = array<i64: 0, 66560>, pipe.storage = [#pipe.storage<arena, 74752>]
  // CUDA-LABEL: pipe.stage @stage_1
  // CUDA: pipe.arena_size = 90112 : i64, pipe.thread_scratch_size = 0 : i64
  // CUDA: nn.relu %arg0 {pipe.storage = [#pipe.storage<arena, 0>]}
  // CUDA: nn.relu %{{.*}} {pipe.storage = [#pipe.storage<arena, 73728>]}
  // CUDA: nn.conv {{.*}}pipe.scratch = array<i64: 0, 73728>, pipe.storage = [#pipe.storage<arena, 81920>]
  func.func @fwd(%x: tensor<2x16x8x8xf32> {nn.name = "x", nn.role = #nn.role<input>},
                 %w: tensor<16x16x3x3xf32> {nn.name = "w", nn.role = #nn.role<param>}) -> tensor<2x16x8x8xf32> {
    %a = nn.relu %x : tensor<2x16x8x8xf32>
    %b = nn.relu %a : tensor<2x16x8x8xf32>
    %y = nn.conv %b, %w {strides = array<i64: 1, 1>, pads = array<i64: 1, 1, 1, 1>, dilations = array<i64: 1, 1>} : (tensor<2x16x8x8xf32>, tensor<16x16x3x3xf32>) -> tensor<2x16x8x8xf32>
    return %y : tensor<2x16x8x8xf32>
  }
}
