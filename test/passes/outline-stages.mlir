// RUN: pipec-opt %s -split-input-file --pipec-optimizer="optimizer=sgd lr=0.1" --pipec-outline-stages | FileCheck %s
// RUN: pipec-opt %s -split-input-file --pipec-optimizer="optimizer=sgd lr=0.1" --pipec-outline-stages --pipec-verify-pipeline | FileCheck %s
// RUN: pipec-opt %s -split-input-file --pipec-optimizer --pipec-outline-stages="keep-train-step=true" | FileCheck %s --check-prefix=KEEP

// Three stages. Stage 2 reads relu0 of stage 0 (a skip connection: stage 1
// forwards it, and its gradient comes back through stage 1), and w0 is tied
// between stages 0 and 2 (each holds a copy; their partial gradients are
// summed by an all-reduce among them). Stage 1 has two replicas.

// CHECK-LABEL: pipe.stage @stage_0 attributes {id = 0 : i64, pipe.workspace_bytes = 1024 : i64, ranks = array<i64: 0>}
// CHECK: func.func @fwd(%[[W0:.*]]: tensor<16x16xf32> {nn.name = "w0", nn.role = #nn.role<param>}, %[[X:.*]]: tensor<8x16xf32> {nn.name = "x", nn.role = #nn.role<input>})
// relu's gradient reads its result, so fc0 (its input) is not saved.
// CHECK-SAME: -> (tensor<8x16xf32> {pipe.saved = "relu0"}) attributes {pipe.saved_bytes = 512 : i64}
// CHECK-NEXT: %[[H0:.*]] = nn.matmul %[[X]], %[[W0]] {pipe.phase = #pipe.phase<fwd>, pipe.stage = 0 : i64}
// CHECK-NEXT: %[[R0:.*]] = nn.relu %[[H0]]
// CHECK-NEXT: pipe.send %[[R0]] to 1 tag 0 {name = "relu0"} : tensor<8x16xf32>
// CHECK-NEXT: return %[[R0]]
// CHECK: func.func @bwd_input(%[[SR0:.*]]: tensor<8x16xf32> {pipe.saved = "relu0"})
// CHECK-SAME: -> (tensor<8x16xf32> {pipe.saved = "unary_grad"}) attributes {pipe.saved_bytes = 512 : i64}
// CHECK-NEXT: %[[DR0:.*]] = pipe.recv from 1 tag 4 {name = "grad:add"} : tensor<8x16xf32>
// CHECK-NEXT: %[[DH0:.*]] = nn.unary_grad <relu> %[[DR0]], y = %[[SR0]]
// CHECK-NEXT: return %[[DH0]]
// CHECK: func.func @bwd_weight(%[[X2:.*]]: tensor<8x16xf32> {nn.name = "x", nn.role = #nn.role<input>}, %[[SDH0:.*]]: tensor<8x16xf32> {pipe.saved = "unary_grad"})
// CHECK-SAME: -> (tensor<16x16xf32> {nn.name = "w0", nn.role = #nn.role<grad>})
// CHECK-NEXT: %[[XT:.*]] = nn.transpose %[[X2]]
// CHECK-NEXT: %[[DW0A:.*]] = nn.matmul %[[XT]], %[[SDH0]]
// CHECK-NEXT: return %[[DW0A]]
// CHECK: func.func @step(%[[P:.*]]: tensor<16x16xf32> {nn.name = "w0", nn.role = #nn.role<param>}, %[[G:.*]]: tensor<16x16xf32> {nn.name = "w0", nn.role = #nn.role<grad>}, %[[M:.*]]: tensor<16x16xf32> {nn.name = "w0", nn.role = #nn.role<optimizer_state>, pipe.state = #pipe.state<momentum_buffer>}, %[[STEP:.*]]: i64 {nn.role = #nn.role<step>})
// CHECK-SAME: -> (tensor<16x16xf32> {nn.name = "w0", nn.role = #nn.role<param>}, tensor<16x16xf32> {nn.name = "w0", nn.role = #nn.role<optimizer_state>, pipe.state = #pipe.state<momentum_buffer>})
// CHECK-SAME: pipe.optimizer = #pipe.optimizer<kind = sgd, lr = 0.10000000000000001,
// CHECK-NEXT: %[[SUM:.*]] = pipe.allreduce %[[G]] {name = "w0", reduction = "sum", stages = array<i64: 0, 2>} : tensor<16x16xf32>
// CHECK-NEXT: %[[NP:.*]], %[[NM:.*]] = nn.sgd_update %[[P]], %[[SUM]], %[[M]], %[[STEP]]
// CHECK-NEXT: return %[[NP]], %[[NM]]

