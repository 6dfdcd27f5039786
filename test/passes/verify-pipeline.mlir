// RUN: pipec-opt %s -split-input-file -verify-diagnostics --pipec-verify-pipeline

// A well-formed pipeline: no diagnostics.
module {
  pipe.stage @stage_0 attributes {id = 0 : i64} {
    func.func @fwd(%x: tensor<4xf32> {nn.name = "x", nn.role = #nn.role<input>}) -> (tensor<4xf32> {pipe.saved = "x"}) {
      pipe.send %x to 1 tag 0 : tensor<4xf32>
      return %x : tensor<4xf32>
    }
    func.func @bwd_input(%x: tensor<4xf32> {pipe.saved = "x"}) {
      %g = pipe.recv from 1 tag 1 : tensor<4xf32>
      return
    }
    func.func @bwd_weight(%x: tensor<4xf32> {pipe.saved = "x"}) {
      return
    }
    func.func @step(%p: tensor<4xf32>, %g: tensor<4xf32>) {
      %s = pipe.allreduce %g {name = "w", reduction = "sum", stages = array<i64: 0, 1>} : tensor<4xf32>
      return
    }
  }
  pipe.stage @stage_1 attributes {id = 1 : i64} {
    func.func @fwd() {
      %x = pipe.recv from 0 tag 0 : tensor<4xf32>
      return
    }
    func.func @bwd_input(%l: tensor<f32>) {
      %g = nn.constant dense<1.0> : tensor<4xf32>
      pipe.send %g to 0 tag 1 : tensor<4xf32>
      return
    }
    func.func @bwd_weight() {
      return
    }
    func.func @step(%p: tensor<4xf32>, %g: tensor<4xf32>) {
      %s = pipe.allreduce %g {name = "w", reduction = "sum", stages = array<i64: 0, 1>} : tensor<4xf32>
      return
    }
  }
}

// -----

module {
  pipe.stage @stage_0 attributes {id = 0 : i64} {
    func.func @fwd(%x: tensor<4xf32>) {
      // expected-error @+1 {{stage 0: pipe.send to stage 1 tag 3 in @fwd has no matching pipe.recv in stage 1}}
      pipe.send %x to 1 tag 3 : tensor<4xf32>
      return
    }
    func.func @bwd_input() {
      return
    }
    func.func @bwd_weight() {
      return
    }
    func.func @step() {
      return
    }
  }
  pipe.stage @stage_1 attributes {id = 1 : i64} {
    func.func @fwd() {
      // expected-error @+1 {{stage 1: pipe.recv from stage 0 tag 2 in @fwd has no matching pipe.send in stage 0}}
      %x = pipe.recv from 0 tag 2 : tensor<4xf32>
      return
    }
    func.func @bwd_input() {
      return
    }
    func.func @bwd_weight() {
      return
    }
    func.func @step() {
      return
    }
  }
}

// -----

module {
  pipe.stage @stage_0 attributes {id = 0 : i64} {
    func.func @fwd(%x: tensor<4xf32>) {
      // expected-error @+1 {{stage 0: pipe.send to stage 2 tag 0 in @fwd: the peer must be the neighbour stage 1}}
      pipe.send %x to 2 tag 0 : tensor<4xf32>
      pipe.send %x to 1 tag 1 : tensor<4xf32>
      return
    }
    func.func @bwd_input(%x: tensor<4xf32>) {
      // expected-error @+1 {{stage 0: pipe.send to stage 1 tag 5 in @bwd_input: the peer must be the neighbour stage -1 (which does not exist)}}
      pipe.send %x to 1 tag 5 : tensor<4xf32>
      return
    }
    func.func @bwd_weight(%x: tensor<4xf32>) {
      // expected-error @+1 {{stage 0: pipe.send to stage 1 tag 6 in @bwd_weight: stages communicate only in @fwd and @bwd_input}}
      pipe.send %x to 1 tag 6 : tensor<4xf32>
      return
    }
    func.func @step() {
      return
    }
  }
  pipe.stage @stage_1 attributes {id = 1 : i64} {
    func.func @fwd() {
      // expected-error @+1 {{stage 1: pipe.recv from stage 0 tag 1 in @fwd receives 'tensor<8xf32>' but stage 0 sends 'tensor<4xf32>'}}
      %x = pipe.recv from 0 tag 1 : tensor<8xf32>
      return
    }
    func.func @bwd_input() {
      return
    }
    func.func @bwd_weight() {
      return
    }
    func.func @step() {
      return
    }
  }
  pipe.stage @stage_2 attributes {id = 2 : i64} {
    func.func @fwd() {
      // expected-error @+1 {{stage 2: 'nn.constant' in @fwd belongs to stage 1 (pipe.stage)}}
      %x = nn.constant {pipe.stage = 1 : i64} dense<1.0> : tensor<4xf32>
      return
    }
    func.func @bwd_input() {
      return
    }
    func.func @bwd_weight() {
      return
    }
    func.func @step() {
      return
    }
  }
}

// -----

module {
  // expected-error @+1 {{stage 0: has no @step}}
  pipe.stage @stage_0 attributes {id = 0 : i64} {
    func.func @fwd(%x: tensor<4xf32>) -> (tensor<4xf32> {pipe.saved = "a"}, tensor<4xf32> {pipe.saved = "b"}) {
      return %x, %x : tensor<4xf32>, tensor<4xf32>
    }
    // expected-error @+2 {{stage 0: @bwd_input argument #0 takes saved value 'a' as 'tensor<8xf32>' but @fwd returns 'tensor<4xf32>'}}
    // expected-error @+1 {{stage 0: saved value 'b' is returned by both @fwd and @bwd_input}}
    func.func @bwd_input(%a: tensor<8xf32> {pipe.saved = "a"}, %x: tensor<4xf32>) -> (tensor<4xf32> {pipe.saved = "b"}) {
      return %x : tensor<4xf32>
    }
    // expected-error @+1 {{stage 0: @bwd_weight argument #0 takes saved value 'c', which no earlier function of the stage returns}}
    func.func @bwd_weight(%c: tensor<4xf32> {pipe.saved = "c"}) {
      return
    }
  }
}

// -----

// expected-error @+1 {{stage ids must be 0..0: stage 0 is missing}}
module {
  pipe.stage @stage_3 attributes {id = 3 : i64} {
    func.func @fwd() {
      return
    }
    func.func @bwd_input() {
      return
    }
    func.func @bwd_weight() {
      return
    }
    func.func @step() {
      return
    }
  }
}

// -----

module {
  pipe.stage @stage_0 attributes {id = 0 : i64} {
    func.func @fwd(%w: tensor<4xf32>, %mb: index) {
      pipe.stash %w for %mb {name = "w", slots = 2 : i64} : tensor<4xf32>
      return
    }
    func.func @bwd_input(%mb: index) {
      // expected-error @+1 {{stage 0: pipe.restore of 'w' in @bwd_input differs from its pipe.stash in slots or type}}
      %w = pipe.restore %mb {name = "w", slots = 3 : i64} : tensor<4xf32>
      return
    }
    func.func @bwd_weight(%mb: index) {
      // expected-error @+1 {{stage 0: pipe.restore of 'v' in @bwd_weight has no pipe.stash in @fwd}}
      %v = pipe.restore %mb {name = "v", slots = 2 : i64} : tensor<4xf32>
      return
    }
    func.func @step(%g: tensor<4xf32>) {
      // expected-error @+1 {{stage 0: the all-reduce of tied parameter 'w' names stage 1, which has no matching all-reduce}}
      %s = pipe.allreduce %g {name = "w", reduction = "sum", stages = array<i64: 0, 1>} : tensor<4xf32>
      return
    }
  }
  pipe.stage @stage_1 attributes {id = 1 : i64} {
    func.func @fwd() {
      return
    }
    func.func @bwd_input() {
      return
    }
    func.func @bwd_weight() {
      return
    }
    func.func @step(%g: tensor<8xf32>) {
      // expected-error @+1 {{stage 1: the all-reduce of tied parameter 'w' names stage 0, which has no matching all-reduce}}
      %s = pipe.allreduce %g {name = "w", reduction = "sum", stages = array<i64: 0, 1>} : tensor<8xf32>
      return
    }
  }
}
