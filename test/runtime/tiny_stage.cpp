// A hand-written stage library implementing pipec's stage ABI for a tiny
// MLP, the test double of the compiler's generated code. Built once per
// stage with compile definitions:
//   TINY_STAGE (virtual stage id), TINY_NUM_STAGES, TINY_DIMS (layer widths,
//   TINY_NUM_STAGES+1 values), TINY_BATCH (micro-batch size), TINY_ADAMW
//   (0: SGD with momentum, 1: AdamW), TINY_ABI (ABI version it claims),
//   TINY_TIED (1: the first and last stages share "tied.weight", below).
// Stage k is fc_k: h_{k+1} = tanh(h_k W_k^T + b_k); the first stage reads the
// data field "x" through a dropout keyed by (seed, step, micro-batch), the
// last stage outputs no activation, reads "y" and returns the loss
// 0.5 * mean((z - y)^2). So a test checks that the runtime passes the right
// step/micro-batch/seed and re-runs forwards (RECOMPUTE) with the same keys.
// With TINY_TIED (widths d0,d1,...,d1,d0) the first stage's weight and the
// last stage's weight are one tied parameter "tied.weight" of shape [d1, d0]
// (like GPT's token embedding and output head): the first stage computes
// x E^T, the last h E, and each stage's backward_weight returns only its own
// partial gradient; the runtime sums them (runtime.tied).
#include "pipec/stage_abi.h"

#include <chrono>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#ifndef TINY_ABI
#define TINY_ABI PIPEC_STAGE_ABI_VERSION
#endif

namespace {
constexpr int kDims[] = {TINY_DIMS};
constexpr int S = TINY_STAGE, P = TINY_NUM_STAGES, B = TINY_BATCH;
constexpr int Din = kDims[S], Dout = kDims[S + 1];
constexpr bool kFirst = S == 0, kLast = S == P - 1;
static_assert(sizeof(kDims) / sizeof(int) == P + 1, "TINY_DIMS needs TINY_NUM_STAGES+1 widths");
#ifndef TINY_TIED
#define TINY_TIED 0
#endif
constexpr bool kTied = TINY_TIED && (kFirst || kLast);
// The last stage of a tied model stores its weight as [Din, Dout] (= the
// first stage's [Dout, Din]) and uses it transposed.
constexpr bool kTransposed = TINY_TIED && kLast && !kFirst;
static_assert(!kTransposed || (Din == kDims[1] && Dout == kDims[0]), "TINY_TIED needs widths d0,d1,...,d1,d0");
inline int widx(int o, int i) { return kTransposed ? i * Dout + o : o * Din + i; }

const int64_t wShape[] = {kTransposed ? Din : Dout, kTransposed ? Dout : Din}, bShape[] = {Dout}, inShape[] = {B, Din},
              outShape[] = {B, Dout};
const std::string wName = kTied ? "tied.weight" : "fc" + std::to_string(S) + ".weight",
                  bName = "fc" + std::to_string(S) + ".bias";
const std::string inName = "h" + std::to_string(S), outName = "h" + std::to_string(S + 1);
const std::string opName = "fc" + std::to_string(S);

pipec_param_desc params[2];
pipec_tensor_desc data[1], inputs[1], outputs[1];
pipec_stage_desc desc;
std::string lastError;

// Workspace: the input actually used (after dropout), z or tanh(z), dz.
struct Workspace {
  float xin[B * Din], act[B * Dout], dz[B * Dout];
};

int fail(const std::string &m) {
  lastError = "stage " + std::to_string(S) + ": " + m;
  return 1;
}

uint64_t mix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}
// Keep with probability 0.8, scaled by 1/0.8: deterministic in (seed, step, micro-batch, element).
float dropoutScale(const pipec_call *c, int e) {
  const uint64_t h = mix64(mix64(mix64(c->seed) ^ (uint64_t)c->step * 0x100000001b3ULL) ^ ((uint64_t)c->microbatch << 20) ^ e);
  return (h % 10) < 8 ? 1.25f : 0.0f;
}

double seconds() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }
void timed(const pipec_call *c, int phase, double t0) {
  if (c->timer) c->timer(c->timer_user, opName.c_str(), phase, seconds() - t0);
}

struct Init {
  Init() {
    params[0] = {{wName.c_str(), PIPEC_F32, 2, wShape}, PIPEC_TRAINED};
    params[1] = {{bName.c_str(), PIPEC_F32, 1, bShape}, PIPEC_TRAINED};
    static const int64_t xShape[] = {B, kDims[0]}, yShape[] = {B, kDims[P]};
    data[0] = kFirst ? pipec_tensor_desc{"x", PIPEC_F32, 2, xShape} : pipec_tensor_desc{"y", PIPEC_F32, 2, yShape};
    inputs[0] = {inName.c_str(), PIPEC_F32, 2, inShape};
    outputs[0] = {outName.c_str(), PIPEC_F32, 2, outShape};
    desc.abi_version = TINY_ABI;
    desc.stage = S;
    desc.num_stages = P;
    desc.num_params = 2;
    desc.params = params;
    desc.num_data = (kFirst || kLast) ? 1 : 0;
    desc.data = data;
    desc.num_inputs = kFirst ? 0 : 1;
    desc.inputs = inputs;
    desc.num_outputs = kLast ? 0 : 1;
    desc.outputs = outputs;
    desc.computes_loss = kLast;
    desc.workspace_bytes = sizeof(Workspace);
    desc.optimizer = TINY_ADAMW ? PIPEC_ADAMW : PIPEC_SGD;
    desc.optimizer_state_per_param = TINY_ADAMW ? 2 : 1;
  }
} init;
} // namespace

