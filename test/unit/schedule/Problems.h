// The schedule tests' problems: p stages, m micro-batches, uniform costs.
#pragma once

#include "analysis/Schedule/Schedule.h"

namespace pipec::schedule::test {

inline Problem uniform(int p, int m, double f = 1, double b = 1, double w = 1, double comm = 0) {
  Problem P;
  P.stages = p;
  P.microbatches = m;
  P.costF = {f};
  P.costB = {b};
  P.costW = {w};
  P.comm = comm;
  return P;
}

} // namespace pipec::schedule::test
