// Re-specialization: the polynomials in the symbols (RespecializeInternal.h).
#include "compiler/Import/RespecializeInternal.h"

namespace pipec::import::detail::respecialize {

int64_t checkedProduct(int64_t a, int64_t b) {
  int64_t r;
  if (__builtin_mul_overflow(a, b, &r))
    throw Failure{"a size overflows 64 bits"};
  return r;
}

int64_t Poly::at(const std::vector<int64_t> &sizes) const {
  int64_t sum = 0;
  for (const auto &[exponents, coefficient] : terms) {
    int64_t term = coefficient;
    for (size_t s = 0; s < exponents.size(); ++s)
      for (int e = 0; e < exponents[s]; ++e)
        term = checkedProduct(term, sizes[s]);
    if (__builtin_add_overflow(sum, term, &sum))
      throw Failure{"a size overflows 64 bits"};
  }
  return sum;
}

Poly operator+(const Poly &a, const Poly &b) {
  Poly r = a;
  for (const auto &[e, c] : b.terms) {
    int64_t &sum = r.terms[e];
    if (__builtin_add_overflow(sum, c, &sum))
      throw Failure{"a size overflows 64 bits"};
    if (sum == 0)
      r.terms.erase(e);
  }
  return r;
}

Poly operator*(const Poly &a, const Poly &b) {
  Poly r;
  for (const auto &[ea, ca] : a.terms)
    for (const auto &[eb, cb] : b.terms) {
      std::vector<int> e = ea;
      for (size_t s = 0; s < e.size(); ++s)
        if ((e[s] += eb[s]) > 64)
          throw Failure{"a size grows beyond the 64th power of a changing dimension"};
      if ((r.terms[e] += checkedProduct(ca, cb)) == 0)
        r.terms.erase(e);
    }
  return r;
}


} // namespace pipec::import::detail::respecialize
