// Element-wise kernels: broadcasting binaries, unaries, cast, where, equal,
// their gradients, and dropout.
#include "detail.h"
#include "pipec/binary_math.h"
#include "pipec/rotary_math.h"
#include "pipec/unary_math.h"

#include <cassert>
#include <cmath>
#include <limits>
#include <type_traits>

namespace pipec::kernels {

using namespace detail;



namespace {

/// out[i] = f(a[.], b[.]) over the broadcast shape, with flat fast paths
/// that the compiler vectorizes. Parallel (f must not throw) or not.
template <bool Parallel, class T, class U, class F>
void broadcastBinary(const T *a, const Shape &as, const T *b, const Shape &bs, U *out, F f) {
  const Shape os = broadcastShape(as, bs);
  const int64_t n = os.numel();
  auto ranges = [&](auto body) {
    if constexpr (Parallel)
      parallelElements(n, body);
    else if (n > 0)
      body(int64_t(0), n);
  };
  if (as == os && bs == os) {
    ranges([&](int64_t lo, int64_t hi) {
      for (int64_t i = lo; i < hi; ++i) out[i] = f(a[i], b[i]);
    });
  } else if (as == os && bs.numel() == 1) {
    const T s = b[0];
    ranges([&](int64_t lo, int64_t hi) {
      for (int64_t i = lo; i < hi; ++i) out[i] = f(a[i], s);
    });
  } else if (bs == os && as.numel() == 1) {
    const T s = a[0];
    ranges([&](int64_t lo, int64_t hi) {
      for (int64_t i = lo; i < hi; ++i) out[i] = f(s, b[i]);
    });
  } else {
    auto body = [&](int64_t i, const std::array<int64_t, 2> &o) { out[i] = f(a[o[0]], b[o[1]]); };
    if constexpr (Parallel)
      parallelBroadcastLoop<2>(os, {&as, &bs}, body);
    else
      broadcastLoop<2>(os, {&as, &bs}, body);
  }
}

/// "nn.<spelling>": how errors name a binary function.
std::string binaryOpName(Binary op) { return std::string("nn.") + binaryName(op); }

} // namespace

void binary(Binary op, const float *a, const Shape &as, const float *b, const Shape &bs, float *out) {
  if (givesBool(op) || takesBool(op)) fail(binaryOpName(op).c_str(), "is not arithmetic on floats");
  // The formulas are pipec/binary_math.h's, shared with the CUDA kernels and
  // the generated fused loops.
  dispatchBinary(op, [&](auto kind) {
    constexpr Binary B = decltype(kind)::value;
    if constexpr (!givesBool(B) && !takesBool(B))
      broadcastBinary<true>(a, as, b, bs, out, [](float x, float y) { return binaryValue<B>(x, y); });
  });
}

void binary(Binary op, const int64_t *a, const Shape &as, const int64_t *b, const Shape &bs, int64_t *out) {
  if (givesBool(op) || takesBool(op)) fail(binaryOpName(op).c_str(), "is not arithmetic on integers");
  IntegerFault fault = IntegerFault::None;
  dispatchBinary(op, [&](auto kind) {
    constexpr Binary B = decltype(kind)::value;
    if constexpr (!givesBool(B) && !takesBool(B))
      // Serial: one fault flag, written by whichever element fails.
      broadcastBinary<false>(a, as, b, bs, out,
                             [&fault](int64_t x, int64_t y) { return integerBinaryValue<B>(x, y, fault); });
  });
  if (fault == IntegerFault::DivisionByZero) fail(binaryOpName(op).c_str(), "integer division by zero");
  if (fault == IntegerFault::NegativeExponent)
    fail(binaryOpName(op).c_str(), "integer power with a negative exponent");
}

template <class T> void compare(Binary op, const T *a, const Shape &as, const T *b, const Shape &bs, uint8_t *out) {
  if (!givesBool(op)) fail(binaryOpName(op).c_str(), "does not give a bool");
  dispatchBinary(op, [&](auto kind) {
    constexpr Binary B = decltype(kind)::value;
    if constexpr (givesBool(B))
      broadcastBinary<true>(a, as, b, bs, out, [](T x, T y) { return (uint8_t)binaryValue<B>(x, y); });
  });
}


template <class T>
void where(const uint8_t *cond, const Shape &cs, const T *x, const Shape &xs, const T *y, const Shape &ys,
           T *out) {
  const Shape os = broadcastShape(cs, broadcastShape(xs, ys));
  if (cs == os && xs == os && ys == os) {
    parallelElements(os.numel(), [&](int64_t lo, int64_t hi) {
      for (int64_t i = lo; i < hi; ++i) out[i] = cond[i] ? x[i] : y[i];
    });
    return;
  }
  parallelBroadcastLoop<3>(os, {&cs, &xs, &ys},
                   [&](int64_t i, const std::array<int64_t, 3> &o) { out[i] = cond[o[0]] ? x[o[1]] : y[o[2]]; });
}

void rotary(const float *x, const Shape &xs, const float *cos, const Shape &cs, const float *sin, const Shape &ss,
            float *y, bool interleaved, bool transposed) {
  const RotaryView v = rotaryView(xs, cs, ss);
  parallelBroadcastLoop<2>(xs, {&cs, &ss}, [&](int64_t i, const std::array<int64_t, 2> &o) {
    const RotaryPartner p = rotaryPartner(i % v.width, v.width, interleaved);
    const float sp = sin[o[1] + (v.sinAlongLastAxis ? p.offset : 0)];
    y[i] = rotaryValue(x[i], x[i + p.offset], cos[o[0]], sin[o[1]], sp, p.first, transposed);
  });
}

void unary(Unary op, const float *x, int64_t n, float *y) {
  dispatchUnary(op, [&](auto kind) {
    parallelVectorElements(n, [&](int64_t lo, int64_t hi) {
      for (int64_t i = lo; i < hi; ++i) y[i] = unaryValue<decltype(kind)::value>(x[i]);
    });
  });
}

void unaryGrad(Unary op, const float *dy, const float *x, const float *y, int64_t n, float *dx) {
  if (const char *missing = missingForwardValue(op, x, y)) fail("nn.unary_grad", missing);
  dispatchUnary(op, [&](auto kind) {
    constexpr Unary U = decltype(kind)::value;
    // Only the forward value the derivative reads is read (the other may be null).
    parallelVectorElements(n, [&](int64_t lo, int64_t hi) {
      if constexpr (derivativeReadsInput<U>())
        for (int64_t i = lo; i < hi; ++i) dx[i] = unaryGradient<U>(dy[i], x[i], 0.0f);
      else
        for (int64_t i = lo; i < hi; ++i) dx[i] = unaryGradient<U>(dy[i], 0.0f, y[i]);
    });
  });
}


void binaryGrad(BinaryGrad op, const float *dy, const float *lhs, const Shape &ls, const float *rhs,
                const Shape &rs, float *dx) {
  const Shape os = broadcastShape(ls, rs);
  const Shape ds = os;
  auto run = [&](auto f) {
    parallelBroadcastLoop<3>(os, {&ds, &ls, &rs}, [&](int64_t i, const std::array<int64_t, 3> &o) {
      dx[i] = f(dy[o[0]], lhs[o[1]], rhs[o[2]]);
    });
  };
  if (op == BinaryGrad::SubRhs) { // reads dy only: a flat loop
    parallelElements(os.numel(), [&](int64_t lo, int64_t hi) {
      for (int64_t i = lo; i < hi; ++i) dx[i] = binaryGradient<BinaryGrad::SubRhs>(dy[i], 0.0f, 0.0f);
    });
    return;
  }
  dispatchBinaryGrad(op, [&](auto kind) {
    run([](float g, float a, float b) { return binaryGradient<decltype(kind)::value>(g, a, b); });
  });
}

//===----------------------------------------------------------------------===//
// Cast
//===----------------------------------------------------------------------===//

namespace {
template <class To, class From> To castValue(From x) {
  if constexpr (std::is_same_v<To, uint8_t>) {
    return (uint8_t)(x != From(0));
  } else if constexpr (std::is_floating_point_v<To>) {
    return static_cast<To>(x);
  } else if constexpr (std::is_floating_point_v<From>) {
    const double t = std::trunc((double)x);
    if (t != t) return 0;
    if (t >= (double)std::numeric_limits<To>::max()) return std::numeric_limits<To>::max();
    if (t <= (double)std::numeric_limits<To>::min()) return std::numeric_limits<To>::min();
    return static_cast<To>(t);
  } else {
    return static_cast<To>(x); // integer to integer wraps (two's complement)
  }
}
} // namespace

template <class From, class To> void cast(const From *x, int64_t n, To *y) {
  parallelElements(n, [&](int64_t lo, int64_t hi) {
    for (int64_t i = lo; i < hi; ++i) y[i] = castValue<To>(x[i]);
  });
}

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

#define PIPEC_EQ_WHERE(T)                                                                                              \
  template void compare<T>(Binary, const T *, const Shape &, const T *, const Shape &, uint8_t *);                    \
  template void where<T>(const uint8_t *, const Shape &, const T *, const Shape &, const T *, const Shape &, T *);
PIPEC_EQ_WHERE(float)
PIPEC_EQ_WHERE(double)
PIPEC_EQ_WHERE(int64_t)
PIPEC_EQ_WHERE(int32_t)
PIPEC_EQ_WHERE(uint8_t)
#undef PIPEC_EQ_WHERE

//===----------------------------------------------------------------------===//
// Dropout
//===----------------------------------------------------------------------===//

void dropout(const float *x, int64_t n, float *y, uint8_t *mask, float ratio, bool training, uint64_t streamKey) {
  const double r = ratio; // the evaluator holds the f32 attribute as a double
  if (!(r >= 0.0 && r < 1.0)) fail("nn.dropout", "ratio must be in [0, 1), got " + std::to_string(r));
  if (!training || r == 0.0) {
    if (y != x)
      for (int64_t i = 0; i < n; ++i) y[i] = x[i];
    if (mask)
      for (int64_t i = 0; i < n; ++i) mask[i] = 1;
    return;
  }
  const double scale = 1.0 / (1.0 - r);
  const uint64_t threshold = dropoutKeepThreshold(r);
  // Element i's draw depends on (key, i) only, so any split is the same mask.
  // A block's draws first, as integers (1 = dropped: the draw minus the
  // threshold is negative), so that each loop vectorizes.
  parallelVectorElements(n, [&](int64_t lo, int64_t hi) {
    constexpr int64_t kBlock = 256;
    uint32_t dropped[kBlock]; // the width of a float: the select below vectorizes
    for (int64_t begin = lo; begin < hi; begin += kBlock) {
      const int64_t len = std::min(kBlock, hi - begin);
      for (int64_t j = 0; j < len; ++j)
        dropped[j] = (uint32_t)((dropoutDraw(streamKey, (uint64_t)(begin + j)) - threshold) >> 63);
      const float *xb = x + begin;
      float *yb = y + begin;
      for (int64_t j = 0; j < len; ++j) {
        const float kept = (float)((double)xb[j] * scale);
        yb[j] = dropped[j] ? 0.0f : kept;
      }
      if (uint8_t *maskb = mask ? mask + begin : nullptr)
        for (int64_t j = 0; j < len; ++j) maskb[j] = (uint8_t)(1 - dropped[j]);
    }
  });
}

void dropoutGrad(const float *dy, const uint8_t *mask, int64_t n, float *dx, float ratio, bool training) {
  const double r = ratio;
  if (!(r >= 0.0 && r < 1.0)) fail("nn.dropout_grad", "ratio must be in [0, 1), got " + std::to_string(r));
  if (!training || r == 0.0) {
    if (dx != dy)
      for (int64_t i = 0; i < n; ++i) dx[i] = dy[i];
    return;
  }
  const double scale = 1.0 / (1.0 - r);
  parallelVectorElements(n, [&](int64_t lo, int64_t hi) {
    for (int64_t i = lo; i < hi; ++i) dx[i] = mask[i] ? (float)((double)dy[i] * scale) : 0.0f;
  });
}

void dropoutGradRedrawn(const float *dy, int64_t n, float *dx, float ratio, bool training, uint64_t streamKey) {
  const DropoutDraws draws = dropoutDraws("nn.dropout_grad", ratio, training, streamKey);
  if (!draws.active) {
    if (dx != dy)
      for (int64_t i = 0; i < n; ++i) dx[i] = dy[i];
    return;
  }
  parallelVectorElements(n, [&](int64_t lo, int64_t hi) {
    for (int64_t i = lo; i < hi; ++i) dx[i] = draws.apply(dy[i], draws.kept((uint64_t)i));
  });
}

} // namespace pipec::kernels
