// RUN: pipec-opt %s --pipec-recompute-elementwise | FileCheck %s

// A GPT-2 MLP's GELU: @fwd saves its input (the GELU's gradient reads it)
// and its output (the next product's weight gradient reads it). The output
// is no longer saved: @bwd_weight, which did not take the input, now takes
// it and applies the GELU just before the product; @bwd_input already took
// the input and reads the output too, so it recomputes it from that.
// CHECK-LABEL: func.func @fwd
// CHECK-SAME: -> (tensor<4x8xf32>, tensor<4x8xf32> {pipe.saved = "u"})
// CHECK: %[[G:.*]] = nn.gelu %{{.*}} {approximate = "tanh"}
// CHECK: return %{{.*}}, %{{.*}} : tensor<4x8xf32>, tensor<4x8xf32>
// CHECK-LABEL: func.func @bwd_input
// CHECK-SAME: (%[[U:.*]]: tensor<4x8xf32> {pipe.saved = "u"}, %[[DY:.*]]: tensor<4x8xf32> {nn.name = "dy", nn.role = #nn.role<input>})
// CHECK-NEXT: %[[GI:.*]] = nn.gelu %[[U]] {approximate = "tanh"}
// CHECK-NEXT: nn.mul %[[GI]], %[[DY]]
// CHECK-LABEL: func.func @bwd_weight
// CHECK-SAME: (%[[DY2:.*]]: tensor<4x8xf32> {nn.name = "dy", nn.role = #nn.role<input>}, %[[U2:.*]]: tensor<4x8xf32> {pipe.saved = "u"})
// CHECK-NEXT: %[[GW:.*]] = nn.gelu %[[U2]] {approximate = "tanh"}
// CHECK-NEXT: nn.gemm %[[GW]], %[[DY2]] {transA = true}
//
// A saved value whose operand is not saved stays saved.
// CHECK-LABEL: pipe.stage @stage_1
// CHECK: func.func @fwd{{.*}} -> (tensor<4x8xf32> {pipe.saved = "t"})
pipe.stage @stage_0 attributes {id = 0 : i64, replicas = 1 : i64} {
  func.func @fwd(%x: tensor<4x8xf32> {nn.name = "x", nn.role = #nn.role<input>})
      -> (tensor<4x8xf32>, tensor<4x8xf32> {pipe.saved = "u"}, tensor<4x8xf32> {pipe.saved = "g"}) {
    %u = nn.relu %x : tensor<4x8xf32>
    %g = nn.gelu %u {approximate = "tanh"} : tensor<4x8xf32>
    return %g, %u, %g : tensor<4x8xf32>, tensor<4x8xf32>, tensor<4x8xf32>
  }
  func.func @bwd_input(%u: tensor<4x8xf32> {pipe.saved = "u"}, %g: tensor<4x8xf32> {pipe.saved = "g"},
                       %dy: tensor<4x8xf32> {nn.name = "dy", nn.role = #nn.role<input>}) -> tensor<4x8xf32> {
    %p = nn.mul %g, %dy : (tensor<4x8xf32>, tensor<4x8xf32>) -> tensor<4x8xf32>
    %d = nn.unary_grad <gelu_tanh> %p, x = %u : tensor<4x8xf32>
    return %d : tensor<4x8xf32>
  }
  func.func @bwd_weight(%g: tensor<4x8xf32> {pipe.saved = "g"}, %dy: tensor<4x8xf32> {nn.name = "dy", nn.role = #nn.role<input>})
      -> tensor<8x8xf32> {
    %dw = nn.gemm %g, %dy {transA = true} : (tensor<4x8xf32>, tensor<4x8xf32>) -> tensor<8x8xf32>
    return %dw : tensor<8x8xf32>
  }
}
pipe.stage @stage_1 attributes {id = 1 : i64, replicas = 1 : i64} {
  func.func @fwd(%x: tensor<4x8xf32> {nn.name = "x", nn.role = #nn.role<input>}) -> (tensor<4x8xf32> {pipe.saved = "t"}) {
    %t = nn.tanh %x : tensor<4x8xf32>
    return %t : tensor<4x8xf32>
  }
  func.func @bwd_weight(%t: tensor<4x8xf32> {pipe.saved = "t"}) {
    return
  }
}

// Through views, as GPT-2's MLP has them (the GELU reads and writes
// [batch, context, width]; the products read [rows, width]). (An
// element-wise function of the data, the tanh, stays kept.)
// CHECK-LABEL: pipe.stage @stage_2
// CHECK: func.func @fwd{{.*}} -> (tensor<2x16x8xf32> {pipe.saved = "c_fc"})
// CHECK: func.func @bwd_weight(%[[DY3:.*]]: tensor<32x8xf32> {nn.name = "dy", nn.role = #nn.role<input>}, %[[C:.*]]: tensor<2x16x8xf32> {pipe.saved = "c_fc"})
// CHECK-NEXT: %[[G3:.*]] = nn.gelu %[[C]]
// CHECK-NEXT: %[[V3:.*]] = nn.reshape %[[G3]] : tensor<2x16x8xf32> -> tensor<32x8xf32>
// CHECK-NEXT: nn.gemm %[[V3]], %[[DY3]] {transA = true}
pipe.stage @stage_2 attributes {id = 2 : i64, replicas = 1 : i64} {
  func.func @fwd(%x: tensor<32x8xf32> {nn.name = "x", nn.role = #nn.role<input>})
      -> (tensor<2x16x8xf32> {pipe.saved = "c_fc"}, tensor<32x8xf32> {pipe.saved = "proj_in"}) {
    %h = nn.tanh %x : tensor<32x8xf32>
    %r = nn.reshape %h : tensor<32x8xf32> -> tensor<2x16x8xf32>
    %g = nn.gelu %r {approximate = "tanh"} : tensor<2x16x8xf32>
    %v = nn.reshape %g : tensor<2x16x8xf32> -> tensor<32x8xf32>
    return %r, %v : tensor<2x16x8xf32>, tensor<32x8xf32>
  }
  func.func @bwd_weight(%v: tensor<32x8xf32> {pipe.saved = "proj_in"},
                        %dy: tensor<32x8xf32> {nn.name = "dy", nn.role = #nn.role<input>}) -> tensor<8x8xf32> {
    %dw = nn.gemm %v, %dy {transA = true} : (tensor<32x8xf32>, tensor<32x8xf32>) -> tensor<8x8xf32>
    return %dw : tensor<8x8xf32>
  }
}

// A training dropout's mask read only by nn.dropout_grad is drawn again
// there from the dropout's key (its seed here) instead of saved; a mask
// something else reads stays saved.
// CHECK-LABEL: pipe.stage @stage_3
// CHECK: func.func @fwd{{.*}} -> (tensor<4x8xf32>, tensor<4x8xi1> {pipe.saved = "kept"})
// CHECK: func.func @bwd_input(%[[DY4:.*]]: tensor<4x8xf32> {nn.name = "dy", nn.role = #nn.role<input>}, %[[K:.*]]: tensor<4x8xi1> {pipe.saved = "kept"})
// CHECK-NEXT: nn.dropout_grad %[[DY4]] {dropout_op_id = 42 : i64, ratio = 1.000000e-01 : f32, training = true} : (tensor<4x8xf32>) -> tensor<4x8xf32>
// CHECK-NEXT: nn.cast %[[K]]
pipe.stage @stage_3 attributes {id = 3 : i64, replicas = 1 : i64} {
  func.func @fwd(%x: tensor<4x8xf32> {nn.name = "x", nn.role = #nn.role<input>})
      -> (tensor<4x8xf32>, tensor<4x8xi1> {pipe.saved = "mask"}, tensor<4x8xi1> {pipe.saved = "kept"}) {
    %y, %m = nn.dropout %x {ratio = 0.1 : f32, training = true, seed = 42 : i64} : (tensor<4x8xf32>) -> (tensor<4x8xf32>, tensor<4x8xi1>)
    %z, %k = nn.dropout %y {ratio = 0.1 : f32, training = true, seed = 43 : i64} : (tensor<4x8xf32>) -> (tensor<4x8xf32>, tensor<4x8xi1>)
    return %z, %m, %k : tensor<4x8xf32>, tensor<4x8xi1>, tensor<4x8xi1>
  }
  func.func @bwd_input(%m: tensor<4x8xi1> {pipe.saved = "mask"}, %dy: tensor<4x8xf32> {nn.name = "dy", nn.role = #nn.role<input>},
                       %k: tensor<4x8xi1> {pipe.saved = "kept"}) -> (tensor<4x8xf32>, tensor<4x8xf32>) {
    %g = nn.dropout_grad %dy, %m {ratio = 0.1 : f32, training = true} : (tensor<4x8xf32>, tensor<4x8xi1>) -> tensor<4x8xf32>
    %c = nn.cast %k : tensor<4x8xi1> -> tensor<4x8xf32>
    return %g, %c : tensor<4x8xf32>, tensor<4x8xf32>
  }
}

// SwiGLU: silu(g) = g * sigmoid(g) is two ops from one saved value (the
// gate), so @bwd_input computes it again from the gate just before reading
// it; a scaling by a constant is recomputed with its constant. The product
// with the up projection reads two saved values and stays saved.
// CHECK-LABEL: pipe.stage @stage_4
// CHECK: func.func @fwd{{.*}} -> (tensor<4x8xf32>, tensor<4x8xf32> {pipe.saved = "gate"}, tensor<4x8xf32> {pipe.saved = "up"}, tensor<4x8xf32> {pipe.saved = "h"})
// CHECK: func.func @bwd_input(%[[DH:.*]]: tensor<4x8xf32> {nn.name = "dh", nn.role = #nn.role<input>}, %[[UP:.*]]: tensor<4x8xf32> {pipe.saved = "up"}, %[[H:.*]]: tensor<4x8xf32> {pipe.saved = "h"}, %[[GATE:.*]]: tensor<4x8xf32> {pipe.saved = "gate"})
// CHECK-NEXT: %[[SIG:.*]] = nn.sigmoid %[[GATE]]
// CHECK-NEXT: %[[S:.*]] = nn.mul %[[GATE]], %[[SIG]]
// CHECK-NEXT: %[[DU:.*]] = nn.mul %[[DH]], %[[S]]
// CHECK-NEXT: %[[C:.*]] = nn.constant dense<5.000000e-01>
// CHECK-NEXT: %[[Q:.*]] = nn.mul %[[GATE]], %[[C]]
// CHECK-NEXT: nn.add %[[DU]], %[[Q]]
pipe.stage @stage_4 attributes {id = 4 : i64, replicas = 1 : i64} {
  func.func @fwd(%x: tensor<4x8xf32> {nn.name = "x", nn.role = #nn.role<input>}, %y: tensor<4x8xf32> {nn.name = "y", nn.role = #nn.role<input>})
      -> (tensor<4x8xf32>, tensor<4x8xf32> {pipe.saved = "gate"}, tensor<4x8xf32> {pipe.saved = "up"},
          tensor<4x8xf32> {pipe.saved = "silu"}, tensor<4x8xf32> {pipe.saved = "h"}, tensor<4x8xf32> {pipe.saved = "half"}) {
    %g = nn.tanh %x : tensor<4x8xf32>
    %u = nn.tanh %y : tensor<4x8xf32>
    %sig = nn.sigmoid %g : tensor<4x8xf32>
    %s = nn.mul %g, %sig : (tensor<4x8xf32>, tensor<4x8xf32>) -> tensor<4x8xf32>
    %h = nn.mul %s, %u : (tensor<4x8xf32>, tensor<4x8xf32>) -> tensor<4x8xf32>
    %c = nn.constant dense<0.5> : tensor<f32>
    %q = nn.mul %g, %c : (tensor<4x8xf32>, tensor<f32>) -> tensor<4x8xf32>
    return %h, %g, %u, %s, %h, %q : tensor<4x8xf32>, tensor<4x8xf32>, tensor<4x8xf32>, tensor<4x8xf32>, tensor<4x8xf32>, tensor<4x8xf32>
  }
  func.func @bwd_input(%dh: tensor<4x8xf32> {nn.name = "dh", nn.role = #nn.role<input>}, %s: tensor<4x8xf32> {pipe.saved = "silu"},
                       %u: tensor<4x8xf32> {pipe.saved = "up"}, %h: tensor<4x8xf32> {pipe.saved = "h"},
                       %q: tensor<4x8xf32> {pipe.saved = "half"}) -> (tensor<4x8xf32>, tensor<4x8xf32>) {
    %du = nn.mul %dh, %s : (tensor<4x8xf32>, tensor<4x8xf32>) -> tensor<4x8xf32>
    %r = nn.add %du, %q : (tensor<4x8xf32>, tensor<4x8xf32>) -> tensor<4x8xf32>
    %o = nn.mul %u, %h : (tensor<4x8xf32>, tensor<4x8xf32>) -> tensor<4x8xf32>
    return %r, %o : tensor<4x8xf32>, tensor<4x8xf32>
  }
}

// A value computed from a parameter alone (pipec-pad-classes' padded
// weight) is not saved: @bwd_input, which read the saved copy, takes the
// parameter (by its name) and pads it again; @bwd_weight, which already
// took the parameter, reads its own argument.
// CHECK-LABEL: pipe.stage @stage_5
// CHECK: func.func @fwd{{.*}} -> tensor<4x8xf32> attributes
// CHECK: func.func @bwd_input(%[[W:.*]]: tensor<5x8xf32> {nn.name = "w", nn.role = #nn.role<param>}, %[[DY:.*]]: tensor<4x8xf32> {nn.name = "dy", nn.role = #nn.role<input>})
// CHECK-NEXT: %[[P:.*]] = nn.pad %[[W]] {pads = array<i64: 0, 0, 3, 0>}
// CHECK-NEXT: nn.gemm %[[DY]], %[[P]]
// CHECK: func.func @bwd_weight(%[[W2:.*]]: tensor<5x8xf32> {nn.name = "w", nn.role = #nn.role<param>}
// CHECK-NEXT: %[[P2:.*]] = nn.pad %[[W2]] {pads = array<i64: 0, 0, 3, 0>}
// CHECK-NEXT: nn.slice %[[P2]]
pipe.stage @stage_5 attributes {id = 5 : i64, replicas = 1 : i64} {
  func.func @fwd(%x: tensor<4x8xf32> {nn.name = "x", nn.role = #nn.role<input>}, %w: tensor<5x8xf32> {nn.name = "w", nn.role = #nn.role<param>})
      -> (tensor<4x8xf32>, tensor<8x8xf32> {pipe.saved = "padded"}) {
    %p = nn.pad %w {pads = array<i64: 0, 0, 3, 0>} : (tensor<5x8xf32>) -> tensor<8x8xf32>
    %y = nn.gemm %x, %p {transB = true} : (tensor<4x8xf32>, tensor<8x8xf32>) -> tensor<4x8xf32>
    return %y, %p : tensor<4x8xf32>, tensor<8x8xf32>
  }
  func.func @bwd_input(%dy: tensor<4x8xf32> {nn.name = "dy", nn.role = #nn.role<input>}, %p: tensor<8x8xf32> {pipe.saved = "padded"})
      -> tensor<4x8xf32> {
    %dx = nn.gemm %dy, %p : (tensor<4x8xf32>, tensor<8x8xf32>) -> tensor<4x8xf32>
    return %dx : tensor<4x8xf32>
  }
  func.func @bwd_weight(%w: tensor<5x8xf32> {nn.name = "w", nn.role = #nn.role<param>}, %p: tensor<8x8xf32> {pipe.saved = "padded"})
      -> tensor<5x8xf32> {
    %s = nn.slice %p {starts = array<i64: 0, 0>, ends = array<i64: 5, 8>, steps = array<i64: 1, 1>} : (tensor<8x8xf32>) -> tensor<5x8xf32>
    %r = nn.add %s, %w : (tensor<5x8xf32>, tensor<5x8xf32>) -> tensor<5x8xf32>
    return %r : tensor<5x8xf32>
  }
}

// Weights stashed (an asynchronous schedule): @bwd_input reads every
// weight as the version its micro-batch's forward used, through
// pipe.restore, so the padded parameter is padded again from a new
// pipe.restore of it beside the others, not from a parameter argument.
// CHECK-LABEL: pipe.stage @stage_7
// CHECK: func.func @fwd{{.*}} -> tensor<4x8xf32> attributes
// CHECK: func.func @bwd_input(%[[DY:[^:]*]]: tensor<4x8xf32> {nn.name = "dy", nn.role = #nn.role<input>}, %[[MB:[^:]*]]: index {nn.role = #nn.role<microbatch>})
// CHECK-NEXT: %[[W:.*]] = pipe.restore %[[MB]] {name = "w", slots = 2 : i64} : tensor<5x8xf32>
// CHECK-NEXT: %[[U:.*]] = pipe.restore %[[MB]] {name = "u", slots = 2 : i64} : tensor<8x8xf32>
// CHECK-NEXT: %[[P:.*]] = nn.pad %[[W]] {pads = array<i64: 0, 0, 3, 0>}
// CHECK-NEXT: nn.add %[[P]], %[[U]]
pipe.stage @stage_7 attributes {id = 7 : i64, replicas = 1 : i64} {
  func.func @fwd(%x: tensor<4x8xf32> {nn.name = "x", nn.role = #nn.role<input>}, %w: tensor<5x8xf32> {nn.name = "w", nn.role = #nn.role<param>},
                 %u: tensor<8x8xf32> {nn.name = "u", nn.role = #nn.role<param>}, %mb: index {nn.role = #nn.role<microbatch>})
      -> (tensor<4x8xf32>, tensor<8x8xf32> {pipe.saved = "padded7"}) {
    pipe.stash %w for %mb {name = "w", slots = 2 : i64} : tensor<5x8xf32>
    pipe.stash %u for %mb {name = "u", slots = 2 : i64} : tensor<8x8xf32>
    %p = nn.pad %w {pads = array<i64: 0, 0, 3, 0>} : (tensor<5x8xf32>) -> tensor<8x8xf32>
    %a = nn.add %p, %u : (tensor<8x8xf32>, tensor<8x8xf32>) -> tensor<8x8xf32>
    %y = nn.gemm %x, %a {transB = true} : (tensor<4x8xf32>, tensor<8x8xf32>) -> tensor<4x8xf32>
    return %y, %p : tensor<4x8xf32>, tensor<8x8xf32>
  }
  func.func @bwd_input(%dy: tensor<4x8xf32> {nn.name = "dy", nn.role = #nn.role<input>}, %p: tensor<8x8xf32> {pipe.saved = "padded7"},
                       %mb: index {nn.role = #nn.role<microbatch>}) -> tensor<4x8xf32> {
    %u = pipe.restore %mb {name = "u", slots = 2 : i64} : tensor<8x8xf32>
    %a = nn.add %p, %u : (tensor<8x8xf32>, tensor<8x8xf32>) -> tensor<8x8xf32>
    %dx = nn.gemm %dy, %a : (tensor<4x8xf32>, tensor<8x8xf32>) -> tensor<4x8xf32>
    return %dx : tensor<4x8xf32>
  }
}

// A pad of a saved activation (PyTorch's padded average pooling exports a
// Pad before the pooling) is a copy: recomputed from its saved input like
// the element-wise functions.
// CHECK-LABEL: pipe.stage @stage_8
// CHECK: func.func @fwd{{.*}} -> (tensor<2x3x4x4xf32>, tensor<2x3x2x2xf32> {pipe.saved = "x8"})
// CHECK: func.func @bwd_input(%[[DY8:[^:]*]]: {{.*}}, %[[X8:[^:]*]]: tensor<2x3x2x2xf32> {pipe.saved = "x8"})
// CHECK-NEXT: %[[P8:.*]] = nn.pad %[[X8]]
// CHECK-NEXT: nn.mul %[[DY8]], %[[P8]]
pipe.stage @stage_8 attributes {id = 8 : i64, replicas = 1 : i64} {
  func.func @fwd(%x: tensor<2x3x2x2xf32> {nn.name = "x8", nn.role = #nn.role<input>})
      -> (tensor<2x3x4x4xf32>, tensor<2x3x2x2xf32> {pipe.saved = "x8"}, tensor<2x3x4x4xf32> {pipe.saved = "padded8"}) {
    %t = nn.tanh %x : tensor<2x3x2x2xf32>
    %p = nn.pad %t {pads = array<i64: 0, 0, 1, 1, 0, 0, 1, 1>} : (tensor<2x3x2x2xf32>) -> tensor<2x3x4x4xf32>
    return %p, %t, %p : tensor<2x3x4x4xf32>, tensor<2x3x2x2xf32>, tensor<2x3x4x4xf32>
  }
  func.func @bwd_input(%dy: tensor<2x3x4x4xf32> {nn.name = "dy8", nn.role = #nn.role<input>}, %p: tensor<2x3x4x4xf32> {pipe.saved = "padded8"})
      -> tensor<2x3x4x4xf32> {
    %g = nn.mul %dy, %p : (tensor<2x3x4x4xf32>, tensor<2x3x4x4xf32>) -> tensor<2x3x4x4xf32>
    return %g : tensor<2x3x4x4xf32>
  }
}

// pipec-channels-last's transposes: of a parameter (a 3x3 weight) and of
// the image, a model input every entry point may read by name, and a view
// of a parameter alone (a 1x1 weight's reshape). None is kept per
// micro-batch: the readers transpose and view their own arguments.
// CHECK-LABEL: pipe.stage @stage_9
// CHECK: func.func @fwd{{.*}} -> tensor<2x4x4x4xf32> attributes
// CHECK: func.func @bwd_input(%[[W9:[^:]*]]: tensor<4x3x3x3xf32> {nn.name = "w9", nn.role = #nn.role<param>}, %[[V9:[^:]*]]: tensor<4x4x1x1xf32> {nn.name = "v9", nn.role = #nn.role<param>}, %[[DY9:[^:]*]]: {{.*}})
// CHECK: nn.reshape %[[V9]] : tensor<4x4x1x1xf32> -> tensor<4x1x1x4xf32>
// CHECK: nn.transpose %[[W9]] {perm = array<i64: 0, 2, 3, 1>}
// CHECK: func.func @bwd_weight(%[[DY9W:[^:]*]]: {{.*}}, %[[X9:[^:]*]]: tensor<2x3x4x4xf32> {nn.name = "x9", nn.role = #nn.role<input>})
// CHECK-NEXT: %[[XT:.*]] = nn.transpose %[[X9]] {perm = array<i64: 0, 2, 3, 1>}
// CHECK-NEXT: nn.conv_weight_grad %[[DY9W]], %[[XT]]
pipe.stage @stage_9 attributes {id = 9 : i64, replicas = 1 : i64} {
  func.func @fwd(%x: tensor<2x3x4x4xf32> {nn.name = "x9", nn.role = #nn.role<input>}, %w: tensor<4x3x3x3xf32> {nn.name = "w9", nn.role = #nn.role<param>},
                 %v: tensor<4x4x1x1xf32> {nn.name = "v9", nn.role = #nn.role<param>})
      -> (tensor<2x4x4x4xf32>, tensor<2x4x4x3xf32> {pipe.saved = "xt9"}, tensor<4x3x3x3xf32> {pipe.saved = "wt9"}, tensor<4x1x1x4xf32> {pipe.saved = "vt9"}) {
    %xt = nn.transpose %x {perm = array<i64: 0, 2, 3, 1>} : (tensor<2x3x4x4xf32>) -> tensor<2x4x4x3xf32>
    %wt = nn.transpose %w {perm = array<i64: 0, 2, 3, 1>} : (tensor<4x3x3x3xf32>) -> tensor<4x3x3x3xf32>
    %vt = nn.reshape %v : tensor<4x4x1x1xf32> -> tensor<4x1x1x4xf32>
    %y = nn.conv %xt, %wt {channels_last = true, strides = array<i64: 1, 1>, pads = array<i64: 1, 1, 1, 1>, dilations = array<i64: 1, 1>} : (tensor<2x4x4x3xf32>, tensor<4x3x3x3xf32>) -> tensor<2x4x4x4xf32>
    %z = nn.conv %y, %vt {channels_last = true, strides = array<i64: 1, 1>, pads = array<i64: 0, 0, 0, 0>, dilations = array<i64: 1, 1>} : (tensor<2x4x4x4xf32>, tensor<4x1x1x4xf32>) -> tensor<2x4x4x4xf32>
    return %z, %xt, %wt, %vt : tensor<2x4x4x4xf32>, tensor<2x4x4x3xf32>, tensor<4x3x3x3xf32>, tensor<4x1x1x4xf32>
  }
  func.func @bwd_input(%dy: tensor<2x4x4x4xf32> {nn.name = "dy9", nn.role = #nn.role<input>}, %wt: tensor<4x3x3x3xf32> {pipe.saved = "wt9"}, %vt: tensor<4x1x1x4xf32> {pipe.saved = "vt9"})
      -> tensor<2x4x4x3xf32> {
    %d1 = nn.conv_input_grad %dy, %vt {channels_last = true, strides = array<i64: 1, 1>, pads = array<i64: 0, 0, 0, 0>, dilations = array<i64: 1, 1>} : (tensor<2x4x4x4xf32>, tensor<4x1x1x4xf32>) -> tensor<2x4x4x4xf32>
    %dx = nn.conv_input_grad %d1, %wt {channels_last = true, strides = array<i64: 1, 1>, pads = array<i64: 1, 1, 1, 1>, dilations = array<i64: 1, 1>} : (tensor<2x4x4x4xf32>, tensor<4x3x3x3xf32>) -> tensor<2x4x4x3xf32>
    return %dx : tensor<2x4x4x3xf32>
  }
  func.func @bwd_weight(%dy: tensor<2x4x4x4xf32> {nn.name = "dy9w", nn.role = #nn.role<input>}, %xt: tensor<2x4x4x3xf32> {pipe.saved = "xt9"})
      -> tensor<4x3x3x3xf32> {
    %dw = nn.conv_weight_grad %dy, %xt {channels_last = true, strides = array<i64: 1, 1>, pads = array<i64: 1, 1, 1, 1>, dilations = array<i64: 1, 1>} : (tensor<2x4x4x4xf32>, tensor<2x4x4x3xf32>) -> tensor<4x3x3x3xf32>
    return %dw : tensor<4x3x3x3xf32>
  }
}
