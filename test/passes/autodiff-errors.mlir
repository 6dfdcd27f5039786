// RUN: not pipec-opt %s -split-input-file --pipec-autodiff 2>&1 | FileCheck %s

// CHECK: error: the first result of @forward must be a scalar loss (run pipec-append-loss), got 'tensor<2x4xf32>'
func.func @forward(%x: tensor<2x4xf32> {nn.name = "x", nn.role = #nn.role<input>}) -> tensor<2x4xf32> {
  return %x : tensor<2x4xf32>
}

// -----

// CHECK: error: has no func.func @forward to differentiate
func.func @other() {
  return
}
