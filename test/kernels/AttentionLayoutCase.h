// What the attention-layout tests share (test/kernels/AttentionLayoutTest.cpp
// on the CPU kernels, cuda_emulation/attention_layout_emulated_test.cpp on
// the CUDA ones): one case in both layouts, and the transpose between them.
#ifndef PIPEC_TEST_KERNELS_ATTENTIONLAYOUTCASE_H
#define PIPEC_TEST_KERNELS_ATTENTIONLAYOUTCASE_H

#include "pipec/kernel_types.h"

#include <cstring>
#include <string>
#include <vector>

namespace pipec::kernels::testing {

using Layout = AttentionLayout;

/// x [outer, a, b, width] as [outer, b, a, width].
template <class T>
std::vector<T> swapMiddleAxes(const std::vector<T> &x, int64_t outer, int64_t a, int64_t b, int64_t width) {
  std::vector<T> out(x.size());
  for (int64_t o = 0; o < outer; ++o)
    for (int64_t i = 0; i < a; ++i)
      for (int64_t j = 0; j < b; ++j)
        std::memcpy(&out[((o * b + j) * a + i) * width], &x[((o * a + i) * b + j) * width], width * sizeof(T));
  return out;
}

/// One attention in both layouts: leading axes L'..., H heads, S query and
/// T key rows, head sizes D and Dv, and a mask over the logical scores
/// [L'..., H, S, T]: 0 none, 1 boolean, 2 causal (an ordinary boolean
/// mask), 3 additive, 4 causal declared as such (CUDA: cuDNN's causal mode);
/// Hkv key/value heads (grouped-query heads; 0: H).
struct LayoutCase {
  Shape lead;
  int64_t H, S, T, D, Dv;
  int maskKind;
  Shape ms;
  bool divide;
  int64_t Hkv = 0;
  int64_t outer() const { return lead.numel(); }
  int64_t kvHeads() const { return Hkv ? Hkv : H; }
  /// An operand of `heads` heads (0: H) in `layout`.
  Shape shape(Layout layout, int64_t rows, int64_t width, int64_t heads = 0) const {
    Shape s = lead;
    if (!heads) heads = H;
    if (layout == Layout::SequenceMajor) {
      s.push(rows), s.push(heads);
    } else {
      s.push(heads), s.push(rows);
    }
    s.push(width);
    return s;
  }
  /// The same case with its key/value heads repeated to H.
  LayoutCase repeated() const {
    LayoutCase c = *this;
    c.Hkv = 0;
    return c;
  }
  std::string str() const {
    static const char *const kinds[] = {"no mask", "boolean mask", "causal mask", "additive mask",
                                        "declared causal mask"};
    return "L' " + lead.str() + " H " + std::to_string(H) + (Hkv ? " Hkv " + std::to_string(Hkv) : "") + " S " +
           std::to_string(S) + " T " + std::to_string(T) + " D " + std::to_string(D) + " Dv " + std::to_string(Dv) +
           ", " + kinds[maskKind] + " " + ms.str() + (divide ? ", divided" : "");
  }
};

/// An operand of `heads` heads in `layout` ([outer, heads, rows, width] or
/// [outer, rows, heads, width]) with each head repeated `group` times in
/// place, as grouped-query heads are read.
template <class T>
std::vector<T> repeatHeads(const std::vector<T> &x, Layout layout, int64_t outer, int64_t heads, int64_t rows,
                           int64_t width, int64_t group) {
  const bool headMajor = layout == Layout::HeadMajor;
  const int64_t blocks = headMajor ? outer : outer * rows, inner = headMajor ? rows * width : width;
  std::vector<T> out((size_t)(blocks * heads * group * inner));
  for (int64_t b = 0; b < blocks; ++b)
    for (int64_t h = 0; h < heads * group; ++h)
      std::memcpy(&out[(b * heads * group + h) * inner], &x[(b * heads + h / group) * inner], inner * sizeof(T));
  return out;
}

/// The gradient of repeatHeads: each group of `group` heads summed (in double).
inline std::vector<float> sumHeadGroups(const std::vector<float> &dx, Layout layout, int64_t outer, int64_t heads,
                                        int64_t rows, int64_t width, int64_t group) {
  const bool headMajor = layout == Layout::HeadMajor;
  const int64_t blocks = headMajor ? outer : outer * rows, inner = headMajor ? rows * width : width;
  std::vector<float> out((size_t)(blocks * heads * inner));
  for (int64_t b = 0; b < blocks; ++b)
    for (int64_t h = 0; h < heads; ++h)
      for (int64_t e = 0; e < inner; ++e) {
        double sum = 0;
        for (int64_t j = 0; j < group; ++j) sum += dx[((b * heads + h) * group + j) * inner + e];
        out[(b * heads + h) * inner + e] = (float)sum;
      }
  return out;
}

/// Sequence-major q [outer, S, H, D], k and v [outer, S, Hkv, D] as one
/// joint [outer, S, H + 2·Hkv, D] value (nn.attention's joint_kv_heads):
/// each row the query's heads, then the key's, then the value's.
template <class T>
std::vector<T> jointOf(const std::vector<T> &q, const std::vector<T> &k, const std::vector<T> &v, int64_t outer,
                       int64_t S, int64_t H, int64_t Hkv, int64_t D) {
  const int64_t N = H + 2 * Hkv;
  std::vector<T> joint((size_t)(outer * S * N * D));
  for (int64_t row = 0; row < outer * S; ++row) {
    T *out = &joint[row * N * D];
    std::memcpy(out, &q[row * H * D], H * D * sizeof(T));
    std::memcpy(out + H * D, &k[row * Hkv * D], Hkv * D * sizeof(T));
    std::memcpy(out + (H + Hkv) * D, &v[row * Hkv * D], Hkv * D * sizeof(T));
  }
  return joint;
}

/// The window of `heads` heads from head `first` of a joint [rows, N, D]
/// value, as its own [rows, heads, D] tensor.
template <class T>
std::vector<T> jointWindow(const std::vector<T> &joint, int64_t rows, int64_t N, int64_t D, int64_t first,
                           int64_t heads) {
  std::vector<T> out((size_t)(rows * heads * D));
  for (int64_t row = 0; row < rows; ++row)
    std::memcpy(&out[row * heads * D], &joint[(row * N + first) * D], heads * D * sizeof(T));
  return out;
}

/// Joint q/k/v cases: S = T and D = Dv, as one projection gives them.
inline const LayoutCase kJointCases[] = {
    {{2}, 3, 5, 5, 8, 8, 1, {2, 1, 5, 5}, false},          // a mask per batch entry
    {{2}, 2, 70, 70, 16, 16, 2, {70, 70}, true},           // causal, two blocks of 64 rows
    {{2}, 6, 6, 6, 8, 8, 3, {1, 6, 6, 6}, false, 2},       // additive, 3 query heads per key/value head
    {{}, 4, 5, 5, 8, 8, 0, {}, false},                     // no leading axes
    {{2}, 3, 12, 12, 16, 16, 4, {1, 1, 12, 12}, false}};   // declared causal (CUDA: cuDNN's causal mode)

} // namespace pipec::kernels::testing

#endif