extern "C" {
const pipec_stage_desc *pipec_stage_describe(void) { return &desc; }
// Optional symbol: piperun refuses a plan of another runtime.target. A
// "cuda" build computes on the host all the same: the emulated piperun's
// device memory is host memory (CMakeLists.txt, piperun_emulated).
const char *pipec_stage_target(void) { return TINY_TARGET; }
const char *pipec_stage_last_error(void) { return lastError.c_str(); }

int pipec_stage_forward(const pipec_call *c) {
  const double t0 = seconds();
  if (!c->workspace || !c->params) return fail("forward: NULL workspace or params");
  auto *ws = (Workspace *)c->workspace;
  const float *W = (const float *)c->params[0], *b = (const float *)c->params[1];
  const float *x = kFirst ? (const float *)c->data[0] : (const float *)c->inputs[0];
  for (int i = 0; i < B * Din; ++i) ws->xin[i] = kFirst ? x[i] * dropoutScale(c, i) : x[i];
  for (int n = 0; n < B; ++n)
    for (int o = 0; o < Dout; ++o) {
      float z = b[o];
      for (int i = 0; i < Din; ++i) z += ws->xin[n * Din + i] * W[widx(o, i)];
      ws->act[n * Dout + o] = kLast ? z : std::tanh(z);
    }
  if (kLast) {
    const float *y = (const float *)c->data[0];
    double loss = 0;
    for (int k = 0; k < B * Dout; ++k) loss += 0.5 * (ws->act[k] - y[k]) * (ws->act[k] - y[k]);
    if (!c->loss) return fail("forward: NULL loss on the last stage");
    *c->loss = (float)(loss / (B * Dout));
  } else {
    std::memcpy(c->outputs[0], ws->act, sizeof ws->act);
  }
  timed(c, 0, t0);
  return 0;
}

int pipec_stage_backward_input(const pipec_call *c) {
  const double t0 = seconds();
  auto *ws = (Workspace *)c->workspace;
  const float *W = (const float *)c->params[0];
  if (kLast) {
    const float *y = (const float *)c->data[0];
    for (int k = 0; k < B * Dout; ++k) ws->dz[k] = c->loss_scale * (ws->act[k] - y[k]) / (B * Dout);
  } else {
    if (!c->grad_outputs) return fail("backward_input: NULL grad_outputs");
    const float *g = (const float *)c->grad_outputs[0];
    for (int k = 0; k < B * Dout; ++k) ws->dz[k] = g[k] * (1 - ws->act[k] * ws->act[k]);
  }
  if (!kFirst) {
    float *gin = (float *)c->grad_inputs[0];
    for (int n = 0; n < B; ++n)
      for (int i = 0; i < Din; ++i) {
        float s = 0;
        for (int o = 0; o < Dout; ++o) s += ws->dz[n * Dout + o] * W[widx(o, i)];
        gin[n * Din + i] = s;
      }
  }
  timed(c, 1, t0);
  return 0;
}

int pipec_stage_backward_weight(const pipec_call *c) {
  const double t0 = seconds();
  auto *ws = (Workspace *)c->workspace;
  float *gW = (float *)c->grad_params[0], *gb = (float *)c->grad_params[1];
  for (int n = 0; n < B; ++n)
    for (int o = 0; o < Dout; ++o) {
      const float d = ws->dz[n * Dout + o];
      gb[o] += d;
      for (int i = 0; i < Din; ++i) gW[widx(o, i)] += d * ws->xin[n * Din + i];
    }
  timed(c, 2, t0);
  return 0;
}

int pipec_stage_step(const pipec_optimizer_call *c) {
  if (c->step < 1) return fail("step: step counter must start at 1");
  if (c->control && c->control->skip != 0) return 0; // the runtime's verdict: non-finite gradients
  const double gradScale = c->control ? c->control->grad_scale : 1.0;
  const int sizes[2] = {Dout * Din, Dout};
  for (int p = 0; p < 2; ++p) {
    float *w = (float *)c->params[p];
    std::vector<float> g((const float *)c->grads[p], (const float *)c->grads[p] + sizes[p]);
    for (float &x : g) x = (float)(x * gradScale); // clipping, as the runtime scales gradients
    if (!TINY_ADAMW) {
      float *v = (float *)c->state[p];
      for (int k = 0; k < sizes[p]; ++k) {
        v[k] = c->momentum * v[k] + g[k] + c->weight_decay * w[k];
        w[k] -= c->learning_rate * v[k];
      }
    } else {
      float *m = (float *)c->state[2 * p], *v = (float *)c->state[2 * p + 1];
      const float bc1 = 1 - std::pow(c->beta1, (float)c->step), bc2 = 1 - std::pow(c->beta2, (float)c->step);
      for (int k = 0; k < sizes[p]; ++k) {
        m[k] = c->beta1 * m[k] + (1 - c->beta1) * g[k];
        v[k] = c->beta2 * v[k] + (1 - c->beta2) * g[k] * g[k];
        w[k] -= c->learning_rate * ((m[k] / bc1) / (std::sqrt(v[k] / bc2) + c->epsilon) + c->weight_decay * w[k]);
      }
    }
  }
  return 0;
}
}
