// RUN: pipec-opt %s -split-input-file -verify-diagnostics --pipec-optimizer

// A parameter without a gradient breaks the autodiff contract.
// expected-error @+1 {{pipec-optimizer: parameter 'fc.bias' has no gradient among @train_step's results}}
func.func @train_step(%w: tensor<4x8xf32> {nn.name = "fc.weight", nn.role = #nn.role<param>},
                      %b: tensor<8xf32> {nn.name = "fc.bias", nn.role = #nn.role<param>})
    -> (tensor<f32> {nn.name = "loss", nn.role = #nn.role<loss>},
        tensor<4x8xf32> {nn.name = "fc.weight", nn.role = #nn.role<grad>}) {
  %l = nn.constant dense<0.0> : tensor<f32>
  return %l, %w : tensor<f32>, tensor<4x8xf32>
}

// -----

// expected-error @+1 {{pipec-optimizer: the gradient of 'fc.bias' has type 'tensor<4xf32>', the parameter 'tensor<8xf32>'}}
func.func @train_step(%b: tensor<8xf32> {nn.name = "fc.bias", nn.role = #nn.role<param>}, %g: tensor<4xf32>)
    -> (tensor<f32> {nn.name = "loss", nn.role = #nn.role<loss>},
        tensor<4xf32> {nn.name = "fc.bias", nn.role = #nn.role<grad>}) {
  %l = nn.constant dense<0.0> : tensor<f32>
  return %l, %g : tensor<f32>, tensor<4xf32>
}

// -----

// expected-error @+1 {{pipec-optimizer: no @train_step; run pipec-autodiff first}}
module {
  func.func @forward() {
    return
  }
}
