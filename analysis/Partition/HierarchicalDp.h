#ifndef PIPEC_PARTITION_HIERARCHICALDP_H
#define PIPEC_PARTITION_HIERARCHICALDP_H

// PipeDream's hierarchical DP (design.md §2) as partition() and its error
// messages use it: the solver, the local search after a grouped run and the
// budget that sizes the groups. Not part of the library's interface.

#include "analysis/Partition/Partitioner.h"

#include <cstddef>
#include <memory>
#include <vector>

namespace pipec::partition::detail {

class Solver;

/// The DP on the units (layers) ending at `ends` (as groupIntoLayers gives);
/// its tables are filled as solve() needs them.
class HierarchicalDp {
public:
  HierarchicalDp(const CostModel &model, std::vector<int> ends);
  ~HierarchicalDp();

  /// How many memory variants of the device-level table the search may need: the
  /// outer terms reachable from the top, mapped to their feasibility classes.
  size_t deviceTableVariants() const;
  /// Returns the optimum and its tree (in op indices); infinity if nothing fits.
  double solve(PartitionTree &tree);

private:
  std::unique_ptr<Solver> solver_;
};

/// Local search after a grouped DP: grouping allows cuts only at layer ends, so
/// each stage boundary (at any level) is moved op by op within `window` ops while
/// the objective does not get worse, preferring positions that balance the two
/// device stages beside it, for at most `maxPasses` passes. Moves keep the tree
/// valid; the result is never worse than the DP's on the grouped graph.
void refineBoundaries(const CostModel &model, PartitionTree &tree, int window, int maxPasses);

/// The most layers whose DP fits the time budget (about 1 s here for 64x8), with
/// `lowerTables` memory variants of the tables below the top level.
int autoMaxLayers(const Topology &topology, const PartitionOptions &options, double lowerTables = 2);

/// Refuses a search that would run for more than a few seconds or allocate
/// gigabytes (measured: about 2.5 ns per step), naming what to change.
/// `layers` is the depth it would run at.
void checkSearchSize(const Topology &topology, const PartitionOptions &options, int layers, size_t numOps,
                     double lowerTables);

} // namespace pipec::partition::detail

#endif
