// RUN: pipec-opt %s --pipec-optimizer="optimizer=adamw lr=0.01 beta1=0.8" | FileCheck %s --check-prefix=ADAMW
// RUN: pipec-opt %s --pipec-optimizer="optimizer=sgd lr=0.1 momentum=0.9 weight-decay=0.0005" | FileCheck %s --check-prefix=SGD
// RUN: not pipec-opt %s --pipec-optimizer="optimizer=lion" 2>&1 | FileCheck %s --check-prefix=UNKNOWN

// Two trained parameters and a buffer: the buffer gets no update, the
// state is parameter-major (w.m, w.v, b.m, b.v), the step count comes last.

// ADAMW-LABEL: func.func @optimizer_step(
// ADAMW-SAME: %[[W:.*]]: tensor<4x8xf32> {nn.name = "fc.weight", nn.role = #nn.role<param>}, %[[B:.*]]: tensor<8xf32> {nn.name = "fc.bias", nn.role = #nn.role<param>},
// ADAMW-SAME: %[[GW:.*]]: tensor<4x8xf32> {nn.name = "fc.weight", nn.role = #nn.role<grad>}, %[[GB:.*]]: tensor<8xf32> {nn.name = "fc.bias", nn.role = #nn.role<grad>},
// ADAMW-SAME: %[[MW:.*]]: tensor<4x8xf32> {nn.name = "fc.weight", nn.role = #nn.role<optimizer_state>, pipe.state = #pipe.state<exp_avg>}, %[[VW:.*]]: tensor<4x8xf32> {nn.name = "fc.weight", nn.role = #nn.role<optimizer_state>, pipe.state = #pipe.state<exp_avg_sq>},
// ADAMW-SAME: %[[MB:.*]]: tensor<8xf32> {nn.name = "fc.bias", nn.role = #nn.role<optimizer_state>, pipe.state = #pipe.state<exp_avg>}, %[[VB:.*]]: tensor<8xf32> {nn.name = "fc.bias", nn.role = #nn.role<optimizer_state>, pipe.state = #pipe.state<exp_avg_sq>},
// ADAMW-SAME: %[[STEP:.*]]: i64 {nn.role = #nn.role<step>})
// ADAMW-SAME: -> (tensor<4x8xf32> {nn.name = "fc.weight", nn.role = #nn.role<param>}, tensor<8xf32> {nn.name = "fc.bias", nn.role = #nn.role<param>},
// ADAMW-SAME: tensor<4x8xf32> {nn.name = "fc.weight", nn.role = #nn.role<optimizer_state>, pipe.state = #pipe.state<exp_avg>}, tensor<4x8xf32> {nn.name = "fc.weight", nn.role = #nn.role<optimizer_state>, pipe.state = #pipe.state<exp_avg_sq>},
// ADAMW-SAME: tensor<8xf32> {nn.name = "fc.bias", nn.role = #nn.role<optimizer_state>, pipe.state = #pipe.state<exp_avg>}, tensor<8xf32> {nn.name = "fc.bias", nn.role = #nn.role<optimizer_state>, pipe.state = #pipe.state<exp_avg_sq>})
// ADAMW-SAME: pipe.optimizer = #pipe.optimizer<kind = adamw, lr = 0.01, momentum = 0.0, weight_decay = 0.01, beta1 = 0.80000000000000004, beta2 = 0.999, epsilon = 1.0e-08, state_per_param = 2>
// ADAMW: %[[PW:.*]], %[[NMW:.*]], %[[NVW:.*]] = nn.adamw_update %[[W]], %[[GW]], %[[MW]], %[[VW]], %[[STEP]] {beta1 = 8.000000e-01 : f32, lr = 0.00999999977 : f32, nn.name = "fc.weight"} : tensor<4x8xf32>
// ADAMW: %[[PB:.*]], %[[NMB:.*]], %[[NVB:.*]] = nn.adamw_update %[[B]], %[[GB]], %[[MB]], %[[VB]], %[[STEP]] {{.*}}nn.name = "fc.bias"
// ADAMW: return %[[PW]], %[[PB]], %[[NMW]], %[[NVW]], %[[NMB]], %[[NVB]] :
// ADAMW-NOT: running_mean

// SGD-LABEL: func.func @optimizer_step(
// SGD-SAME: %[[W:.*]]: tensor<4x8xf32> {nn.name = "fc.weight", nn.role = #nn.role<param>}, %[[B:.*]]: tensor<8xf32> {nn.name = "fc.bias", nn.role = #nn.role<param>},
// SGD-SAME: %[[GW:.*]]: tensor<4x8xf32> {nn.name = "fc.weight", nn.role = #nn.role<grad>}, %[[GB:.*]]: tensor<8xf32> {nn.name = "fc.bias", nn.role = #nn.role<grad>},
// SGD-SAME: %[[SW:.*]]: tensor<4x8xf32> {nn.name = "fc.weight", nn.role = #nn.role<optimizer_state>, pipe.state = #pipe.state<momentum_buffer>}, %[[SB:.*]]: tensor<8xf32> {nn.name = "fc.bias", nn.role = #nn.role<optimizer_state>, pipe.state = #pipe.state<momentum_buffer>},
// SGD-SAME: %[[STEP:.*]]: i64 {nn.role = #nn.role<step>})
// SGD-SAME: pipe.optimizer = #pipe.optimizer<kind = sgd, lr = 0.10000000000000001, momentum = 0.90000000000000002, weight_decay = 0.00050000000000000001, beta1 = 0.0, beta2 = 0.0, epsilon = 0.0, state_per_param = 1>
// SGD: %[[PW:.*]], %[[NSW:.*]] = nn.sgd_update %[[W]], %[[GW]], %[[SW]], %[[STEP]] {lr = 1.000000e-01 : f32, momentum = 0.899999976 : f32, nn.name = "fc.weight", weight_decay = 5.000000e-04 : f32} : tensor<4x8xf32>
// SGD: %[[PB:.*]], %[[NSB:.*]] = nn.sgd_update %[[B]], %[[GB]], %[[SB]], %[[STEP]] {{.*}}nn.name = "fc.bias"
// SGD: return %[[PW]], %[[PB]], %[[NSW]], %[[NSB]] :

// UNKNOWN: error: pipec-optimizer: optimizer=lion: expected adamw, sgd-momentum or sgd

func.func @train_step(%w: tensor<4x8xf32> {nn.name = "fc.weight", nn.role = #nn.role<param>},
                      %b: tensor<8xf32> {nn.name = "fc.bias", nn.role = #nn.role<param>},
                      %mean: tensor<8xf32> {nn.name = "bn.running_mean", nn.role = #nn.role<buffer>},
                      %x: tensor<2x4xf32> {nn.name = "x", nn.role = #nn.role<input>})
    -> (tensor<f32> {nn.name = "loss", nn.role = #nn.role<loss>},
        tensor<4x8xf32> {nn.name = "fc.weight", nn.role = #nn.role<grad>},
        tensor<8xf32> {nn.name = "fc.bias", nn.role = #nn.role<grad>}) {
  %l = nn.constant dense<0.0> : tensor<f32>
  return %l, %w, %b : tensor<f32>, tensor<4x8xf32>, tensor<8xf32>
}
