// The cost pass computes byte sizes with checked arithmetic: a tensor whose
// size does not fit (or exceeds the cost table's 16 TiB per op) is refused,
// naming the op and its ONNX node, instead of wrapping around (a batch of 2^62
// once planned with activations of "4 B"). Hand-written pipe.cost annotations
// are checked when the partitioner reads them back.
// RUN: not pipec-opt %s -split-input-file --pipec-estimate-costs 2>&1 | FileCheck %s
// RUN: not pipec-opt %s -split-input-file --pipec-estimate-costs="launch-overhead=-1" 2>&1 | FileCheck %s --check-prefix=OVERHEAD

// CHECK: error: {{.*}}'nn.matmul' op (node 'big_matmul'): result 0 of shape 4611686018427387904x4 needs more than 2^63 bytes, over the limit of 17592186044416 (16 TiB)
func.func @batch(%w: tensor<4x4xf32> {nn.name = "w", nn.role = #nn.role<param>},
                 %x: tensor<4611686018427387904x4xf32> {nn.name = "x", nn.role = #nn.role<input>})
    -> tensor<4611686018427387904x4xf32> {
  %0 = nn.matmul %x, %w : (tensor<4611686018427387904x4xf32>, tensor<4x4xf32>) -> tensor<4611686018427387904x4xf32> loc("big_matmul")
  return %0 : tensor<4611686018427387904x4xf32>
}

// -----

// A parameter of 2^45 floats (128 TiB).
// CHECK: error: {{.*}}'nn.mul' op (node 'scale'): parameter operand 1 of shape 35184372088832 needs 140737488355328 bytes, over the limit of 17592186044416 (16 TiB)
func.func @weights(%x: tensor<35184372088832xf32> {nn.name = "x", nn.role = #nn.role<input>},
                   %w: tensor<35184372088832xf32> {nn.name = "w", nn.role = #nn.role<param>}) -> tensor<35184372088832xf32> {
  %0 = nn.mul %x, %w : (tensor<35184372088832xf32>, tensor<35184372088832xf32>) -> tensor<35184372088832xf32> loc("scale")
  return %0 : tensor<35184372088832xf32>
}

// OVERHEAD: error: pipec-estimate-costs: launch-overhead=-1: must be finite and in [0, 1]
