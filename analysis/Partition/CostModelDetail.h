#ifndef PIPEC_PARTITION_COSTMODELDETAIL_H
#define PIPEC_PARTITION_COSTMODELDETAIL_H

// Private arithmetic of the cost model that its evaluation (CostModel.cpp), the
// flat plans built from trees (Describe.cpp) and the DP (HierarchicalDp.cpp)
// must compute the same way. Not part of the library's interface.

#include <cstdint>
#include <limits>

namespace pipec::partition::detail {

inline constexpr double kInf = std::numeric_limits<double>::infinity();

inline int64_t ceilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

/// The `outer` term an inner pipeline sees: the devices after a stage of r
/// replicas with x workers (of `workerDevices` each) after it, plus what lies
/// beyond its own pipeline, per replica (rounded up; exact, see
/// CostModel::inflight()).
inline int64_t innerOuterOf(int64_t x, int64_t r, int64_t outer, int64_t workerDevices) {
  return ceilDiv(x * workerDevices + outer, r);
}

} // namespace pipec::partition::detail

#endif
