// RUN: pipec-opt %s -split-input-file -verify-diagnostics

// expected-error @+1 {{'pipe.stage' op lists 1 ranks for 2 replicas}}
pipe.stage @s attributes {id = 0 : i64, replicas = 2 : i64, ranks = array<i64: 3>} {
}

// -----

// expected-error @+1 {{'pipe.stage' op replicas must be at least 1, got 0}}
pipe.stage @s attributes {id = 0 : i64, replicas = 0 : i64} {
}

// -----

// expected-error @+1 {{'pipe.stage' op stage id must be non-negative, got -1}}
pipe.stage @s attributes {id = -1 : i64} {
}

// -----

pipe.stage @s attributes {id = 2 : i64} {
  func.func @fwd(%x: tensor<4xf32>) {
    // expected-error @+1 {{'pipe.send' op stage 2 cannot communicate with itself}}
    pipe.send %x to 2 tag 0 : tensor<4xf32>
    return
  }
}

// -----

func.func @recv_tag() {
  // expected-error @+1 {{'pipe.recv' op tag must be non-negative, got -3}}
  %x = pipe.recv from 1 tag -3 : tensor<4xf32>
  return
}

// -----

func.func @recv_dynamic() {
  // expected-error @+1 {{'pipe.recv' op result #0 must be statically shaped tensor}}
  %x = pipe.recv from 1 tag 0 : tensor<?xf32>
  return
}

// -----

func.func @allreduce(%g: tensor<4xf32>) {
  // expected-error @+1 {{'pipe.allreduce' op reduction must be "mean" or "sum", got "max"}}
  %r = pipe.allreduce %g {reduction = "max"} : tensor<4xf32>
  return
}

// -----

func.func @stash(%w: tensor<4xf32>, %mb: index) {
  // expected-error @+1 {{'pipe.stash' op needs at least one slot, got 0}}
  pipe.stash %w for %mb {name = "w", slots = 0 : i64} : tensor<4xf32>
  return
}

// -----

func.func @recompute(%x: tensor<4xf32>) {
  // expected-error @+1 {{'pipe.recompute' op yields types that differ from its result types}}
  %y = pipe.recompute(%x) : (tensor<4xf32>) -> tensor<8xf32> {
  ^bb0(%a: tensor<4xf32>):
    pipe.yield %a : tensor<4xf32>
  }
  return
}

// -----

func.func @allreduce_tied_unnamed(%g: tensor<4xf32>) {
  // expected-error @+1 {{'pipe.allreduce' op over tied stages needs the parameter's name}}
  %r = pipe.allreduce %g {reduction = "sum", stages = array<i64: 0, 2>} : tensor<4xf32>
  return
}

// -----

func.func @allreduce_tied_order(%g: tensor<4xf32>) {
  // expected-error @+1 {{'pipe.allreduce' op tied stages must be non-negative and strictly increasing}}
  %r = pipe.allreduce %g {name = "w", reduction = "sum", stages = array<i64: 2, 0>} : tensor<4xf32>
  return
}

// -----

pipe.stage @s attributes {id = 1 : i64} {
  func.func @step(%g: tensor<4xf32>) {
    // expected-error @+1 {{'pipe.allreduce' op tied stages do not include the enclosing stage 1}}
    %r = pipe.allreduce %g {name = "w", reduction = "sum", stages = array<i64: 0, 2>} : tensor<4xf32>
    return
  }
}
