// RUN: pipec-opt %s --split-input-file --verify-diagnostics

func.func @storage_count(%x: tensor<4xf32>) -> tensor<4xf32> {
  // expected-error @+1 {{pipe.storage lists 2 places for 1 results}}
  %a = nn.relu %x {pipe.storage = [#pipe.storage<arena, 0>, #pipe.storage<arena, 64>]} : tensor<4xf32>
  return %a : tensor<4xf32>
}

// -----

func.func @storage_aligned(%x: tensor<4xf32>) -> tensor<4xf32> {
  // expected-error @+1 {{arena offsets are 64-byte aligned, got 8}}
  %a = nn.relu %x {pipe.storage = [#pipe.storage<arena, 8>]} : tensor<4xf32>
  return %a : tensor<4xf32>
}

// -----

// expected-error @+1 {{pipe.arena_size must be a non-negative integer}}
func.func @arena_size(%x: tensor<4xf32>) -> tensor<4xf32> attributes {pipe.arena_size = -64 : i64} {
  return %x : tensor<4xf32>
}

// -----

func.func @fused_shapes(%x: tensor<4xf32>, %y: tensor<2xf32>) -> tensor<4xf32> {
  %r = pipe.fused(%x, %y) : (tensor<4xf32>, tensor<2xf32>) -> tensor<4xf32> {
  ^bb0(%a: tensor<4xf32>, %b: tensor<2xf32>):
    // expected-error @+1 {{in a pipe.fused body has a result shape other than the loop's}}
    %c = nn.relu %b : tensor<2xf32>
    %d = nn.relu %a : tensor<4xf32>
    pipe.yield %d : tensor<4xf32>
  }
  return %r : tensor<4xf32>
}

// -----

// expected-error @+1 {{pipe.thread_scratch_size must be a non-negative integer}}
func.func @thread_scratch_size(%x: tensor<4xf32>) -> tensor<4xf32> attributes {pipe.thread_scratch_size = -1 : i64} {
  return %x : tensor<4xf32>
}

// -----

func.func @scratch(%x: tensor<4x8xf32>) -> tensor<8xf32> {
  // expected-error @+1 {{pipe.scratch must be array<i64: offset, bytes>}}
  %y = nn.reduce_sum %x {axes = array<i64: 0>, keepdims = false, pipe.scratch = array<i64: 32, 64>} : (tensor<4x8xf32>) -> tensor<8xf32>
  return %y : tensor<8xf32>
}

// -----

// pipec-estimate-costs' mark on the ops of one -O2 composite.
func.func @fused_chain_negative(%x: tensor<4xf32>) -> tensor<4xf32> {
  // expected-error @+1 {{pipe.fused_chain must be a non-negative integer}}
  %a = nn.relu %x {pipe.fused_chain = -1 : i64} : tensor<4xf32>
  return %a : tensor<4xf32>
}
