// The three-stage @train_step of outline-stages.mlir, shared by recompute.mlir and
// weight-stashing.mlir (see there for what it exercises).
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