// CHECK-LABEL: pipe.stage @stage_1 attributes {id = 1 : i64, pipe.workspace_bytes = 1536 : i64, ranks = array<i64: 1, 2>, replicas = 2 : i64}
// CHECK: func.func @fwd(%[[W1:.*]]: tensor<16x16xf32> {nn.name = "w1", nn.role = #nn.role<param>})
// CHECK-SAME: -> (tensor<8x16xf32> {pipe.saved = "relu1"}, tensor<8x16xf32> {pipe.saved = "relu0"})
// CHECK-NEXT: %[[IN:.*]] = pipe.recv from 0 tag 0 {name = "relu0"} : tensor<8x16xf32>
// CHECK-NEXT: %[[H1:.*]] = nn.matmul %[[IN]], %[[W1]]
// CHECK-NEXT: %[[R1:.*]] = nn.relu %[[H1]]
// CHECK-NEXT: pipe.send %[[IN]] to 2 tag 0 {name = "relu0"} : tensor<8x16xf32>
// CHECK-NEXT: pipe.send %[[R1]] to 2 tag 1 {name = "relu1"} : tensor<8x16xf32>
// CHECK-NEXT: return %[[R1]], %[[IN]]
// CHECK: func.func @bwd_input(%{{.*}}: tensor<16x16xf32> {nn.name = "w1", nn.role = #nn.role<param>}, %{{.*}}: tensor<8x16xf32> {pipe.saved = "relu1"})
// CHECK-NEXT: %[[G1:.*]] = pipe.recv from 2 tag 2 {name = "grad:matmul"}
// CHECK-NEXT: %[[G2:.*]] = pipe.recv from 2 tag 3 {name = "grad:softmax_cross_entropy_loss_grad"}
// CHECK: %[[SUM1:.*]] = nn.add %[[G2]], %{{.*}} {pipe.phase = #pipe.phase<bwd_input>, pipe.stage = 1 : i64}
// CHECK-NEXT: pipe.send %[[SUM1]] to 0 tag 4 {name = "grad:add"} : tensor<8x16xf32>
// CHECK: func.func @bwd_weight(%{{.*}}: tensor<8x16xf32> {pipe.saved = "relu0"}, %{{.*}}: tensor<8x16xf32> {pipe.saved = "unary_grad"}) -> (tensor<16x16xf32> {nn.name = "w1", nn.role = #nn.role<grad>})
// CHECK: func.func @step(
// CHECK-NEXT: %[[MEAN:.*]] = pipe.allreduce %{{.*}} : tensor<16x16xf32>
// CHECK-NEXT: nn.sgd_update %{{.*}}, %[[MEAN]]

// CHECK-LABEL: pipe.stage @stage_2 attributes {id = 2 : i64, pipe.workspace_bytes = 1536 : i64, ranks = array<i64: 3>}
// CHECK: func.func @fwd(%{{.*}}: tensor<16x16xf32> {nn.name = "w0", nn.role = #nn.role<param>}, %{{.*}}: tensor<8xi64> {nn.name = "labels", nn.role = #nn.role<label>})
// CHECK-SAME: -> (tensor<f32> {nn.name = "loss", nn.role = #nn.role<loss>}, tensor<8x16xf32> {pipe.saved = "skip"}, tensor<8x16xf32> {pipe.saved = "relu1"})
// CHECK-NEXT: pipe.recv from 1 tag 0 {name = "relu0"}
// CHECK-NEXT: pipe.recv from 1 tag 1 {name = "relu1"}
// CHECK-NOT: pipe.send
// CHECK: func.func @bwd_input(%{{.*}}: tensor<16x16xf32> {nn.name = "w0", nn.role = #nn.role<param>}, %{{.*}}: tensor<8xi64> {nn.name = "labels", nn.role = #nn.role<label>}, %{{.*}}: tensor<8x16xf32> {pipe.saved = "skip"}, %[[SCALE:.*]]: tensor<f32> {nn.role = #nn.role<loss_scale>})
// CHECK-NEXT: %[[DY:.*]] = nn.softmax_cross_entropy_loss_grad %[[SCALE]]
// CHECK-NOT: nn.constant
// CHECK: pipe.send %{{.*}} to 1 tag 2 {name = "grad:matmul"}
// CHECK-NEXT: pipe.send %[[DY]] to 1 tag 3 {name = "grad:softmax_cross_entropy_loss_grad"}
// CHECK: func.func @bwd_weight(%{{.*}}: tensor<8x16xf32> {pipe.saved = "relu1"}, %{{.*}}: tensor<8x16xf32> {pipe.saved = "softmax_cross_entropy_loss_grad"}) -> (tensor<16x16xf32> {nn.name = "w0", nn.role = #nn.role<grad>})
// CHECK-NOT: nn.add
// CHECK: func.func @step(
// CHECK-NEXT: pipe.allreduce %{{.*}} {name = "w0", reduction = "sum", stages = array<i64: 0, 2>}
// CHECK-NOT: func.func @train_step
// CHECK-NOT: func.func @optimizer_step

