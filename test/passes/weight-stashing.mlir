// RUN: pipec-opt %S/Inputs/three-stages.mlir --pipec-optimizer --pipec-outline-stages --pipec-weight-stashing="versions=3" | FileCheck %s
// RUN: pipec-opt %S/Inputs/three-stages.mlir --pipec-optimizer --pipec-outline-stages --pipec-weight-stashing="versions=3 vertical-sync=true" | FileCheck %s --check-prefix=VSYNC
// RUN: pipec-opt %S/Inputs/three-stages.mlir --pipec-optimizer --pipec-outline-stages --pipec-weight-stashing="versions=1" | FileCheck %s --check-prefix=SYNC
// RUN: pipec-opt %S/Inputs/three-stages.mlir --pipec-optimizer --pipec-outline-stages --pipec-recompute=mode=all --pipec-weight-stashing="versions=2" | FileCheck %s --check-prefix=RECOMPUTE
// RUN: not pipec-opt %S/Inputs/three-stages.mlir --pipec-optimizer --pipec-outline-stages --pipec-weight-stashing="versions=3" --pipec-weight-stashing="versions=3" 2>&1 | FileCheck %s --check-prefix=TWICE

// Three versions (an asynchronous schedule with three micro-batches in flight).
// CHECK-LABEL: pipe.stage @stage_0 attributes {id = 0 : i64, pipe.stash_bytes = 3072 : i64, pipe.weight_versions = 3 : i64
// CHECK: func.func @fwd(%[[W0:.*]]: tensor<16x16xf32> {nn.name = "w0", nn.role = #nn.role<param>}, %{{.*}}: tensor<8x16xf32> {nn.name = "x", nn.role = #nn.role<input>}, %[[MB:.*]]: index {nn.role = #nn.role<microbatch>})
// CHECK-NEXT: pipe.stash %[[W0]] for %[[MB]] {name = "w0", slots = 3 : i64} : tensor<16x16xf32>
// CHECK-NEXT: nn.matmul %{{.*}}, %[[W0]]
// CHECK: func.func @bwd_input(%{{.*}}: tensor<8x16xf32> {pipe.saved = "relu0"}, %{{.*}}: index {nn.role = #nn.role<microbatch>})
// CHECK-NOT: pipe.restore
// CHECK: func.func @bwd_weight({{.*}}, %{{.*}}: index {nn.role = #nn.role<microbatch>})
// CHECK: func.func @step(%{{.*}}: tensor<16x16xf32> {nn.name = "w0", nn.role = #nn.role<param>}
// CHECK-NOT: pipe.restore
// CHECK-LABEL: pipe.stage @stage_1
// CHECK: func.func @fwd(%[[W1:.*]]: tensor<16x16xf32> {nn.name = "w1", nn.role = #nn.role<param>}, %[[MB1:.*]]: index {nn.role = #nn.role<microbatch>})
// CHECK-NEXT: pipe.stash %[[W1]] for %[[MB1]] {name = "w1", slots = 3 : i64}
// The backward reads the parameter only through the restored version.
// CHECK: func.func @bwd_input(%{{.*}}: tensor<8x16xf32> {pipe.saved = "relu1"}, %[[MB2:.*]]: index {nn.role = #nn.role<microbatch>})
// CHECK-NEXT: %[[V:.*]] = pipe.restore %[[MB2]] {name = "w1", slots = 3 : i64} : tensor<16x16xf32>
// CHECK: nn.transpose %[[V]]
// CHECK-LABEL: pipe.stage @stage_2
// CHECK: func.func @bwd_input(%{{.*}}: tensor<8xi64> {nn.name = "labels", nn.role = #nn.role<label>}, %{{.*}}: tensor<8x16xf32> {pipe.saved = "skip"}, %{{.*}}: tensor<f32> {nn.role = #nn.role<loss_scale>}, %[[MB3:.*]]: index {nn.role = #nn.role<microbatch>})
// CHECK-NEXT: pipe.restore %[[MB3]] {name = "w0", slots = 3 : i64}

// Vertical sync: stage 0 computes with the current weights, later stages
// with the version of the micro-batch's entry into stage 0.
// VSYNC-LABEL: pipe.stage @stage_0
// VSYNC: pipe.stash %[[W0:.*]] for %{{.*}} {name = "w0", slots = 3 : i64, vertical_sync}
// VSYNC-NEXT: nn.matmul %{{.*}}, %[[W0]]
// VSYNC-LABEL: pipe.stage @stage_1
// VSYNC: func.func @fwd(%[[W1:.*]]: tensor<16x16xf32> {{.*}}, %[[MB:.*]]: index {nn.role = #nn.role<microbatch>})
// VSYNC-NEXT: pipe.stash %[[W1]] for %[[MB]] {name = "w1", slots = 3 : i64, vertical_sync}
// VSYNC-NEXT: %[[V:.*]] = pipe.restore %[[MB]] {name = "w1", slots = 3 : i64, vertical_sync}
// VSYNC: nn.matmul %{{.*}}, %[[V]]

// SYNC-NOT: pipe.stash
// SYNC-NOT: microbatch

// With recompute, the re-run forward also uses the restored version.
// RECOMPUTE-LABEL: pipe.stage @stage_1
// RECOMPUTE: func.func @bwd_input
// RECOMPUTE-NEXT: %[[V:.*]] = pipe.restore %{{.*}} {name = "w1", slots = 2 : i64}
// RECOMPUTE: pipe.recompute(%[[V]],

// TWICE: error: pipec-weight-stashing: stage 0 already stashes weights
