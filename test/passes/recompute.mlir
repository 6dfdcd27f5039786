// RUN: pipec-opt %S/Inputs/three-stages.mlir --pipec-optimizer --pipec-outline-stages --pipec-recompute="stage-ids=1" | FileCheck %s --check-prefix=ONE
// RUN: pipec-opt %S/Inputs/three-stages.mlir --pipec-optimizer --pipec-outline-stages --pipec-recompute="mode=all" | FileCheck %s --check-prefix=ALL
// RUN: pipec-opt %S/Inputs/three-stages.mlir --pipec-optimizer --pipec-outline-stages --pipec-recompute="mode=none" | FileCheck %s --check-prefix=NONE
// RUN: not pipec-opt %S/Inputs/three-stages.mlir --pipec-optimizer --pipec-outline-stages --pipec-recompute="stage-ids=7" 2>&1 | FileCheck %s --check-prefix=RANGE
// RUN: not pipec-opt %S/Inputs/three-stages.mlir --pipec-optimizer --pipec-outline-stages --pipec-recompute="mode=some" 2>&1 | FileCheck %s --check-prefix=MODE
// RUN: not pipec-opt %S/Inputs/three-stages.mlir --pipec-optimizer --pipec-outline-stages --pipec-weight-stashing=versions=2 --pipec-recompute="mode=all" 2>&1 | FileCheck %s --check-prefix=ORDER

// Stage 1 alone: @fwd saves only what it received (relu0, which @bwd_weight
// also reads) instead of relu1 and relu0: 512 bytes instead of 1024.
// ONE-LABEL: pipe.stage @stage_0
// ONE-NOT: pipe.recompute
// ONE-LABEL: pipe.stage @stage_1 attributes {id = 1 : i64, pipe.recompute, pipe.workspace_bytes = 1024 : i64
// ONE: func.func @fwd(%{{.*}}: tensor<16x16xf32> {nn.name = "w1", nn.role = #nn.role<param>}) -> (tensor<8x16xf32> {pipe.saved = "relu0"})
// ONE-SAME: attributes {pipe.saved_bytes = 512 : i64, pipe.saved_bytes_no_recompute = 1024 : i64}
// ONE-NEXT: %[[IN:.*]] = pipe.recv from 0 tag 0
// ONE-NEXT: %[[H:.*]] = nn.matmul %[[IN]]
// ONE-NEXT: %[[R:.*]] = nn.relu %[[H]]
// ONE-NEXT: pipe.send %[[IN]] to 2 tag 0
// ONE-NEXT: pipe.send %[[R]] to 2 tag 1
// ONE-NEXT: return %[[IN]] : tensor<8x16xf32>
// ONE: func.func @bwd_input(%[[W:.*]]: tensor<16x16xf32> {nn.name = "w1", nn.role = #nn.role<param>}, %[[SAVED:.*]]: tensor<8x16xf32> {pipe.saved = "relu0"})
// ONE-SAME: -> (tensor<8x16xf32> {pipe.saved = "unary_grad"})
// ONE-NEXT: %[[G:.*]] = pipe.recv from 2 tag 2
// ONE-NEXT: pipe.recv from 2 tag 3
// ONE-NEXT: %[[RE:.*]] = pipe.recompute(%[[W]], %[[SAVED]]) : (tensor<16x16xf32>, tensor<8x16xf32>) -> tensor<8x16xf32> {
// ONE-NEXT: ^bb0(%[[BW:.*]]: tensor<16x16xf32>, %[[BX:.*]]: tensor<8x16xf32>):
// ONE-NEXT: %[[RH:.*]] = nn.matmul %[[BX]], %[[BW]]
// ONE-NEXT: %[[RR:.*]] = nn.relu %[[RH]]
// ONE-NEXT: pipe.yield %[[RR]]
// ONE-NEXT: }
// ONE-NEXT: nn.unary_grad <relu> %[[G]], y = %[[RE]]
// ONE: func.func @bwd_weight(%{{.*}}: tensor<8x16xf32> {pipe.saved = "relu0"}, %{{.*}}: tensor<8x16xf32> {pipe.saved = "unary_grad"})
// ONE-LABEL: pipe.stage @stage_2
// ONE-NOT: pipe.recompute

// Every stage. Stage 0 received nothing: its backward re-runs the forward
// from the parameter and the data field, which @bwd_input now takes.
// ALL-LABEL: pipe.stage @stage_0 attributes {id = 0 : i64, pipe.recompute, pipe.workspace_bytes = 512 : i64
// ALL: func.func @fwd({{.*}}) attributes {pipe.saved_bytes = 0 : i64, pipe.saved_bytes_no_recompute = 512 : i64}
// ALL: func.func @bwd_input(%[[W0:.*]]: tensor<16x16xf32> {nn.name = "w0", nn.role = #nn.role<param>}, %[[X:.*]]: tensor<8x16xf32> {nn.name = "x", nn.role = #nn.role<input>})
// ALL: pipe.recompute(%[[W0]], %[[X]])
// ALL-LABEL: pipe.stage @stage_1 attributes {id = 1 : i64, pipe.recompute
// ALL-LABEL: pipe.stage @stage_2 attributes {id = 2 : i64, pipe.recompute, pipe.workspace_bytes = 1536 : i64
// ALL: func.func @fwd({{.*}}) -> (tensor<f32> {nn.name = "loss", nn.role = #nn.role<loss>}, tensor<8x16xf32> {pipe.saved = "relu1"}, tensor<8x16xf32> {pipe.saved = "relu0"})
// ALL-SAME: pipe.saved_bytes = 1024 : i64, pipe.saved_bytes_no_recompute = 1024 : i64
// ALL: func.func @bwd_input({{.*}}%[[S0:.*]]: tensor<8x16xf32> {pipe.saved = "relu0"}, %[[S1:.*]]: tensor<8x16xf32> {pipe.saved = "relu1"}, %{{.*}}: tensor<f32> {nn.role = #nn.role<loss_scale>})
// ALL-NEXT: pipe.recompute(%[[S0]], %{{.*}}, %[[S1]]) : (tensor<8x16xf32>, tensor<16x16xf32>, tensor<8x16xf32>) -> tensor<8x16xf32>

// NONE-NOT: pipe.recompute

// RANGE: error: pipec-recompute: there is no stage 7 (the module has 3)
// MODE: error: pipec-recompute: mode must be none, all or auto, got 'some'
// ORDER: error: pipec-recompute: stage 0 already stashes weights; run pipec-recompute before pipec-weight-stashing
