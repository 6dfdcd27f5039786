#ifndef PIPEC_PARTITION_COSTTABLE_H
#define PIPEC_PARTITION_COSTTABLE_H

#include <cstdint>
#include <iosfwd>
#include <optional>
#include <string>
#include <vector>

namespace pipec::partition {

/// Bounds on a cost table (CSV or computed): far above any real model, low
/// enough that every sum the partitioner forms stays finite and within int64.
inline constexpr size_t kMaxCostTableOps = size_t(1) << 18;
inline constexpr size_t kMaxCostTableColumns = 64;
inline constexpr double kMaxOpSeconds = 1e6;                 ///< per op and column
inline constexpr int64_t kMaxOpBytes = int64_t(1) << 44;     ///< 16 TiB per op and column
inline constexpr int64_t kMaxCostTableBytes = int64_t(1) << 50; ///< 1 PiB over all ops and columns

/// Costs of one op for one micro-batch (docs/cost-table.md).
struct OpCost {
  std::string name, type;
  double forwardSeconds = 0, backwardInputSeconds = 0, backwardWeightSeconds = 0;
  int64_t activationBytes = 0; ///< output activation bytes of one micro-batch
  /// What one micro-batch keeps from the op's forward for its backward (the
  /// outputs the gradients read; at -O2 those of the composite the op becomes,
  /// docs/cost-model.md); not given (a cost table without the column): all
  /// its outputs.
  std::optional<int64_t> savedBytes;
  int64_t parameterBytes = 0;
  int64_t optimizerStateBytes = 0;
  std::vector<std::string> producers; ///< names of earlier ops whose outputs this op reads

  double computeSeconds() const {
    return forwardSeconds + backwardInputSeconds + backwardWeightSeconds;
  }
  /// Bytes one micro-batch keeps from its forward until its backward.
  int64_t keptBytes() const { return savedBytes.value_or(activationBytes); }
};

/// Ops in a topological order (every producer precedes its consumers).
struct CostTable {
  std::vector<OpCost> ops;
  /// Samples per micro-batch the costs are of (the model's batch dimension);
  /// 0: unknown, as for a cost table file (docs/cost-table.md).
  int64_t microbatchSize = 0;

  /// Index of each op's producers; throws Error on unknown or later producers
  /// and on duplicate op names. `source` names the table in messages.
  std::vector<std::vector<int>> producerIndices(const std::string &source = "cost table") const;
};

/// Checks the bounds above (times finite, >= 0 and at most kMaxOpSeconds; bytes
/// >= 0 and at most kMaxOpBytes; at most kMaxCostTableOps ops and
/// kMaxCostTableBytes in all). Throws Error("SOURCE: op 'NAME': reason").
void validateCostTable(const CostTable &table, const std::string &source);
/// The same for one op; `where` prefixes the message ("FILE:LINE: ").
void validateOpCost(const OpCost &op, const std::string &where);

/// The table with its ops in `order` (indices into `table`). Throws Error naming
/// `source` unless `order` is a permutation in which every producer comes first.
CostTable reorderedCostTable(const CostTable &table, const std::vector<int> &order, const std::string &source);

/// Reads the CSV format of docs/cost-table.md. Throws Error("FILE:LINE: reason").
CostTable readCostTableCsv(std::istream &in, const std::string &fileName);
CostTable readCostTableCsvFile(const std::string &path);
void writeCostTableCsv(std::ostream &out, const CostTable &table);

} // namespace pipec::partition

#endif
