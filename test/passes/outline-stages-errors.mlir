// RUN: pipec-opt %s -split-input-file -verify-diagnostics --pipec-optimizer --pipec-outline-stages

// expected-error @+1 {{pipec-outline-stages: the module has no pipe.stages; run pipec-partition first}}
module {
  func.func @train_step(%w: tensor<4xf32> {nn.name = "w", nn.role = #nn.role<param>})
      -> (tensor<f32> {nn.name = "loss", nn.role = #nn.role<loss>}, tensor<4xf32> {nn.name = "w", nn.role = #nn.role<grad>}) {
    %l = nn.constant dense<0.0> : tensor<f32>
    return %l, %w : tensor<f32>, tensor<4xf32>
  }
}

// -----

module attributes {pipe.stages = [{id = 0 : i64, replicas = 1 : i64}, {id = 1 : i64, replicas = 1 : i64}]} {
  func.func @train_step(%w: tensor<4xf32> {nn.name = "w", nn.role = #nn.role<param>}, %x: tensor<4xf32> {nn.name = "x", nn.role = #nn.role<input>})
      -> (tensor<f32> {nn.name = "loss", nn.role = #nn.role<loss>}, tensor<4xf32> {nn.name = "w", nn.role = #nn.role<grad>}) {
    // expected-error @+1 {{pipec-outline-stages: op has no pipe.stage}}
    %a = nn.relu %x : tensor<4xf32>
    %l = nn.reduce_mean %a {axes = array<i64: 0>, keepdims = false, pipe.stage = 1 : i64, pipe.phase = #pipe.phase<fwd>} : (tensor<4xf32>) -> tensor<f32>
    return %l, %w : tensor<f32>, tensor<4xf32>
  }
}

// -----

module attributes {pipe.stages = [{id = 0 : i64, replicas = 1 : i64}, {id = 1 : i64, replicas = 1 : i64}]} {
  func.func @train_step(%w: tensor<4xf32> {nn.name = "w", nn.role = #nn.role<param>}, %x: tensor<4xf32> {nn.name = "x", nn.role = #nn.role<input>})
      -> (tensor<f32> {nn.name = "loss", nn.role = #nn.role<loss>}, tensor<4xf32> {nn.name = "w", nn.role = #nn.role<grad>}) {
    // expected-error @+1 {{pipec-outline-stages: pipe.stage 5 is not one of the 2 stages in pipe.stages}}
    %a = nn.relu %x {pipe.stage = 5 : i64, pipe.phase = #pipe.phase<fwd>} : tensor<4xf32>
    %l = nn.reduce_mean %a {axes = array<i64: 0>, keepdims = false, pipe.stage = 1 : i64, pipe.phase = #pipe.phase<fwd>} : (tensor<4xf32>) -> tensor<f32>
    return %l, %w : tensor<f32>, tensor<4xf32>
  }
}

// -----

module attributes {pipe.stages = [{id = 0 : i64, replicas = 1 : i64}, {id = 1 : i64, replicas = 1 : i64}]} {
  func.func @train_step(%w: tensor<4xf32> {nn.name = "w", nn.role = #nn.role<param>}, %x: tensor<4xf32> {nn.name = "x", nn.role = #nn.role<input>})
      -> (tensor<f32> {nn.name = "loss", nn.role = #nn.role<loss>}, tensor<4xf32> {nn.name = "w", nn.role = #nn.role<grad>}) {
    %a = nn.mul %x, %w {pipe.stage = 1 : i64, pipe.phase = #pipe.phase<fwd>} : (tensor<4xf32>, tensor<4xf32>) -> tensor<4xf32>
    // expected-error @+1 {{pipec-outline-stages: stage 0 uses a forward value of the later stage 1}}
    %b = nn.relu %a {pipe.stage = 0 : i64, pipe.phase = #pipe.phase<fwd>} : tensor<4xf32>
    %l = nn.reduce_mean %b {axes = array<i64: 0>, keepdims = false, pipe.stage = 1 : i64, pipe.phase = #pipe.phase<fwd>} : (tensor<4xf32>) -> tensor<f32>
    %seed = nn.constant {pipe.stage = 1 : i64, pipe.phase = #pipe.phase<bwd_input>} dense<1.0> : tensor<f32> loc("loss_seed")
    return %l, %w : tensor<f32>, tensor<4xf32>
  }
}

// -----

// A weight gradient computed in stage 1 cannot reach stage 0.
module attributes {pipe.stages = [{id = 0 : i64, replicas = 1 : i64}, {id = 1 : i64, replicas = 1 : i64}]} {
  func.func @train_step(%w: tensor<4xf32> {nn.name = "w", nn.role = #nn.role<param>}, %x: tensor<4xf32> {nn.name = "x", nn.role = #nn.role<input>})
      -> (tensor<f32> {nn.name = "loss", nn.role = #nn.role<loss>}, tensor<4xf32> {nn.name = "w", nn.role = #nn.role<grad>}) {
    %c = nn.constant dense<3.0> : tensor<4xf32>
    %a = nn.mul %x, %w {pipe.stage = 0 : i64, pipe.phase = #pipe.phase<fwd>} : (tensor<4xf32>, tensor<4xf32>) -> tensor<4xf32>
    %l = nn.reduce_mean %a {axes = array<i64: 0>, keepdims = false, pipe.stage = 1 : i64, pipe.phase = #pipe.phase<fwd>} : (tensor<4xf32>) -> tensor<f32>
    %seed = nn.constant {pipe.stage = 1 : i64, pipe.phase = #pipe.phase<bwd_input>} dense<1.0> : tensor<f32> loc("loss_seed")
    %g = nn.mul %seed, %c {pipe.stage = 1 : i64, pipe.phase = #pipe.phase<bwd_weight>} : (tensor<f32>, tensor<4xf32>) -> tensor<4xf32>
    // expected-error @+1 {{pipec-outline-stages: stage 0 uses a weight-gradient (bwd_weight) value of stage 1; weight gradients cannot cross stages}}
    %dw = nn.add %g, %x {pipe.stage = 0 : i64, pipe.phase = #pipe.phase<bwd_weight>} : (tensor<4xf32>, tensor<4xf32>) -> tensor<4xf32>
    return %l, %dw : tensor<f32>, tensor<4xf32>
  }
}

// -----

module attributes {pipe.stages = [{id = 0 : i64, replicas = 1 : i64}]} {
  func.func @train_step(%w: tensor<4xf32> {nn.name = "w", nn.role = #nn.role<param>}, %x: tensor<4xf32> {nn.name = "x", nn.role = #nn.role<input>})
      -> (tensor<f32> {nn.name = "loss", nn.role = #nn.role<loss>}, tensor<4xf32> {nn.name = "w", nn.role = #nn.role<grad>}) {
    %a = nn.mul %x, %w {pipe.stage = 0 : i64, pipe.phase = #pipe.phase<fwd>} : (tensor<4xf32>, tensor<4xf32>) -> tensor<4xf32>
    %l = nn.reduce_mean %a {axes = array<i64: 0>, keepdims = false, pipe.stage = 0 : i64, pipe.phase = #pipe.phase<fwd>} : (tensor<4xf32>) -> tensor<f32>
    // expected-error @+1 {{pipec-outline-stages: @train_step has no loss seed}}
    return %l, %x : tensor<f32>, tensor<4xf32>
  }
}
