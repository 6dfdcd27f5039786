/* The C ABI between a generated stage library (libstage_<k>.so, written by
 * pipec's code generators) and the runtime `piperun`. Plain C so that the
 * runtime needs no compiler headers and any toolchain can build a stage.
 *
 * A stage computes a contiguous piece of the model for one micro-batch at a
 * time. It receives one bundle of activations from the previous stage (its
 * "inputs"; none for the first stage), may read fields of the data set (model
 * inputs, labels), and sends one bundle to the next stage (its "outputs"; the
 * last stage outputs nothing and returns the loss). Tensors that skip stages
 * are passed along by the stages in between, so bundles only travel between
 * neighbours. Backward mirrors this: gradients of the outputs come in,
 * gradients of the inputs go out.
 *
 * Memory is the runtime's: every buffer is allocated by piperun from the sizes
 * the stage describes. Tensors are dense and row-major; on the CPU target
 * buffers are host memory, on the CUDA target device memory (and `stream` is
 * the cudaStream_t to run on).
 *
 * Zero-bubble schedules split the backward: backward_input (B) computes the
 * input gradients and keeps what backward_weight (W) needs in the micro-batch's
 * workspace; backward_weight later accumulates the weight gradients. A
 * combined backward is B followed by W.
 */
#ifndef PIPEC_STAGE_ABI_H
#define PIPEC_STAGE_ABI_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define PIPEC_STAGE_ABI_VERSION 5

typedef enum pipec_dtype {
  PIPEC_F32 = 1,
  PIPEC_F64 = 2,
  PIPEC_I64 = 3,
  PIPEC_I32 = 4,
  PIPEC_BOOL = 5, /* one byte per element */
  PIPEC_BF16 = 6, /* bfloat16: activations sent between CUDA stages at --precision bf16 */
} pipec_dtype;

typedef enum pipec_param_role {
  PIPEC_TRAINED = 1, /* has a gradient and optimizer state */
  PIPEC_BUFFER = 2,  /* updated by the forward (BatchNorm statistics), no gradient */
} pipec_param_role;

typedef struct pipec_tensor_desc {
  const char *name; /* ONNX name (parameters, data fields) or a stable tensor name */
  pipec_dtype dtype;
  int32_t rank;
  const int64_t *shape;
} pipec_tensor_desc;

typedef struct pipec_param_desc {
  pipec_tensor_desc tensor;
  pipec_param_role role;
} pipec_param_desc;

typedef enum pipec_optimizer {
  PIPEC_SGD = 1,  /* state: momentum buffer (1 tensor per trained parameter) */
  PIPEC_ADAMW = 2 /* state: first and second moments (2 tensors per trained parameter) */
} pipec_optimizer;

typedef struct pipec_stage_desc {
  int32_t abi_version; /* PIPEC_STAGE_ABI_VERSION */
  int32_t stage;       /* pipeline stage id */
  int32_t num_stages;
  int32_t num_params;
  const pipec_param_desc *params;
  int32_t num_data; /* data-set fields this stage reads (inputs, labels) */
  const pipec_tensor_desc *data;
  int32_t num_inputs; /* activations from the previous stage */
  const pipec_tensor_desc *inputs;
  int32_t num_outputs; /* activations to the next stage */
  const pipec_tensor_desc *outputs;
  int32_t computes_loss;   /* 1 on the last stage */
  int64_t workspace_bytes; /* kept per in-flight micro-batch from forward to backward_weight */
  pipec_optimizer optimizer;
  int32_t optimizer_state_per_param; /* tensors of optimizer state per trained parameter */
} pipec_stage_desc;

/* Per-op timing for `piperun --profile`: called after each op when set. */
typedef void (*pipec_op_timer)(void *user, const char *op_name, int32_t phase /* 0 F, 1 B, 2 W */,
                               double seconds);

typedef struct pipec_call {
  int64_t step;       /* optimizer steps taken so far */
  int64_t microbatch; /* global micro-batch index (keys dropout masks) */
  uint64_t seed;      /* run seed (keys dropout masks) */
  void *const *params;       /* num_params, the weight version this call must use */
  const void *const *data;   /* num_data, this micro-batch's data fields */
  const void *const *inputs; /* num_inputs */
  void *const *outputs;      /* forward: num_outputs to send */
  const void *const *grad_outputs; /* backward: num_outputs received (NULL on the last stage) */
  void *const *grad_inputs;  /* backward_input: num_inputs to send back */
  void *const *grad_params;  /* backward_weight: num_params, accumulated into (+=); NULL for buffers */
  void *workspace;           /* workspace_bytes of this micro-batch */
  float *loss;               /* forward on the last stage: where the micro-batch's loss goes (the stage's
                                memory: on CUDA device memory, written on `stream` without waiting) */
  float loss_scale;          /* backward on the last stage: d(total)/d(loss), e.g. 1/m */
  void *stream;              /* CUDA target: cudaStream_t; NULL on CPU */
  pipec_op_timer timer;      /* NULL unless profiling */
  void *timer_user;
  int32_t inference;         /* forward: 1 evaluates (dropout off, BatchNorm on its running statistics, which
                                stay as they are); 0 trains */
  int32_t no_graphs;         /* CUDA target: 1 issues every launch from the host; 0 replays a CUDA graph of
                                the call's launches (docs/cuda-codegen.md, "CUDA graphs") */
} pipec_call;

/* The runtime's verdict on a step's gradients, in the stage's memory (device
 * memory on CUDA), computed on the device so that the step needs no host
 * round trip (docs/runtime.md, "The optimizer step"). */
typedef struct pipec_step_control {
  double grad_scale; /* every gradient is used as (float)(g * grad_scale): clipping; 1 otherwise */
  double skip;       /* non-zero: parameters and state stay as they are (non-finite gradients) */
} pipec_step_control;

typedef struct pipec_optimizer_call {
  int64_t step; /* 1 for the first update (AdamW bias correction) */
  float learning_rate, weight_decay;
  float momentum;                     /* SGD */
  float beta1, beta2, epsilon;        /* AdamW */
  void *const *params;                /* num_params (buffers are skipped) */
  const void *const *grads;           /* num_params, already averaged over micro-batches and replicas */
  void *const *state;                 /* optimizer_state_per_param per trained parameter, in order */
  void *stream;
  const pipec_step_control *control; /* NULL: grad_scale 1, never skip */
} pipec_optimizer_call;

/* Every stage library exports these five functions. They return 0 on
 * success and a non-zero code after writing a message with
 * pipec_stage_last_error(). */
const pipec_stage_desc *pipec_stage_describe(void);
int pipec_stage_forward(const pipec_call *call);
int pipec_stage_backward_input(const pipec_call *call);
int pipec_stage_backward_weight(const pipec_call *call);
int pipec_stage_step(const pipec_optimizer_call *call);
const char *pipec_stage_last_error(void);
/* Generated stages also export `const char *pipec_stage_target(void)`
 * ("cpu" or "cuda"): piperun refuses a library built for the other target.
 * Optional for hand-written stages. */

#ifdef __cplusplus
}
#endif

#endif /* PIPEC_STAGE_ABI_H */
