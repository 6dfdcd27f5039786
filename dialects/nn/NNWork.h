// The work an `nn` op does, as each op reports it through NNCostInterface;
// the cost-estimation pass turns it into times with a device model.
#ifndef PIPEC_DIALECTS_NN_NNWORK_H
#define PIPEC_DIALECTS_NN_NNWORK_H

#include "llvm/ADT/SmallVector.h"

namespace pipec::nn {

struct OpWork {
  /// Forward: floating-point operations and bytes moved to and from memory.
  double forwardFlops = 0, forwardBytes = 0;
  /// Per operand, the work of the gradient with respect to that operand (0 for
  /// operands without a gradient: integers, masks, indices).
  llvm::SmallVector<double, 4> gradientFlops, gradientBytes;
  /// Views (reshape, squeeze, ...) run no kernel and cost no launch.
  bool launchesKernel = true;
};

} // namespace pipec::nn

#endif // PIPEC_DIALECTS_NN_NNWORK_H
