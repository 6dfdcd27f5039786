#ifndef PIPEC_PARTITION_DEVICERANGES_H
#define PIPEC_PARTITION_DEVICERANGES_H

// The second search of partition() (docs/partition.md, "Stages that share
// servers, cuts at antichains"): pipelines whose stages take consecutive device
// ranges anywhere in the topology, cut at any antichain of the DAG.

#include "analysis/Partition/Partitioner.h"

#include <limits>
#include <vector>

namespace pipec::partition {

struct DeviceRangePlan {
  /// PipeDream's objective (CostModel::evaluate of `tree` on the ops in `order`);
  /// infinity when nothing fits or the search was skipped.
  double value = std::numeric_limits<double>::infinity();
  PartitionTree tree;     ///< deviceRanges; op indices are positions in `order`
  std::vector<int> order; ///< table indices: ops by stage, then in table order
  int units = 0;          ///< the units (groups of consecutive ops) searched over
  bool tooLarge = false;  ///< the search would exceed its budget on these units
};

/// Exact search over the unit DAG of `unitEnds` (as groupIntoLayers gives): every
/// chain of nested ideals (each stage is the difference of two, so each cut is
/// an antichain) and every split of all the devices into consecutive ranges, one
/// per stage. Returns tooLarge (and no plan) when it would take more than
/// `maxIdeals` ideals or `maxSteps` inner steps.
DeviceRangePlan searchDeviceRanges(const CostModel &model, const std::vector<int> &unitEnds, double maxSteps,
                                   int maxIdeals);

/// The search on the finest units within budget (options.maxLayers, when set, is
/// the first try); infinity when even coarse units exceed it or no stage set fits.
DeviceRangePlan searchDeviceRangesWithinBudget(const CostModel &model);

} // namespace pipec::partition

#endif