// KEEP: pipe.stage @stage_2
// KEEP: func.func @train_step(
// KEEP: func.func @optimizer_step(
module attributes {pipe.stages = [
    {id = 0 : i64, first_op = "fc0", last_op = "relu0", replicas = 1 : i64, ranks = array<i64: 0>},
    {id = 1 : i64, first_op = "fc1", last_op = "relu1", replicas = 2 : i64, ranks = array<i64: 1, 2>},
    {id = 2 : i64, first_op = "head", last_op = "loss", replicas = 1 : i64, ranks = array<i64: 3>}]} {
  func.func @train_step(%w0: tensor<16x16xf32> {nn.name = "w0", nn.role = #nn.role<param>},
                        %w1: tensor<16x16xf32> {nn.name = "w1", nn.role = #nn.role<param>},
                        %x: tensor<8x16xf32> {nn.name = "x", nn.role = #nn.role<input>},
                        %labels: tensor<8xi64> {nn.name = "labels", nn.role = #nn.role<label>})
      -> (tensor<f32> {nn.name = "loss", nn.role = #nn.role<loss>},
          tensor<16x16xf32> {nn.name = "w0", nn.role = #nn.role<grad>},
          tensor<16x16xf32> {nn.name = "w1", nn.role = #nn.role<grad>}) {
    %h0 = nn.matmul %x, %w0 {pipe.stage = 0 : i64, pipe.phase = #pipe.phase<fwd>} : (tensor<8x16xf32>, tensor<16x16xf32>) -> tensor<8x16xf32> loc("fc0")
    %r0 = nn.relu %h0 {pipe.stage = 0 : i64, pipe.phase = #pipe.phase<fwd>} : tensor<8x16xf32> loc("relu0")
    %h1 = nn.matmul %r0, %w1 {pipe.stage = 1 : i64, pipe.phase = #pipe.phase<fwd>} : (tensor<8x16xf32>, tensor<16x16xf32>) -> tensor<8x16xf32> loc("fc1")
    %r1 = nn.relu %h1 {pipe.stage = 1 : i64, pipe.phase = #pipe.phase<fwd>} : tensor<8x16xf32> loc("relu1")
    %h2 = nn.matmul %r1, %w0 {pipe.stage = 2 : i64, pipe.phase = #pipe.phase<fwd>} : (tensor<8x16xf32>, tensor<16x16xf32>) -> tensor<8x16xf32> loc("head")
    %y = nn.add %h2, %r0 {pipe.stage = 2 : i64, pipe.phase = #pipe.phase<fwd>} : (tensor<8x16xf32>, tensor<8x16xf32>) -> tensor<8x16xf32> loc("skip")
    %loss, %logp = nn.softmax_cross_entropy_loss %y, %labels {pipe.stage = 2 : i64, pipe.phase = #pipe.phase<fwd>} : (tensor<8x16xf32>, tensor<8xi64>) -> (tensor<f32>, tensor<8x16xf32>) loc("loss")
    %seed = nn.constant {pipe.stage = 2 : i64, pipe.phase = #pipe.phase<bwd_input>} dense<1.0> : tensor<f32> loc("loss_seed")
    %dy = nn.softmax_cross_entropy_loss_grad %seed, %y, %labels {pipe.stage = 2 : i64, pipe.phase = #pipe.phase<bwd_input>} : (tensor<f32>, tensor<8x16xf32>, tensor<8xi64>) -> tensor<8x16xf32>
    %w0t = nn.transpose %w0 {perm = array<i64: 1, 0>, pipe.stage = 2 : i64, pipe.phase = #pipe.phase<bwd_input>} : (tensor<16x16xf32>) -> tensor<16x16xf32>
    %dr1 = nn.matmul %dy, %w0t {pipe.stage = 2 : i64, pipe.phase = #pipe.phase<bwd_input>} : (tensor<8x16xf32>, tensor<16x16xf32>) -> tensor<8x16xf32>
    %r1t = nn.transpose %r1 {perm = array<i64: 1, 0>, pipe.stage = 2 : i64, pipe.phase = #pipe.phase<bwd_weight>} : (tensor<8x16xf32>) -> tensor<16x8xf32>
    %dw0b = nn.matmul %r1t, %dy {pipe.stage = 2 : i64, pipe.phase = #pipe.phase<bwd_weight>} : (tensor<16x8xf32>, tensor<8x16xf32>) -> tensor<16x16xf32>
    %dh1 = nn.unary_grad <relu> %dr1, y = %r1 {pipe.stage = 1 : i64, pipe.phase = #pipe.phase<bwd_input>} : tensor<8x16xf32>
    %w1t = nn.transpose %w1 {perm = array<i64: 1, 0>, pipe.stage = 1 : i64, pipe.phase = #pipe.phase<bwd_input>} : (tensor<16x16xf32>) -> tensor<16x16xf32>
    %dr0a = nn.matmul %dh1, %w1t {pipe.stage = 1 : i64, pipe.phase = #pipe.phase<bwd_input>} : (tensor<8x16xf32>, tensor<16x16xf32>) -> tensor<8x16xf32>
    %r0t = nn.transpose %r0 {perm = array<i64: 1, 0>, pipe.stage = 1 : i64, pipe.phase = #pipe.phase<bwd_weight>} : (tensor<8x16xf32>) -> tensor<16x8xf32>
    %dw1 = nn.matmul %r0t, %dh1 {pipe.stage = 1 : i64, pipe.phase = #pipe.phase<bwd_weight>} : (tensor<16x8xf32>, tensor<8x16xf32>) -> tensor<16x16xf32>
    %dr0 = nn.add %dy, %dr0a {pipe.stage = 1 : i64, pipe.phase = #pipe.phase<bwd_input>} : (tensor<8x16xf32>, tensor<8x16xf32>) -> tensor<8x16xf32>
    %dh0 = nn.unary_grad <relu> %dr0, y = %r0 {pipe.stage = 0 : i64, pipe.phase = #pipe.phase<bwd_input>} : tensor<8x16xf32>
    %xt = nn.transpose %x {perm = array<i64: 1, 0>, pipe.stage = 0 : i64, pipe.phase = #pipe.phase<bwd_weight>} : (tensor<8x16xf32>) -> tensor<16x8xf32>
    %dw0a = nn.matmul %xt, %dh0 {pipe.stage = 0 : i64, pipe.phase = #pipe.phase<bwd_weight>} : (tensor<16x8xf32>, tensor<8x16xf32>) -> tensor<16x16xf32>
    %dw0 = nn.add %dw0b, %dw0a {pipe.stage = 0 : i64, pipe.phase = #pipe.phase<bwd_weight>} : (tensor<16x16xf32>, tensor<16x16xf32>) -> tensor<16x16xf32>
    return %loss, %dw0, %dw1 : tensor<f32>, tensor<16x16xf32>, tensor<16x16xf32>
  }
}

// -----

// A constant without pipe.stage is copied into every function reading it;
// the buffer update is returned by the @fwd computing it; a gradient stage 0's
// @bwd_weight needs arrives in its @bwd_input and is saved for it.

// CHECK-LABEL: pipe.stage @stage_0
// CHECK: func.func @bwd_input() -> (tensor<2x4xf32> {pipe.saved = "grad_in"}) attributes {pipe.saved_bytes = 32 : i64}
// CHECK-NEXT: %[[D:.*]] = pipe.recv from 1 tag 1 {name = "grad:grad_in"} : tensor<2x4xf32>
// CHECK-NEXT: return %[[D]]
// CHECK: func.func @bwd_weight(%{{.*}}: tensor<2x4xf32> {nn.name = "x", nn.role = #nn.role<input>}, %{{.*}}: tensor<2x4xf32> {pipe.saved = "grad_in"}) -> (tensor<4x4xf32> {nn.name = "w", nn.role = #nn.role<grad>})
// CHECK-LABEL: pipe.stage @stage_1
// CHECK: func.func @fwd(%[[M:.*]]: tensor<4xf32> {nn.name = "bn.running_mean", nn.role = #nn.role<buffer>})
// CHECK-SAME: -> (tensor<f32> {nn.name = "loss", nn.role = #nn.role<loss>}, tensor<4xf32> {nn.name = "bn.running_mean", nn.role = #nn.role<buffer_update>})
// CHECK-SAME: pipe.saved_bytes = 0 : i64
// CHECK-NEXT: pipe.recv from 0 tag 0 {name = "fc"}
// CHECK-NEXT: %[[C:.*]] = nn.constant dense<2.000000e+00> : tensor<2x4xf32>
// CHECK: nn.add %[[M]], %[[M]]
// CHECK: func.func @bwd_input(%[[SCALE:.*]]: tensor<f32> {nn.role = #nn.role<loss_scale>})
// CHECK: nn.constant dense<2.000000e+00> : tensor<2x4xf32>
// CHECK: pipe.send %{{.*}} to 0 tag 1 {name = "grad:grad_in"} : tensor<2x4xf32>
// CHECK: func.func @bwd_weight() {
// CHECK-NEXT: return
// CHECK: func.func @step(%{{.*}}: i64 {nn.role = #nn.role<step>}) attributes
// CHECK-NEXT: return

module attributes {pipe.stages = [
    {id = 0 : i64, first_op = "fc", last_op = "fc", replicas = 1 : i64, ranks = array<i64: 0>},
    {id = 1 : i64, first_op = "scale", last_op = "loss", replicas = 1 : i64, ranks = array<i64: 1>}]} {
  func.func @train_step(%w: tensor<4x4xf32> {nn.name = "w", nn.role = #nn.role<param>},
                        %m: tensor<4xf32> {nn.name = "bn.running_mean", nn.role = #nn.role<buffer>},
                        %x: tensor<2x4xf32> {nn.name = "x", nn.role = #nn.role<input>})
      -> (tensor<f32> {nn.name = "loss", nn.role = #nn.role<loss>},
          tensor<4x4xf32> {nn.name = "w", nn.role = #nn.role<grad>},
          tensor<4xf32> {nn.name = "bn.running_mean", nn.role = #nn.role<buffer_update>}) {
    %c = nn.constant dense<2.0> : tensor<2x4xf32>
    %h = nn.matmul %x, %w {pipe.stage = 0 : i64, pipe.phase = #pipe.phase<fwd>} : (tensor<2x4xf32>, tensor<4x4xf32>) -> tensor<2x4xf32> loc("fc")
    %s = nn.mul %h, %c {pipe.stage = 1 : i64, pipe.phase = #pipe.phase<fwd>} : (tensor<2x4xf32>, tensor<2x4xf32>) -> tensor<2x4xf32> loc("scale")
    %newm = nn.add %m, %m {pipe.stage = 1 : i64, pipe.phase = #pipe.phase<fwd>} : (tensor<4xf32>, tensor<4xf32>) -> tensor<4xf32>
    %l = nn.reduce_mean %s {axes = array<i64: 0, 1>, keepdims = false, pipe.stage = 1 : i64, pipe.phase = #pipe.phase<fwd>} : (tensor<2x4xf32>) -> tensor<f32> loc("loss")
    %seed = nn.constant {pipe.stage = 1 : i64, pipe.phase = #pipe.phase<bwd_input>} dense<1.0> : tensor<f32> loc("loss_seed")
    %ds = nn.mul %seed, %c {pipe.stage = 1 : i64, pipe.phase = #pipe.phase<bwd_input>} : (tensor<f32>, tensor<2x4xf32>) -> tensor<2x4xf32>
    %dh = nn.mul %ds, %c {pipe.stage = 1 : i64, pipe.phase = #pipe.phase<bwd_input>} : (tensor<2x4xf32>, tensor<2x4xf32>) -> tensor<2x4xf32> loc("grad_in")
    %xt = nn.transpose %x {perm = array<i64: 1, 0>, pipe.stage = 0 : i64, pipe.phase = #pipe.phase<bwd_weight>} : (tensor<2x4xf32>) -> tensor<4x2xf32>
    %dw = nn.matmul %xt, %dh {pipe.stage = 0 : i64, pipe.phase = #pipe.phase<bwd_weight>} : (tensor<4x2xf32>, tensor<2x4xf32>) -> tensor<4x4xf32>
    return %l, %dw, %newm : tensor<f32>, tensor<4x4xf32>, tensor<4xf32>
  }
}
