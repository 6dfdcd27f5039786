// `nn.role` on a function argument or result is a typed #nn.role<...>: the
// nn dialect rejects a string or an attribute of another kind, and the
// parser an unknown role.
// RUN: pipec-opt %s -split-input-file -verify-diagnostics | FileCheck %s

// CHECK-LABEL: func.func @roles
// CHECK-SAME: {nn.name = "w", nn.role = #nn.role<param>}
// CHECK-SAME: {nn.role = #nn.role<microbatch>}
// CHECK-SAME: -> (tensor<f32> {nn.role = #nn.role<loss>})
func.func @roles(%w: tensor<4xf32> {nn.name = "w", nn.role = #nn.role<param>},
                 %mb: index {nn.role = #nn.role<microbatch>}) -> (tensor<f32> {nn.role = #nn.role<loss>}) {
  %0 = nn.constant dense<0.0> : tensor<f32>
  return %0 : tensor<f32>
}

// -----

// expected-error @+1 {{argument #0: nn.role must be a #nn.role<...> (param, buffer, input, label, loss, grad, buffer_update, optimizer_state, step, loss_scale, microbatch), got "param"}}
func.func @string_argument_role(%w: tensor<4xf32> {nn.role = "param"}) {
  return
}

// -----

// expected-error @+1 {{result #0: nn.role must be a #nn.role<...>}}
func.func @string_result_role() -> (tensor<f32> {nn.role = "loss"}) {
  %0 = nn.constant dense<0.0> : tensor<f32>
  return %0 : tensor<f32>
}

// -----

// expected-error @+1 {{argument #1: nn.role must be a #nn.role<...>}}
func.func @other_attribute(%x: tensor<4xf32>, %y: tensor<4xf32> {nn.role = 3 : i32}) {
  return
}

// -----

// expected-error @+2 {{expected ::pipec::nn::Role to be one of: param, buffer}}
// expected-error @+1 {{failed to parse NN_RoleAttr parameter 'value'}}
func.func @unknown_role(%w: tensor<4xf32> {nn.role = #nn.role<weight>}) {
  return
}
