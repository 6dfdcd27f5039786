// Element-wise kernels: broadcasting binaries, unaries, cast, where, equal,
// their gradients, and dropout. The formulas are those of the CPU library
// (runtime/kernels/src/elementwise.cpp) expression by expression; the unary
// functions' are shared with it (pipec/unary_math.h). The float kernels are
// templated on the storage type and also instantiated for bf16 (float math,
// one rounding on store: docs/cuda-kernels.md).
#include "detail.cuh"
#include "index_map.cuh"
#include "pipec/binary_math.h"
#include "pipec/rotary_math.h"
#include "pipec/unary_math.h"

#include <cmath>
#include <limits>
#include <type_traits>

namespace pipec::kernels::cuda {

using namespace detail;

namespace {

template <class K, class... Args> void launch(const char *op, int64_t n, K kernel, Args... args) {
  if (n <= 0) return;
  kernel<<<blocksFor(n), kThreads, 0, stream()>>>(args...);
  checkLaunch(op);
}

//===----------------------------------------------------------------------===//
// Broadcasting binaries
//===----------------------------------------------------------------------===//

template <class T, class U, class F>
__global__ void binaryKernel(const T *a, const T *b, U *out, int64_t n, IndexMap<2> map, F f) {
  for (int64_t i = firstIndex(); i < n; i += gridStride()) {
    int64_t o[2];
    map.offsets(i, o);
    out[i] = static_cast<U>(f(a[o[0]], b[o[1]]));
  }
}

/// out = f(a, b) over broadcastShape(as, bs).
template <class T, class U, class F>
void broadcastBinary(const char *op, const T *a, const Shape &as, const T *b, const Shape &bs, U *out, F f) {
  const Shape os = broadcastShape(as, bs);
  const IndexMap<2> map = makeIndexMap<2>(os, {broadcastStrides(as, os), broadcastStrides(bs, os)});
  launch(op, os.numel(), binaryKernel<T, U, F>, a, b, out, os.numel(), map, f);
}

// The formulas are pipec/binary_math.h's, shared with the CPU kernels and
// the generated fused kernels.
template <Binary B> struct FloatBinaryF {
  template <class T> __device__ float operator()(T x, T y) const { return binaryValue<B>(toF(x), toF(y)); }
};

/// Integer arithmetic with the CPU kernel's formulas; a fault (division by
/// zero, negative exponent) is a device error and gives 0.
template <Binary B> struct IntBinaryF {
  int *flag;
  __device__ int64_t operator()(int64_t a, int64_t b) const {
    IntegerFault fault = IntegerFault::None;
    const int64_t r = integerBinaryValue<B>(a, b, fault);
    if (fault == IntegerFault::DivisionByZero) raiseDevice(flag, kIntegerDivisionByZero);
    if (fault == IntegerFault::NegativeExponent) raiseDevice(flag, kIntegerNegativeExponent);
    return r;
  }
};

/// bf16 compares as float (exactly: widening is exact).
template <Binary B, class T> struct CompareF {
  using C = std::conditional_t<std::is_same_v<T, bf16>, float, T>;
  __device__ uint8_t operator()(T x, T y) const { return (uint8_t)binaryValue<B>(static_cast<C>(x), static_cast<C>(y)); }
};

/// "nn.<spelling>": how errors name a binary function.
std::string binaryOpName(Binary op) { return std::string("nn.") + binaryName(op); }

template <class T>
__global__ void whereKernel(const uint8_t *cond, const T *x, const T *y, T *out, int64_t n, IndexMap<3> map) {
  for (int64_t i = firstIndex(); i < n; i += gridStride()) {
    int64_t o[3];
    map.offsets(i, o);
    out[i] = cond[o[0]] ? x[o[1]] : y[o[2]];
  }
}

template <class T>
__global__ void rotaryKernel(const T *x, const float *cos, const float *sin, T *y, int64_t n, int64_t width,
                             bool sinAlongLastAxis, bool interleaved, bool transposed, IndexMap<2> map) {
  for (int64_t i = firstIndex(); i < n; i += gridStride()) {
    int64_t o[2];
    map.offsets(i, o);
    const RotaryPartner p = rotaryPartner(i % width, width, interleaved);
    const float sp = sin[o[1] + (sinAlongLastAxis ? p.offset : 0)];
    y[i] = fromF<T>(rotaryValue(toF(x[i]), toF(x[i + p.offset]), cos[o[0]], sin[o[1]], sp, p.first, transposed));
  }
}

/// rotaryKernel V elements at a time, for rows of `width` that split into
/// whole packs, none straddling the rotated halves (rotaryT checks): the
/// index map's divisions once per pack, cos and sin then cosStep / sinStep
/// apart along the last axis, the partner a pack of its own (or,
/// interleaved, the neighbour within the pack). A division per element per
/// axis kept the Llama-style model's rotary near 0.3 TB/s on an H200
/// (docs/cuda-kernels.md).
template <class T, int V>
__global__ void rotaryPackedKernel(const T *x, const float *cos, const float *sin, T *y, int64_t n, int64_t width,
                                   int64_t cosStep, int64_t sinStep, bool sinAlongLastAxis, bool interleaved,
                                   bool transposed, IndexMap<2> map) {
  for (int64_t i = firstIndex(); i < n / V; i += gridStride()) {
    const int64_t first = i * V, j = first % width;
    int64_t o[2];
    map.offsets(first, o);
    const Packed<T, V> in = loadPacked<V>(x + first);
    const RotaryPartner half = rotaryPartner(j, width, false);
    const Packed<T, V> partner = interleaved ? in : loadPacked<V>(x + first + half.offset);
    Packed<T, V> out;
PIPEC_UNROLL
    for (int e = 0; e < V; ++e) {
      const RotaryPartner p = interleaved ? rotaryPartner(e, width, true) : half; // V is even
      const float xp = toF(partner.v[interleaved ? e + (int)p.offset : e]);
      const int64_t s = o[1] + e * sinStep;
      const float sp = sin[s + (sinAlongLastAxis ? p.offset : 0)];
      out.v[e] = fromF<T>(rotaryValue(toF(in.v[e]), xp, cos[o[0] + e * cosStep], sin[s], sp, p.first, transposed));
    }
    storePacked(y + first, out);
  }
}

//===----------------------------------------------------------------------===//
// Unaries and their gradients
//===----------------------------------------------------------------------===//

// unaryKernel and unaryGradKernel move V = kPackOf<T> elements per load and
// store where every pointer is 16-byte aligned, else V = 1.

template <Unary U, class T, int V> __global__ void unaryKernel(const T *x, int64_t n, T *y) {
  const int64_t packs = n / V;
  for (int64_t i = firstIndex(); i < packs; i += gridStride()) {
    const Packed<T, V> in = loadPacked<V>(x + i * V);
    Packed<T, V> out;
#pragma unroll
    for (int j = 0; j < V; ++j) out.v[j] = fromF<T>(unaryValue<U>(toF(in.v[j])));
    storePacked(y + i * V, out);
  }
  for (int64_t i = packs * V + firstIndex(); i < n; i += gridStride()) y[i] = fromF<T>(unaryValue<U>(toF(x[i])));
}

// Only the forward value the derivative reads is read (the other may be
// null): `forward` is x or y as derivativeReadsInput says.
template <Unary U, class T> __device__ __forceinline__ T unaryGradAt(T dy, T forward) {
  return fromF<T>(derivativeReadsInput<U>() ? unaryGradient<U>(toF(dy), toF(forward), 0.0f)
                                            : unaryGradient<U>(toF(dy), 0.0f, toF(forward)));
}
template <Unary U, class T, int V>
__global__ void unaryGradKernel(const T *dy, const T *x, const T *y, int64_t n, T *dx) {
  const T *forward = derivativeReadsInput<U>() ? x : y;
  const int64_t packs = n / V;
  for (int64_t i = firstIndex(); i < packs; i += gridStride()) {
    const Packed<T, V> g = loadPacked<V>(dy + i * V), f = loadPacked<V>(forward + i * V);
    Packed<T, V> out;
#pragma unroll
    for (int j = 0; j < V; ++j) out.v[j] = unaryGradAt<U>(g.v[j], f.v[j]);
    storePacked(dx + i * V, out);
  }
  for (int64_t i = packs * V + firstIndex(); i < n; i += gridStride())
    dx[i] = unaryGradAt<U>(dy[i], forward[i]);
}

template <class T> __global__ void negateKernel(const T *x, int64_t n, T *y) {
  for (int64_t i = firstIndex(); i < n; i += gridStride()) y[i] = fromF<T>(-toF(x[i]));
}

template <BinaryGrad K, class T>
__global__ void binaryGradKernel(const T *dy, const T *lhs, const T *rhs, int64_t n, IndexMap<3> map, T *dx) {
  for (int64_t i = firstIndex(); i < n; i += gridStride()) {
    int64_t o[3];
    map.offsets(i, o);
    dx[i] = fromF<T>(binaryGradient<K>(toF(dy[o[0]]), toF(lhs[o[1]]), toF(rhs[o[2]])));
  }
}

//===----------------------------------------------------------------------===//
// Cast
//===----------------------------------------------------------------------===//

template <class To, class From> __host__ __device__ To castValue(From x) {
  if constexpr (std::is_same_v<From, bf16>) {
    return castValue<To>(static_cast<float>(x)); // widening is exact
  } else if constexpr (std::is_same_v<To, bf16>) {
    return bf16(static_cast<float>(x)); // float to bf16 rounds to nearest even
  } else if constexpr (std::is_same_v<To, uint8_t>) {
    return (uint8_t)(x != From(0));
  } else if constexpr (std::is_floating_point_v<To>) {
    return static_cast<To>(x);
  } else if constexpr (std::is_floating_point_v<From>) {
    const double t = trunc((double)x);
    if (t != t) return 0;
    if (t >= (double)std::numeric_limits<To>::max()) return std::numeric_limits<To>::max();
    if (t <= (double)std::numeric_limits<To>::min()) return std::numeric_limits<To>::min();
    return static_cast<To>(t);
  } else {
    return static_cast<To>(x); // integer to integer wraps (two's complement)
  }
}

template <class From, class To> __global__ void castKernel(const From *x, int64_t n, To *y) {
  for (int64_t i = firstIndex(); i < n; i += gridStride()) y[i] = castValue<To>(x[i]);
}

//===----------------------------------------------------------------------===//
// Dropout
//===----------------------------------------------------------------------===//

/// The keep test and the double-precision scaling of the CPU kernel; the
/// explicit _rn intrinsics keep nvcc from contracting anything.
template <class T>
__global__ void dropoutKernel(const T *x, int64_t n, T *y, uint8_t *mask, double ratio, double scale,
                              StreamKey key) {
  const uint64_t streamKey = key.resolve();
  for (int64_t i = firstIndex(); i < n; i += gridStride()) {
    const bool keep = kernels::dropoutUniform(streamKey, (uint64_t)i) >= ratio;
    const float v = toF(x[i]);
    if (mask) mask[i] = keep;
    y[i] = fromF<T>(keep ? (float)__dmul_rn((double)v, scale) : 0.0f);
  }
}

template <class T>
__global__ void dropoutGradKernel(const T *dy, const uint8_t *mask, int64_t n, T *dx, double scale) {
  for (int64_t i = firstIndex(); i < n; i += gridStride())
    dx[i] = fromF<T>(mask[i] ? (float)__dmul_rn((double)toF(dy[i]), scale) : 0.0f);
}

/// dropoutGradKernel with the forward's mask drawn again from its key.
template <class T>
__global__ void dropoutGradRedrawnKernel(const T *dy, int64_t n, T *dx, kernels::DropoutDraws draws,
                                         StreamKey key) {
  draws.streamKey = key.resolve();
  for (int64_t i = firstIndex(); i < n; i += gridStride())
    dx[i] = fromF<T>(draws.kept((uint64_t)i) ? (float)__dmul_rn((double)toF(dy[i]), draws.scale) : 0.0f);
}

} // namespace

//===----------------------------------------------------------------------===//
// Public entry points
//===----------------------------------------------------------------------===//

template <class T> void floatBinary(Binary op, const T *a, const Shape &as, const T *b, const Shape &bs, T *out) {
  const std::string name = binaryOpName(op);
  if (givesBool(op) || takesBool(op)) fail(name.c_str(), "is not arithmetic on floats");
  dispatchBinary(op, [&](auto kind) {
    constexpr Binary B = decltype(kind)::value;
    if constexpr (!givesBool(B) && !takesBool(B))
      broadcastBinary(name.c_str(), a, as, b, bs, out, FloatBinaryF<B>{});
  });
}

void binary(Binary op, const int64_t *a, const Shape &as, const int64_t *b, const Shape &bs, int64_t *out) {
  const std::string name = binaryOpName(op);
  if (givesBool(op) || takesBool(op)) fail(name.c_str(), "is not arithmetic on integers");
  const Shape os = broadcastShape(as, bs);
  if (os.numel() == 0) return;
  dispatchBinary(op, [&](auto kind) {
    constexpr Binary B = decltype(kind)::value;
    if constexpr (!givesBool(B) && !takesBool(B))
      broadcastBinary(name.c_str(), a, as, b, bs, out, IntBinaryF<B>{errorFlag()});
  });
}

template <class T> void compare(Binary op, const T *a, const Shape &as, const T *b, const Shape &bs, uint8_t *out) {
  const std::string name = binaryOpName(op);
  if (!givesBool(op)) fail(name.c_str(), "does not give a bool");
  dispatchBinary(op, [&](auto kind) {
    constexpr Binary B = decltype(kind)::value;
    if constexpr (givesBool(B)) broadcastBinary(name.c_str(), a, as, b, bs, out, CompareF<B, T>{});
  });
}

template <class T>
void where(const uint8_t *cond, const Shape &cs, const T *x, const Shape &xs, const T *y, const Shape &ys,
           T *out) {
  const Shape os = broadcastShape(cs, broadcastShape(xs, ys));
  const IndexMap<3> map =
      makeIndexMap<3>(os, {broadcastStrides(cs, os), broadcastStrides(xs, os), broadcastStrides(ys, os)});
  launch("nn.where", os.numel(), whereKernel<T>, cond, x, y, out, os.numel(), map);
}

template <class T>
void rotaryT(const T *x, const Shape &xs, const float *cos, const Shape &cs, const float *sin, const Shape &ss, T *y,
             bool interleaved, bool transposed) {
  const RotaryView v = rotaryView(xs, cs, ss);
  const Strides cosStrides = broadcastStrides(cs, xs), sinStrides = broadcastStrides(ss, xs);
  const IndexMap<2> map = makeIndexMap<2>(xs, {cosStrides, sinStrides});
  constexpr int V = kPackOf<T>;
  if (v.width % (interleaved ? V : 2 * V) == 0 && packedAligned<V>(x, y)) {
    const int last = xs.size - 1;
    launch("nn.rotary", xs.numel() / V, rotaryPackedKernel<T, V>, x, cos, sin, y, xs.numel(), v.width,
           cosStrides[last], sinStrides[last], v.sinAlongLastAxis, interleaved, transposed, map);
    return;
  }
  launch("nn.rotary", xs.numel(), rotaryKernel<T>, x, cos, sin, y, xs.numel(), v.width, v.sinAlongLastAxis, interleaved,
         transposed, map);
}

template <class T> void unaryT(Unary op, const T *x, int64_t n, T *y) {
  dispatchUnary(op, [&](auto kind) {
    constexpr Unary U = decltype(kind)::value;
    if (packedAligned<kPackOf<T>>(x, y))
      launch("nn.unary", n / kPackOf<T> + 1, unaryKernel<U, T, kPackOf<T>>, x, n, y);
    else
      launch("nn.unary", n, unaryKernel<U, T, 1>, x, n, y);
  });
}

template <class T> void unaryGradT(Unary op, const T *dy, const T *x, const T *y, int64_t n, T *dx) {
  // Only whether x and y are given is read.
  if (const char *missing =
          missingForwardValue(op, reinterpret_cast<const float *>(x), reinterpret_cast<const float *>(y)))
    fail("nn.unary_grad", missing);
  dispatchUnary(op, [&](auto kind) {
    constexpr Unary U = decltype(kind)::value;
    if (packedAligned<kPackOf<T>>(dy, derivativeReadsInput<U>() ? x : y, dx))
      launch("nn.unary_grad", n / kPackOf<T> + 1, unaryGradKernel<U, T, kPackOf<T>>, dy, x, y, n, dx);
    else
      launch("nn.unary_grad", n, unaryGradKernel<U, T, 1>, dy, x, y, n, dx);
  });
}

template <class T>
void binaryGradT(BinaryGrad op, const T *dy, const T *lhs, const Shape &ls, const T *rhs, const Shape &rs, T *dx) {
  const Shape os = broadcastShape(ls, rs);
  const int64_t n = os.numel();
  if (op == BinaryGrad::SubRhs) {
    launch("nn.binary_grad", n, negateKernel<T>, dy, n, dx);
    return;
  }
  const IndexMap<3> map =
      makeIndexMap<3>(os, {stridesOf(os), broadcastStrides(ls, os), broadcastStrides(rs, os)});
  dispatchBinaryGrad(op, [&](auto kind) {
    launch("nn.binary_grad", n, binaryGradKernel<decltype(kind)::value, T>, dy, lhs, rhs, n, map, dx);
  });
}

template <class From, class To> void cast(const From *x, int64_t n, To *y) {
  launch("nn.cast", n, castKernel<From, To>, x, n, y);
}

template <class T>
void dropoutT(const T *x, int64_t n, T *y, uint8_t *mask, float ratio, bool training, StreamKey streamKey) {
  const double r = ratio; // the evaluator holds the f32 attribute as a double
  if (!(r >= 0.0 && r < 1.0)) fail("nn.dropout", "ratio must be in [0, 1), got " + std::to_string(r));
  if (n <= 0) return;
  if (!training || r == 0.0) {
    if (y != x)
      check(cudaMemcpyAsync(y, x, (size_t)n * sizeof(T), cudaMemcpyDeviceToDevice, stream()), "nn.dropout");
    if (mask) check(cudaMemsetAsync(mask, 1, (size_t)n, stream()), "nn.dropout");
    return;
  }
  const double scale = 1.0 / (1.0 - r);
  launch("nn.dropout", n, dropoutKernel<T>, x, n, y, mask, r, scale, streamKey);
}

template <class T>
void dropoutGradRedrawnT(const T *dy, int64_t n, T *dx, float ratio, bool training, StreamKey streamKey) {
  const kernels::DropoutDraws draws = kernels::dropoutDraws("nn.dropout_grad", ratio, training, 0); // key: on the device
  if (n <= 0) return;
  if (!draws.active) {
    if (dx != dy)
      check(cudaMemcpyAsync(dx, dy, (size_t)n * sizeof(T), cudaMemcpyDeviceToDevice, stream()), "nn.dropout_grad");
    return;
  }
  launch("nn.dropout_grad", n, dropoutGradRedrawnKernel<T>, dy, n, dx, draws, streamKey);
}

template <class T> void dropoutGradT(const T *dy, const uint8_t *mask, int64_t n, T *dx, float ratio, bool training) {
  const double r = ratio;
  if (!(r >= 0.0 && r < 1.0)) fail("nn.dropout_grad", "ratio must be in [0, 1), got " + std::to_string(r));
  if (n <= 0) return;
  if (!training || r == 0.0) {
    if (dx != dy)
      check(cudaMemcpyAsync(dx, dy, (size_t)n * sizeof(T), cudaMemcpyDeviceToDevice, stream()),
            "nn.dropout_grad");
    return;
  }
  if (!mask) fail("nn.dropout_grad", "training needs the mask");
  const double scale = 1.0 / (1.0 - r);
  launch("nn.dropout_grad", n, dropoutGradKernel<T>, dy, mask, n, dx, scale);
}

// The float entry points and their bf16 overloads: one template each.
void binary(Binary op, const float *a, const Shape &as, const float *b, const Shape &bs, float *out) {
  floatBinary(op, a, as, b, bs, out);
}
void binary(Binary op, const bf16 *a, const Shape &as, const bf16 *b, const Shape &bs, bf16 *out) {
  floatBinary(op, a, as, b, bs, out);
}
void rotary(const float *x, const Shape &xs, const float *cos, const Shape &cs, const float *sin, const Shape &ss,
            float *y, bool interleaved, bool transposed) {
  rotaryT(x, xs, cos, cs, sin, ss, y, interleaved, transposed);
}
void rotary(const bf16 *x, const Shape &xs, const float *cos, const Shape &cs, const float *sin, const Shape &ss,
            bf16 *y, bool interleaved, bool transposed) {
  rotaryT(x, xs, cos, cs, sin, ss, y, interleaved, transposed);
}
void unary(Unary op, const float *x, int64_t n, float *y) { unaryT(op, x, n, y); }
void unary(Unary op, const bf16 *x, int64_t n, bf16 *y) { unaryT(op, x, n, y); }
void unaryGrad(Unary op, const float *dy, const float *x, const float *y, int64_t n, float *dx) {
  unaryGradT(op, dy, x, y, n, dx);
}
void unaryGrad(Unary op, const bf16 *dy, const bf16 *x, const bf16 *y, int64_t n, bf16 *dx) {
  unaryGradT(op, dy, x, y, n, dx);
}
void binaryGrad(BinaryGrad op, const float *dy, const float *lhs, const Shape &ls, const float *rhs,
                const Shape &rs, float *dx) {
  binaryGradT(op, dy, lhs, ls, rhs, rs, dx);
}
void binaryGrad(BinaryGrad op, const bf16 *dy, const bf16 *lhs, const Shape &ls, const bf16 *rhs, const Shape &rs,
                bf16 *dx) {
  binaryGradT(op, dy, lhs, ls, rhs, rs, dx);
}
void dropout(const float *x, int64_t n, float *y, uint8_t *mask, float ratio, bool training, StreamKey streamKey) {
  dropoutT(x, n, y, mask, ratio, training, streamKey);
}
void dropout(const bf16 *x, int64_t n, bf16 *y, uint8_t *mask, float ratio, bool training, StreamKey streamKey) {
  dropoutT(x, n, y, mask, ratio, training, streamKey);
}
void dropoutGrad(const float *dy, const uint8_t *mask, int64_t n, float *dx, float ratio, bool training) {
  dropoutGradT(dy, mask, n, dx, ratio, training);
}
void dropoutGradRedrawn(const float *dy, int64_t n, float *dx, float ratio, bool training, StreamKey streamKey) {
  dropoutGradRedrawnT(dy, n, dx, ratio, training, streamKey);
}
void dropoutGradRedrawn(const bf16 *dy, int64_t n, bf16 *dx, float ratio, bool training, StreamKey streamKey) {
  dropoutGradRedrawnT(dy, n, dx, ratio, training, streamKey);
}
void dropoutGrad(const bf16 *dy, const uint8_t *mask, int64_t n, bf16 *dx, float ratio, bool training) {
  dropoutGradT(dy, mask, n, dx, ratio, training);
}

//===----------------------------------------------------------------------===//
// Instantiations (the CPU library's set, and bf16's)
//===----------------------------------------------------------------------===//

#define PIPEC_CAST_FROM(F)                                                                                             \
  template void cast<F, float>(const F *, int64_t, float *);                                                           \
  template void cast<F, double>(const F *, int64_t, double *);                                                         \
  template void cast<F, int64_t>(const F *, int64_t, int64_t *);                                                       \
  template void cast<F, int32_t>(const F *, int64_t, int32_t *);                                                       \
  template void cast<F, uint8_t>(const F *, int64_t, uint8_t *);
PIPEC_CAST_FROM(float)
PIPEC_CAST_FROM(double)
PIPEC_CAST_FROM(int64_t)
PIPEC_CAST_FROM(int32_t)
PIPEC_CAST_FROM(uint8_t)
#undef PIPEC_CAST_FROM
template void cast<float, bf16>(const float *, int64_t, bf16 *);
template void cast<bf16, float>(const bf16 *, int64_t, float *);

#define PIPEC_EQ_WHERE(T)                                                                                              \
  template void compare<T>(Binary, const T *, const Shape &, const T *, const Shape &, uint8_t *);                              \
  template void where<T>(const uint8_t *, const Shape &, const T *, const Shape &, const T *, const Shape &, T *);
PIPEC_EQ_WHERE(float)
PIPEC_EQ_WHERE(double)
PIPEC_EQ_WHERE(int64_t)
PIPEC_EQ_WHERE(int32_t)
PIPEC_EQ_WHERE(uint8_t)
PIPEC_EQ_WHERE(bf16)
#undef PIPEC_EQ_WHERE

} // namespace pipec::kernels::cuda
