// RUN: pipec-opt %s --pipec-bf16-storage | FileCheck %s
// RUN: pipec-opt %s --pipec-bf16-storage --mlir-print-op-generic | pipec-opt | FileCheck %s --check-prefix=ROUNDTRIP

// The IR the pass writes verifies and prints back.
// ROUNDTRIP: pipe.stage @stage_1

// Stage 0: pooling reads the model's input in bf16 (converted at the
// function's start), sends its bf16 result as it is and receives its
// gradient in bf16.
// CHECK-LABEL: pipe.stage @stage_0
// CHECK: func.func @fwd
// CHECK: %[[X:.*]] = nn.cast %arg0 : tensor<2x4x3x3xf32> -> tensor<2x4x3x3xbf16>
// CHECK: %[[P:.*]] = nn.global_average_pool %[[X]] : (tensor<2x4x3x3xbf16>) -> tensor<2x4x1x1xbf16>
// CHECK: pipe.send %[[P]] to 1 tag 0 {name = "pooled"} : tensor<2x4x1x1xbf16>
// CHECK: func.func @bwd_input
// CHECK: pipe.recv from 1 tag 1 : tensor<2x4x1x1xbf16>
pipe.stage @stage_0 attributes {id = 0 : i64, replicas = 1 : i64} {
  func.func @fwd(%x: tensor<2x4x3x3xf32> {nn.name = "x", nn.role = #nn.role<input>}) {
    %p = nn.global_average_pool %x : (tensor<2x4x3x3xf32>) -> tensor<2x4x1x1xf32>
    pipe.send %p to 1 tag 0 {name = "pooled"} : tensor<2x4x1x1xf32>
    return
  }
  func.func @bwd_input() {
    %g = pipe.recv from 1 tag 1 : tensor<2x4x1x1xf32>
    return
  }
}

// Stage 1: the received activation is bf16; the weight is converted once, at
// the function's start, for the two products that read it; layer norm reads its f32 scale and bias as
// they are and keeps its statistics in f32; saved values keep their storage
// into @bwd_input and @bwd_weight; the loss is f32.
// CHECK-LABEL: pipe.stage @stage_1
// CHECK: func.func @fwd(%arg0: tensor<8x8xf32> {nn.name = "w", nn.role = #nn.role<param>}, %arg1: tensor<8xf32> {nn.name = "g", nn.role = #nn.role<param>}, %arg2: tensor<8xf32> {nn.name = "b", nn.role = #nn.role<param>}, %arg3: tensor<2xi64> {nn.name = "t", nn.role = #nn.role<label>}) -> (tensor<f32> {nn.role = #nn.role<loss>}, tensor<2x8xbf16> {pipe.saved = "h"}, tensor<2x8xbf16> {pipe.saved = "n"}, tensor<2x1xf32> {pipe.saved = "inv"})
// CHECK-NEXT: %[[W:.*]] = nn.cast %arg0 : tensor<8x8xf32> -> tensor<8x8xbf16>
// CHECK-NEXT: %[[X:.*]] = pipe.recv from 0 tag 0 {name = "pooled"} : tensor<2x4x1x1xbf16>
// CHECK: %[[XF:.*]] = nn.flatten %[[X]] {{.*}} -> tensor<2x4xbf16>
// CHECK: %[[XP:.*]] = nn.pad %[[XF]] {{.*}} -> tensor<2x8xbf16>
// CHECK-NEXT: %[[H:.*]] = nn.gemm %[[XP]], %[[W]] {{.*}} -> tensor<2x8xbf16>
// CHECK-NOT: nn.cast %arg0
// CHECK: %[[N:.*]], %{{.*}}, %[[INV:.*]] = nn.layer_norm %[[H]], %arg1, %arg2 : (tensor<2x8xbf16>, tensor<8xf32>, tensor<8xf32>) -> (tensor<2x8xbf16>, tensor<2x1xf32>, tensor<2x1xf32>)
// CHECK: %[[Y:.*]] = nn.gemm %[[N]], %[[W]] {{.*}} -> tensor<2x8xbf16>
// CHECK: %[[LOSS:.*]], %{{.*}} = nn.softmax_cross_entropy_loss %[[Y]], %arg3 : (tensor<2x8xbf16>, tensor<2xi64>) -> (tensor<f32>, tensor<2x8xbf16>)
// CHECK: return %[[LOSS]], %[[H]], %[[N]], %[[INV]] : tensor<f32>, tensor<2x8xbf16>, tensor<2x8xbf16>, tensor<2x1xf32>
//
// In @bwd_input the saved arguments arrive in bf16; a pipe.fused loop reads
// bf16 and f32 inputs and stores bf16; the gradient sent back is bf16.
// CHECK: func.func @bwd_input(%arg0: tensor<2x8xbf16> {pipe.saved = "h"}, %arg1: tensor<2x8xbf16> {pipe.saved = "n"}, %arg2: tensor<2x8xf32> {nn.name = "d", nn.role = #nn.role<input>}) -> (tensor<2x8xbf16> {pipe.saved = "dh"})
// CHECK: %[[S:.*]] = pipe.fused(%arg0, %arg2) : (tensor<2x8xbf16>, tensor<2x8xf32>) -> tensor<2x8xbf16> {
// CHECK-NEXT: ^bb0(%{{.*}}: tensor<2x8xf32>, %{{.*}}: tensor<2x8xf32>):
// CHECK: pipe.yield %{{.*}} : tensor<2x8xf32>
// CHECK: pipe.send %{{.*}} to 0 tag 1 : tensor<2x4x1x1xbf16>
// CHECK: return %[[S]] : tensor<2x8xbf16>
//
// In @bwd_weight the weight gradient is computed from bf16 operands straight
// into f32 (it is returned), the bias gradient's sum is f32, a fused loop
// whose only use is a returned gradient stores f32, and a reduction and an
// embedding's gradient read an f32 operand as it is (never rounded to bf16
// on its way into a gradient).
// CHECK: func.func @bwd_weight(%arg0: tensor<2x8xbf16> {pipe.saved = "h"}, %arg1: tensor<2x8xbf16> {pipe.saved = "dh"}, %arg2: tensor<2x8xf32> {nn.name = "d", nn.role = #nn.role<input>}, %arg3: tensor<2xi64> {nn.name = "t", nn.role = #nn.role<label>}) -> (tensor<8x8xf32> {nn.role = #nn.role<grad>}, tensor<1x8xf32> {nn.role = #nn.role<grad>}, tensor<2x8xf32> {nn.role = #nn.role<grad>}, tensor<4x8xf32> {nn.role = #nn.role<grad>})
// CHECK: %[[DW:.*]] = nn.gemm %arg0, %arg1 {transA = true} : (tensor<2x8xbf16>, tensor<2x8xbf16>) -> tensor<8x8xf32>
// CHECK: %[[DB:.*]] = nn.reduce_sum %arg1 {axes = array<i64: 0>} : (tensor<2x8xbf16>) -> tensor<1x8xf32>
// CHECK: %[[F:.*]] = pipe.fused(%arg0, %arg1) : (tensor<2x8xbf16>, tensor<2x8xbf16>) -> tensor<2x8xf32>
// CHECK-NOT: nn.cast
// CHECK: %[[S:.*]] = nn.reduce_sum %arg2 {axes = array<i64: 0>} : (tensor<2x8xf32>) -> tensor<1x8xf32>
// CHECK: %[[E:.*]] = nn.gather_grad %arg2, %arg3 : (tensor<2x8xf32>, tensor<2xi64>) -> tensor<4x8xf32>
// CHECK: return %[[DW]], %[[DB]], %[[F]], %[[E]]
pipe.stage @stage_1 attributes {id = 1 : i64, replicas = 1 : i64} {
  func.func @fwd(%w: tensor<8x8xf32> {nn.name = "w", nn.role = #nn.role<param>},
                 %g: tensor<8xf32> {nn.name = "g", nn.role = #nn.role<param>},
                 %b: tensor<8xf32> {nn.name = "b", nn.role = #nn.role<param>},
                 %t: tensor<2xi64> {nn.name = "t", nn.role = #nn.role<label>})
      -> (tensor<f32> {nn.role = #nn.role<loss>}, tensor<2x8xf32> {pipe.saved = "h"},
          tensor<2x8xf32> {pipe.saved = "n"}, tensor<2x1xf32> {pipe.saved = "inv"}) {
    %x = pipe.recv from 0 tag 0 {name = "pooled"} : tensor<2x4x1x1xf32>
    %xf = nn.flatten %x {axis = 1 : i64} : (tensor<2x4x1x1xf32>) -> tensor<2x4xf32>
    %xp = nn.pad %xf {pads = array<i64: 0, 0, 0, 4>} : (tensor<2x4xf32>) -> tensor<2x8xf32>
    %h = nn.gemm %xp, %w : (tensor<2x8xf32>, tensor<8x8xf32>) -> tensor<2x8xf32>
    %n, %mean, %inv = nn.layer_norm %h, %g, %b : (tensor<2x8xf32>, tensor<8xf32>, tensor<8xf32>) -> (tensor<2x8xf32>, tensor<2x1xf32>, tensor<2x1xf32>)
    %y = nn.gemm %n, %w : (tensor<2x8xf32>, tensor<8x8xf32>) -> tensor<2x8xf32>
    %loss, %lp = nn.softmax_cross_entropy_loss %y, %t : (tensor<2x8xf32>, tensor<2xi64>) -> (tensor<f32>, tensor<2x8xf32>)
    return %loss, %h, %n, %inv : tensor<f32>, tensor<2x8xf32>, tensor<2x8xf32>, tensor<2x1xf32>
  }
  func.func @bwd_input(%h: tensor<2x8xf32> {pipe.saved = "h"}, %n: tensor<2x8xf32> {pipe.saved = "n"},
                       %d: tensor<2x8xf32> {nn.name = "d", nn.role = #nn.role<input>})
      -> (tensor<2x8xf32> {pipe.saved = "dh"}) {
    %s = pipe.fused(%h, %d) : (tensor<2x8xf32>, tensor<2x8xf32>) -> tensor<2x8xf32> {
    ^bb0(%a: tensor<2x8xf32>, %c: tensor<2x8xf32>):
      %m = nn.mul %a, %c : (tensor<2x8xf32>, tensor<2x8xf32>) -> tensor<2x8xf32>
      pipe.yield %m : tensor<2x8xf32>
    }
    %back = nn.reshape %n : tensor<2x8xf32> -> tensor<2x4x2xf32>
    %sl = nn.slice %back {starts = array<i64: 0, 0, 0>, ends = array<i64: 2, 4, 1>, steps = array<i64: 1, 1, 1>} : (tensor<2x4x2xf32>) -> tensor<2x4x1xf32>
    %gx = nn.reshape %sl : tensor<2x4x1xf32> -> tensor<2x4x1x1xf32>
    pipe.send %gx to 0 tag 1 : tensor<2x4x1x1xf32>
    return %s : tensor<2x8xf32>
  }
  func.func @bwd_weight(%h: tensor<2x8xf32> {pipe.saved = "h"}, %dh: tensor<2x8xf32> {pipe.saved = "dh"},
                        %d: tensor<2x8xf32> {nn.name = "d", nn.role = #nn.role<input>},
                        %t: tensor<2xi64> {nn.name = "t", nn.role = #nn.role<label>})
      -> (tensor<8x8xf32> {nn.role = #nn.role<grad>}, tensor<1x8xf32> {nn.role = #nn.role<grad>},
          tensor<2x8xf32> {nn.role = #nn.role<grad>}, tensor<4x8xf32> {nn.role = #nn.role<grad>}) {
    %dw = nn.gemm %h, %dh {transA = true} : (tensor<2x8xf32>, tensor<2x8xf32>) -> tensor<8x8xf32>
    %db = nn.reduce_sum %dh {axes = array<i64: 0>} : (tensor<2x8xf32>) -> tensor<1x8xf32>
    %f = pipe.fused(%h, %dh) : (tensor<2x8xf32>, tensor<2x8xf32>) -> tensor<2x8xf32> {
    ^bb0(%a: tensor<2x8xf32>, %c: tensor<2x8xf32>):
      %m = nn.add %a, %c : (tensor<2x8xf32>, tensor<2x8xf32>) -> tensor<2x8xf32>
      pipe.yield %m : tensor<2x8xf32>
    }
    %s = nn.reduce_sum %d {axes = array<i64: 0>} : (tensor<2x8xf32>) -> tensor<1x8xf32>
    %e = nn.gather_grad %d, %t : (tensor<2x8xf32>, tensor<2xi64>) -> tensor<4x8xf32>
    return %dw, %db, %f, %e : tensor<8x8xf32>, tensor<1x8xf32>, tensor<2x8xf32>, tensor<4x8xf32>
  }
}

// A GEMM's C is read in its result's storage: a bf16 product's bias
// parameter is converted with the function's other parameters at its start
// (one launch, not one per call of the product) and a bf16 activation added
// as C is read as it is; a weight gradient accumulating into its f32
// buffer keeps C in f32.
// CHECK-LABEL: pipe.stage @stage_2
// CHECK: func.func @fwd
// CHECK-DAG: %[[W:.*]] = nn.cast %arg0 : tensor<8x8xf32> -> tensor<8x8xbf16>
// CHECK-DAG: %[[B:.*]] = nn.cast %arg1 : tensor<8xf32> -> tensor<8xbf16>
// CHECK: %[[X:.*]] = pipe.recv from 0 tag 0 : tensor<2x8xbf16>
// CHECK: %[[H:.*]] = nn.gemm %[[X]], %[[W]], %[[B]] : (tensor<2x8xbf16>, tensor<8x8xbf16>, tensor<8xbf16>) -> tensor<2x8xbf16>
// CHECK: %[[R:.*]] = nn.gemm %[[H]], %[[W]], %[[X]] : (tensor<2x8xbf16>, tensor<8x8xbf16>, tensor<2x8xbf16>) -> tensor<2x8xbf16>
// CHECK: func.func @bwd_weight
// CHECK-NOT: nn.cast %arg2
// CHECK: nn.gemm %{{.*}}, %{{.*}}, %arg2 {transA = true} : (tensor<2x8xbf16>, tensor<2x8xbf16>, tensor<8x8xf32>) -> tensor<8x8xf32>
pipe.stage @stage_2 attributes {id = 2 : i64, replicas = 1 : i64} {
  func.func @fwd(%w: tensor<8x8xf32> {nn.name = "w2", nn.role = #nn.role<param>},
                 %b: tensor<8xf32> {nn.name = "b2", nn.role = #nn.role<param>})
      -> (tensor<2x8xf32> {pipe.saved = "r"}) {
    %x = pipe.recv from 0 tag 0 : tensor<2x8xf32>
    %h = nn.gemm %x, %w, %b : (tensor<2x8xf32>, tensor<8x8xf32>, tensor<8xf32>) -> tensor<2x8xf32>
    %r = nn.gemm %h, %w, %x {beta = 1.0 : f32} : (tensor<2x8xf32>, tensor<8x8xf32>, tensor<2x8xf32>) -> tensor<2x8xf32>
    return %r : tensor<2x8xf32>
  }
  func.func @bwd_weight(%h: tensor<2x8xf32> {pipe.saved = "h2"}, %dh: tensor<2x8xf32> {pipe.saved = "dh2"},
                        %acc: tensor<8x8xf32> {nn.name = "w2.grad", nn.role = #nn.role<input>})
      -> (tensor<8x8xf32> {nn.role = #nn.role<grad>}) {
    %dw = nn.gemm %h, %dh, %acc {transA = true, beta = 1.0 : f32} : (tensor<2x8xf32>, tensor<2x8xf32>, tensor<8x8xf32>) -> tensor<8x8xf32>
    return %dw : tensor<8x8xf32>
  }
}

// A convolutional block: convolution, batch norm and pooling are bf16
// kernels, so the activations between them are bf16 with no conversion;
// the convolution's weight is converted at the start, its bias, the norm's
// scale, bias and running statistics are read in f32, the new running
// statistics and every parameter gradient (the convolution's weight
// gradient, the norm's scale and bias gradients) are f32.
// CHECK-LABEL: pipe.stage @stage_3
// CHECK: func.func @fwd
// CHECK: %[[W:.*]] = nn.cast %arg0 : tensor<4x4x3x3xf32> -> tensor<4x4x3x3xbf16>
// CHECK-NOT: nn.cast
// CHECK: %[[X:.*]] = pipe.recv from 0 tag 0 : tensor<2x4x6x6xbf16>
// CHECK: %[[C:.*]] = nn.conv %[[X]], %[[W]], %arg1 {{.*}} : (tensor<2x4x6x6xbf16>, tensor<4x4x3x3xbf16>, tensor<4xf32>) -> tensor<2x4x6x6xbf16>
// CHECK: nn.batch_norm %[[C]], %arg2, %arg3, %arg4, %arg5 {{.*}} : (tensor<2x4x6x6xbf16>, tensor<4xf32>, tensor<4xf32>, tensor<4xf32>, tensor<4xf32>) -> (tensor<2x4x6x6xbf16>, tensor<4xf32>, tensor<4xf32>)
// CHECK: nn.relu %{{.*}} : tensor<2x4x6x6xbf16>
// CHECK: nn.max_pool {{.*}} : (tensor<2x4x6x6xbf16>) -> tensor<2x4x3x3xbf16>
// CHECK-NOT: nn.cast
// CHECK: return
// CHECK: func.func @bwd_weight
// CHECK: nn.conv_weight_grad {{.*}} : (tensor<2x4x6x6xbf16>, tensor<2x4x6x6xbf16>) -> tensor<4x4x3x3xf32>
// CHECK: nn.batch_norm_param_grad {{.*}} : (tensor<2x4x6x6xbf16>, tensor<2x4x6x6xbf16>, tensor<4xf32>, tensor<4xf32>) -> (tensor<4xf32>, tensor<4xf32>)
pipe.stage @stage_3 attributes {id = 3 : i64, replicas = 1 : i64} {
  func.func @fwd(%w: tensor<4x4x3x3xf32> {nn.name = "w3", nn.role = #nn.role<param>},
                 %b: tensor<4xf32> {nn.name = "b3", nn.role = #nn.role<param>},
                 %s: tensor<4xf32> {nn.name = "s3", nn.role = #nn.role<param>},
                 %t: tensor<4xf32> {nn.name = "t3", nn.role = #nn.role<param>},
                 %m: tensor<4xf32> {nn.name = "m3", nn.role = #nn.role<buffer>},
                 %v: tensor<4xf32> {nn.name = "v3", nn.role = #nn.role<buffer>})
      -> (tensor<2x4x6x6xf32> {pipe.saved = "c3"}, tensor<4xf32>, tensor<4xf32>) {
    %x = pipe.recv from 0 tag 0 : tensor<2x4x6x6xf32>
    %c = nn.conv %x, %w, %b {strides = array<i64: 1, 1>, pads = array<i64: 1, 1, 1, 1>, dilations = array<i64: 1, 1>} : (tensor<2x4x6x6xf32>, tensor<4x4x3x3xf32>, tensor<4xf32>) -> tensor<2x4x6x6xf32>
    %n:3 = nn.batch_norm %c, %s, %t, %m, %v {training = true} : (tensor<2x4x6x6xf32>, tensor<4xf32>, tensor<4xf32>, tensor<4xf32>, tensor<4xf32>) -> (tensor<2x4x6x6xf32>, tensor<4xf32>, tensor<4xf32>)
    %r = nn.relu %n#0 : tensor<2x4x6x6xf32>
    %p = nn.max_pool %r {kernel_shape = array<i64: 2, 2>, strides = array<i64: 2, 2>, pads = array<i64: 0, 0, 0, 0>, dilations = array<i64: 1, 1>} : (tensor<2x4x6x6xf32>) -> tensor<2x4x3x3xf32>
    pipe.send %p to 4 tag 0 : tensor<2x4x3x3xf32>
    return %c, %n#1, %n#2 : tensor<2x4x6x6xf32>, tensor<4xf32>, tensor<4xf32>
  }
  func.func @bwd_weight(%c: tensor<2x4x6x6xf32> {pipe.saved = "c3"}, %dn: tensor<2x4x6x6xf32> {pipe.saved = "dn3"},
                        %x: tensor<2x4x6x6xf32> {pipe.saved = "x3"}, %dc: tensor<2x4x6x6xf32> {pipe.saved = "dc3"},
                        %m: tensor<4xf32> {nn.name = "m3", nn.role = #nn.role<buffer>},
                        %v: tensor<4xf32> {nn.name = "v3", nn.role = #nn.role<buffer>})
      -> (tensor<4x4x3x3xf32> {nn.role = #nn.role<grad>}, tensor<4xf32> {nn.role = #nn.role<grad>},
          tensor<4xf32> {nn.role = #nn.role<grad>}) {
    %dw = nn.conv_weight_grad %dc, %x {strides = array<i64: 1, 1>, pads = array<i64: 1, 1, 1, 1>, dilations = array<i64: 1, 1>} : (tensor<2x4x6x6xf32>, tensor<2x4x6x6xf32>) -> tensor<4x4x3x3xf32>
    %ds, %dt = nn.batch_norm_param_grad %dn, %c, %m, %v {training = true} : (tensor<2x4x6x6xf32>, tensor<2x4x6x6xf32>, tensor<4xf32>, tensor<4xf32>) -> (tensor<4xf32>, tensor<4xf32>)
    return %dw, %ds, %dt : tensor<4x4x3x3xf32>, tensor<4xf32>, tensor<4xf32>
  }
}

// pipec-pad-classes' vocabulary: the padded weight pads the parameter's
// bf16 copy (converted at the start), the padded logits and their gradient
// are bf16, and the weight gradient of the padded product stays f32 through
// the slice of its real rows and the add of the embedding's gradient. The
// bias constant moves to the start, and its bf16 copy is made with the
// arguments' (one launch).
// CHECK-LABEL: pipe.stage @stage_6
// CHECK: func.func @fwd
// CHECK-NEXT: %[[C:.*]] = nn.constant
// CHECK-NEXT: %[[W:.*]] = nn.cast %arg0 : tensor<5x8xf32> -> tensor<5x8xbf16>
// CHECK-NEXT: nn.cast %arg1
// CHECK-NEXT: nn.cast %[[C]] : tensor<8xf32> -> tensor<8xbf16>
// CHECK-NEXT: %[[P:.*]] = nn.pad %[[W]] {pads = array<i64: 0, 0, 3, 0>} : (tensor<5x8xbf16>) -> tensor<8x8xbf16>
// CHECK: nn.gemm %{{.*}}, %[[P]], %{{.*}} {transB = true} : (tensor<4x8xbf16>, tensor<8x8xbf16>, tensor<8xbf16>) -> tensor<4x8xbf16>
// CHECK: func.func @bwd_weight
// CHECK: %[[G:.*]] = nn.gemm {{.*}} : (tensor<4x8xbf16>, tensor<4x8xbf16>) -> tensor<8x8xf32>
// CHECK: %[[S:.*]] = nn.slice %[[G]] {{.*}} : (tensor<8x8xf32>) -> tensor<5x8xf32>
// CHECK: nn.add %[[S]], %{{.*}} : (tensor<5x8xf32>, tensor<5x8xf32>) -> tensor<5x8xf32>
pipe.stage @stage_6 attributes {id = 6 : i64, replicas = 1 : i64} {
  func.func @fwd(%w: tensor<5x8xf32> {nn.name = "w6", nn.role = #nn.role<param>}, %x: tensor<4x8xf32> {nn.name = "x6", nn.role = #nn.role<input>},
                 %l: tensor<4xi64> {nn.name = "l6", nn.role = #nn.role<label>})
      -> (tensor<f32> {nn.role = #nn.role<loss>}, tensor<4x8xf32> {pipe.saved = "logits6"}, tensor<4x8xf32> {pipe.saved = "x6"}) {
    %p = nn.pad %w {pads = array<i64: 0, 0, 3, 0>} : (tensor<5x8xf32>) -> tensor<8x8xf32>
    %c = nn.constant dense<[0.0, 0.0, 0.0, 0.0, 0.0, 0xFF800000, 0xFF800000, 0xFF800000]> : tensor<8xf32>
    %y = nn.gemm %x, %p, %c {transB = true} : (tensor<4x8xf32>, tensor<8x8xf32>, tensor<8xf32>) -> tensor<4x8xf32>
    %loss, %lp = nn.softmax_cross_entropy_loss %y, %l {classes = 5 : i64} : (tensor<4x8xf32>, tensor<4xi64>) -> (tensor<f32>, tensor<4x8xf32>)
    return %loss, %y, %x : tensor<f32>, tensor<4x8xf32>, tensor<4x8xf32>
  }
  func.func @bwd_weight(%dy: tensor<4x8xf32> {pipe.saved = "dlogits6"}, %x: tensor<4x8xf32> {pipe.saved = "x6"},
                        %e: tensor<5x8xf32> {pipe.saved = "embedding6"})
      -> (tensor<5x8xf32> {nn.role = #nn.role<grad>}) {
    %g = nn.gemm %dy, %x {transA = true} : (tensor<4x8xf32>, tensor<4x8xf32>) -> tensor<8x8xf32>
    %s = nn.slice %g {starts = array<i64: 0, 0>, ends = array<i64: 5, 8>, steps = array<i64: 1, 1>} : (tensor<8x8xf32>) -> tensor<5x8xf32>
    %r = nn.add %s, %e : (tensor<5x8xf32>, tensor<5x8xf32>) -> tensor<5x8xf32>
    return %r : tensor<5x8xf32>
  }
}
