// `pipe.phase` on an op, `pipe.optimizer` on a step function and `pipe.state`
// on its arguments and results are typed #pipe.phase<...>,
// #pipe.optimizer<...> and #pipe.state<...>: the pipe dialect rejects a
// string or an attribute of another kind, and the parser an unknown value.
// RUN: pipec-opt %s -split-input-file -verify-diagnostics | FileCheck %s

// CHECK-LABEL: func.func @typed
// CHECK-SAME: pipe.state = #pipe.state<exp_avg>
// CHECK-SAME: pipe.state = #pipe.state<exp_avg_sq>
// CHECK-SAME: pipe.optimizer = #pipe.optimizer<kind = adamw, lr = 0.001, momentum = 0.0, weight_decay = 0.01, beta1 = 0.90000000000000002, beta2 = 0.999, epsilon = 1.0e-08, state_per_param = 2>
// CHECK: nn.constant {{.*}}pipe.phase = #pipe.phase<fwd>
// CHECK: nn.constant {{.*}}pipe.phase = #pipe.phase<bwd_input>
// CHECK: nn.constant {{.*}}pipe.phase = #pipe.phase<bwd_weight>
func.func @typed(%m: tensor<4xf32> {pipe.state = #pipe.state<exp_avg>})
    -> (tensor<4xf32> {pipe.state = #pipe.state<exp_avg_sq>})
    attributes {pipe.optimizer = #pipe.optimizer<kind = adamw, lr = 0.001, momentum = 0.0,
        weight_decay = 0.01, beta1 = 0.90000000000000002, beta2 = 0.999, epsilon = 1.0e-08,
        state_per_param = 2>} {
  %0 = nn.constant {pipe.phase = #pipe.phase<fwd>} dense<0.0> : tensor<f32>
  %1 = nn.constant {pipe.phase = #pipe.phase<bwd_input>} dense<0.0> : tensor<f32>
  %2 = nn.constant {pipe.phase = #pipe.phase<bwd_weight>} dense<0.0> : tensor<f32>
  return %m : tensor<4xf32>
}

// -----

// CHECK-LABEL: func.func @sgd
// CHECK-SAME: pipe.state = #pipe.state<momentum_buffer>
// CHECK-SAME: pipe.optimizer = #pipe.optimizer<kind = sgd, lr = 0.10000000000000001, momentum = 0.90000000000000002, weight_decay = 0.0, beta1 = 0.0, beta2 = 0.0, epsilon = 0.0, state_per_param = 1>
func.func @sgd(%m: tensor<4xf32> {pipe.state = #pipe.state<momentum_buffer>})
    attributes {pipe.optimizer = #pipe.optimizer<kind = sgd, lr = 0.1, momentum = 0.9,
        weight_decay = 0.0, beta1 = 0.0, beta2 = 0.0, epsilon = 0.0, state_per_param = 1>} {
  return
}

// -----

func.func @string_phase() {
  // expected-error @+1 {{pipe.phase must be a #pipe.phase<...> (fwd, bwd_input, bwd_weight), got "fwd"}}
  %0 = nn.constant {pipe.phase = "fwd"} dense<0.0> : tensor<f32>
  return
}

// -----

func.func @unknown_phase() {
  // expected-error @+2 {{expected ::pipec::pipe::Phase to be one of: fwd, bwd_input, bwd_weight}}
  // expected-error @+1 {{failed to parse Pipe_PhaseAttr parameter 'value'}}
  %0 = nn.constant {pipe.phase = #pipe.phase<bwd>} dense<0.0> : tensor<f32>
  return
}

// -----

// expected-error @+1 {{argument #0: pipe.state must be a #pipe.state<...> (momentum_buffer, exp_avg, exp_avg_sq), got "exp_avg"}}
func.func @string_state(%m: tensor<4xf32> {pipe.state = "exp_avg"}) {
  return
}

// -----

// expected-error @+1 {{result #0: pipe.state must be a #pipe.state<...>}}
func.func @string_result_state(%m: tensor<4xf32>) -> (tensor<4xf32> {pipe.state = "exp_avg_sq"}) {
  return %m : tensor<4xf32>
}

// -----

// expected-error @+2 {{expected ::pipec::pipe::OptimizerState to be one of: momentum_buffer, exp_avg, exp_avg_sq}}
// expected-error @+1 {{failed to parse Pipe_StateAttr parameter 'value'}}
func.func @unknown_state(%m: tensor<4xf32> {pipe.state = #pipe.state<velocity>}) {
  return
}

// -----

// expected-error @+1 {{pipe.optimizer must be a #pipe.optimizer<...>, got {kind = "sgd"}}}
func.func @dictionary_optimizer() attributes {pipe.optimizer = {kind = "sgd"}} {
  return
}

// -----

// expected-error @+2 {{expected ::pipec::pipe::OptimizerKind to be one of: sgd, adamw}}
// expected-error @+1 {{failed to parse Pipe_OptimizerAttr parameter 'kind'}}
func.func @unknown_optimizer() attributes {pipe.optimizer = #pipe.optimizer<kind = lion, lr = 0.1,
    momentum = 0.0, weight_decay = 0.0, beta1 = 0.0, beta2 = 0.0, epsilon = 0.0, state_per_param = 1>} {
  return
}

// -----

// expected-error @+1 {{pipe.optimizer: adamw keeps 2 state tensors per parameter, got 1}}
func.func @wrong_state_count() attributes {pipe.optimizer = #pipe.optimizer<kind = adamw, lr = 0.1,
    momentum = 0.0, weight_decay = 0.0, beta1 = 0.9, beta2 = 0.999, epsilon = 1.0e-08, state_per_param = 1>} {
  return
}
