#ifndef PIPEC_PARTITION_COSTTABLE_H
#define PIPEC_PARTITION_COSTTABLE_H

#include <cstdint>
#include <iosfwd>
#include <string>
#include <vector>

namespace pipec::partition {

/// Costs of one op for one micro-batch (docs/cost-table.md).
struct OpCost {
  std::string name, type;
  double forwardSeconds = 0, backwardInputSeconds = 0, backwardWeightSeconds = 0;
  int64_t activationBytes = 0; ///< output activation bytes of one micro-batch
  int64_t parameterBytes = 0;
  int64_t optimizerStateBytes = 0;
  std::vector<std::string> producers; ///< names of earlier ops whose outputs this op reads

  double computeSeconds() const {
    return forwardSeconds + backwardInputSeconds + backwardWeightSeconds;
  }
};

/// Ops in a topological order (every producer precedes its consumers).
struct CostTable {
  std::vector<OpCost> ops;

  /// Index of each op's producers; throws Error on unknown or later producers
  /// and on duplicate op names. `source` names the table in messages.
  std::vector<std::vector<int>> producerIndices(const std::string &source = "cost table") const;
};

/// Reads the CSV format of docs/cost-table.md. Throws Error("FILE:LINE: reason").
CostTable readCostTableCsv(std::istream &in, const std::string &fileName);
CostTable readCostTableCsvFile(const std::string &path);
void writeCostTableCsv(std::ostream &out, const CostTable &table);

} // namespace pipec::partition

#endif
