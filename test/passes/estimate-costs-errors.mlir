// RUN: not pipec-opt %s --pipec-estimate-costs="device=TPU" 2>&1 | FileCheck %s --check-prefix=DEVICE
// RUN: not pipec-opt %s --pipec-estimate-costs="precision=fp8" 2>&1 | FileCheck %s --check-prefix=PRECISION
// RUN: not pipec-opt %s --pipec-estimate-costs="profile=%t.missing.json" 2>&1 | FileCheck %s --check-prefix=MISSING
// RUN: echo '{"format": "pipec.profile/1", "ops": [{"name": "nn.relu", "fwd_s": 1.0, "bwd_input_s": 2.0, "bwd_weight_s": 0}, {"name": "conv9", "fwd_s": 1, "bwd_input_s": 1, "bwd_weight_s": 1}]}' > %t.other.json
// RUN: not pipec-opt %s --pipec-estimate-costs="profile=%t.other.json" 2>&1 | FileCheck %s --check-prefix=OTHER
// RUN: echo '{"format": "pipec.profile/1", "ops": [{"name": "nn.relu", "fwd_s": 1.5, "bwd_input_s": 2.5, "bwd_weight_s": 0}]}' > %t.good.json
// RUN: pipec-opt %s --pipec-estimate-costs="profile=%t.good.json" | FileCheck %s --check-prefix=PROFILE
// RUN: echo '{"format": "pipec.profile/1", "ops": [{"name": "nn.relu"}]}' > %t.bad.json
// RUN: not pipec-opt %s --pipec-estimate-costs="profile=%t.bad.json" 2>&1 | FileCheck %s --check-prefix=MALFORMED

// DEVICE: error: unknown device preset 'TPU' (known: V100, A100, H100, H200)
// PRECISION: error: pipec-estimate-costs: precision=fp8: expected fp32, tf32 or bf16
// MISSING: error: cannot read profile '{{.*}}missing.json'
// OTHER: error: profile '{{.*}}other.json' names ops this model does not have: 'conv9' (a profile of another model?)
// PROFILE: nn.relu %{{.*}} {pipe.cost = #pipe.cost<name = {{"[^"]*"}}, fwd = 1.5, bwd_input = 2.5, bwd_weight = 0.0, {{.*}}activation_bytes = 128, {{.*}}source = "profile">}
// MALFORMED: error: profile '{{.*}}bad.json' is malformed:

func.func @f(%x: tensor<32xf32> {nn.name = "x", nn.role = #nn.role<input>}, %w: tensor<32xf32> {nn.name = "w", nn.role = #nn.role<param>}) -> tensor<32xf32> {
  %0 = nn.mul %x, %w : (tensor<32xf32>, tensor<32xf32>) -> tensor<32xf32>
  %1 = nn.relu %0 : tensor<32xf32>
  return %1 : tensor<32xf32>
}
