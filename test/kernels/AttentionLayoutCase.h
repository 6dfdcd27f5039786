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
/// mask), 3 additive, 4 causal declared as such (CUDA: cuDNN's causal mode).
struct LayoutCase {
  Shape lead;
  int64_t H, S, T, D, Dv;
  int maskKind;
  Shape ms;
  bool divide;
  int64_t outer() const { return lead.numel(); }
  Shape shape(Layout layout, int64_t rows, int64_t width) const {
    Shape s = lead;
    if (layout == Layout::SequenceMajor) {
      s.push(rows), s.push(H);
    } else {
      s.push(H), s.push(rows);
    }
    s.push(width);
    return s;
  }
  std::string str() const {
    static const char *const kinds[] = {"no mask", "boolean mask", "causal mask", "additive mask",
                                        "declared causal mask"};
    return "L' " + lead.str() + " H " + std::to_string(H) + " S " + std::to_string(S) + " T " + std::to_string(T) +
           " D " + std::to_string(D) + " Dv " + std::to_string(Dv) + ", " + kinds[maskKind] + " " + ms.str() +
           (divide ? ", divided" : "");
  }
};

} // namespace pipec::kernels::testing

#endif
