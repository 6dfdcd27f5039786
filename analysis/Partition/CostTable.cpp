#include "analysis/Partition/CostTable.h"

#include "analysis/Partition/Error.h"
#include "analysis/Partition/InputFiles.h"

#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <istream>
#include <ostream>
#include <sstream>
#include <unordered_map>
#include <unordered_set>

namespace pipec::partition {

static const char *const kColumns[] = {
    "name",           "type",            "fwd_s",           "bwd_input_s", "bwd_weight_s",
    "activation_bytes", "parameter_bytes", "optimizer_bytes", "producers"};
static constexpr int kNumColumns = 9;
/// Optional: without it, every output is kept for the backward.
static const char *const kSavedColumn = "saved_bytes";

static std::string formatDouble(double v) {
  std::ostringstream os;
  os.precision(17);
  os << v;
  return os.str();
}

std::vector<std::vector<int>> CostTable::producerIndices(const std::string &source) const {
  std::unordered_map<std::string, int> index;
  std::vector<std::vector<int>> result(ops.size());
  for (size_t i = 0; i < ops.size(); ++i) {
    for (const std::string &p : ops[i].producers) {
      auto it = index.find(p);
      if (it != index.end()) {
        result[i].push_back(it->second);
        continue;
      }
      bool later = false;
      for (size_t k = i; k < ops.size(); ++k)
        later = later || ops[k].name == p;
      throw Error(source + ": op '" + ops[i].name + "' reads '" + p + "', " +
                  (later ? "which comes later (the ops are not in a topological order)"
                         : "which is not an op of the table"));
    }
    if (!index.emplace(ops[i].name, static_cast<int>(i)).second)
      throw Error(source + ": op name '" + ops[i].name + "' appears twice");
  }
  return result;
}

CostTable reorderedCostTable(const CostTable &table, const std::vector<int> &order, const std::string &source) {
  if (order.size() != table.ops.size())
    throw Error(source + ": the op order names " + std::to_string(order.size()) + " ops, the table has " +
                std::to_string(table.ops.size()));
  std::vector<char> seen(table.ops.size(), 0);
  CostTable out;
  out.microbatchSize = table.microbatchSize;
  out.ops.reserve(order.size());
  for (int index : order) {
    if (index < 0 || index >= static_cast<int>(table.ops.size()) || seen[index])
      throw Error(source + ": the op order is not a permutation of the table's ops (index " +
                  std::to_string(index) + ")");
    seen[index] = 1;
    out.ops.push_back(table.ops[index]);
  }
  out.producerIndices(source); // every producer first, or Error
  return out;
}

void validateOpCost(const OpCost &op, const std::string &where) {
  auto fail = [&](const std::string &why) { throw Error(where + "op '" + op.name + "': " + why); };
  const std::pair<const char *, double> times[] = {{"fwd_s", op.forwardSeconds},
                                                   {"bwd_input_s", op.backwardInputSeconds},
                                                   {"bwd_weight_s", op.backwardWeightSeconds}};
  for (auto [column, seconds] : times) {
    if (!std::isfinite(seconds) || seconds < 0)
      fail(std::string(column) + " is " + formatDouble(seconds) + " (must be finite and >= 0)");
    if (seconds > kMaxOpSeconds)
      fail(std::string(column) + " is " + formatDouble(seconds) + " s, over the limit of " +
           formatDouble(kMaxOpSeconds) + " s");
  }
  const std::pair<const char *, int64_t> bytes[] = {{"activation_bytes", op.activationBytes},
                                                    {kSavedColumn, op.keptBytes()},
                                                    {"parameter_bytes", op.parameterBytes},
                                                    {"optimizer_bytes", op.optimizerStateBytes}};
  for (auto [column, value] : bytes) {
    if (value < 0)
      fail(std::string(column) + " is " + std::to_string(value) + " (must be >= 0)");
    if (value > kMaxOpBytes)
      fail(std::string(column) + " is " + std::to_string(value) + ", over the limit of " +
           std::to_string(kMaxOpBytes) + " bytes (16 TiB)");
  }
}

void validateCostTable(const CostTable &table, const std::string &source) {
  if (table.ops.size() > kMaxCostTableOps)
    throw Error(source + ": " + std::to_string(table.ops.size()) + " ops, over the limit of " +
                std::to_string(kMaxCostTableOps));
  int64_t total = 0; // each term <= 2^44, fewer than 2^20 ops: no overflow before the check
  for (const OpCost &op : table.ops) {
    validateOpCost(op, source + ": ");
    total += op.activationBytes + op.parameterBytes + op.optimizerStateBytes;
    if (total > kMaxCostTableBytes)
      throw Error(source + ": the ops' bytes add up to more than the limit of " +
                  std::to_string(kMaxCostTableBytes) + " bytes (1 PiB) by op '" + op.name + "'");
  }
}

namespace {

/// Splits one CSV record (RFC 4180); a quoted field may span lines, so the
/// reader pulls more lines from `in` when a quote is open.
bool readRecord(std::istream &in, std::vector<std::string> &fields, int &line,
                const std::string &file) {
  fields.clear();
  std::string text;
  if (!std::getline(in, text))
    return false;
  ++line;
  int startLine = line;
  std::string field;
  bool quoted = false, wasQuoted = false;
  for (size_t i = 0;; ++i) {
    if (i == text.size()) {
      if (!quoted)
        break;
      std::string more;
      if (!std::getline(in, more))
        throw Error(file + ":" + std::to_string(startLine) + ": unterminated quoted field");
      ++line;
      field += '\n';
      text = more;
      i = static_cast<size_t>(-1);
      continue;
    }
    char c = text[i];
    if (quoted) {
      if (c == '"' && i + 1 < text.size() && text[i + 1] == '"') {
        field += '"';
        ++i;
      } else if (c == '"') {
        quoted = false;
      } else {
        field += c;
      }
    } else if (c == '"' && field.empty() && !wasQuoted) {
      quoted = wasQuoted = true;
    } else if (c == ',') {
      fields.push_back(field);
      field.clear();
      wasQuoted = false;
    } else if (c == '\r' && i + 1 == text.size()) {
      // CRLF line ending
    } else {
      field += c;
    }
  }
  fields.push_back(field);
  return true;
}

std::string quoteField(const std::string &s) {
  if (s.find_first_of(",\"\n\r") == std::string::npos)
    return s;
  std::string out = "\"";
  for (char c : s) {
    if (c == '"')
      out += '"';
    out += c;
  }
  return out + "\"";
}

} // namespace

CostTable readCostTableCsv(std::istream &in, const std::string &file) {
  std::vector<std::string> fields;
  int line = 0;
  if (!readRecord(in, fields, line, file))
    throw Error(file + ": empty file (expected a header row)");
  if (fields.size() > kMaxCostTableColumns)
    throw Error(file + ":" + std::to_string(line) + ": " + std::to_string(fields.size()) +
                " columns, over the limit of " + std::to_string(kMaxCostTableColumns));
  auto columnNamed = [&](const char *name) {
    int found = -1;
    for (size_t f = 0; f < fields.size(); ++f)
      if (fields[f] == name)
        found = static_cast<int>(f);
    return found;
  };
  int column[kNumColumns];
  for (int c = 0; c < kNumColumns; ++c) {
    column[c] = columnNamed(kColumns[c]);
    // producers is required too: without it the DAG cuts cannot be computed.
    if (column[c] < 0)
      throw Error(file + ":" + std::to_string(line) + ": missing column '" + kColumns[c] + "'");
  }
  const int savedColumn = columnNamed(kSavedColumn);
  size_t width = fields.size();
  CostTable table;
  std::unordered_set<std::string> seen;
  while (readRecord(in, fields, line, file)) {
    if (fields.size() == 1 && fields[0].empty())
      continue; // blank line
    std::string where = file + ":" + std::to_string(line) + ": ";
    if (table.ops.size() >= kMaxCostTableOps)
      throw Error(where + "more than " + std::to_string(kMaxCostTableOps) + " ops, over the limit");
    if (fields.size() != width)
      throw Error(where + "expected " + std::to_string(width) + " fields, found " +
                  std::to_string(fields.size()));
    auto numberIn = [&](int field, const char *name) -> double {
      const std::string &s = fields[field];
      char *end = nullptr;
      errno = 0;
      double v = std::strtod(s.c_str(), &end);
      if (s.empty() || *end != '\0' || errno == ERANGE || !std::isfinite(v))
        throw Error(where + "column '" + name + "': '" + s + "' is not a number");
      if (v < 0)
        throw Error(where + "column '" + name + "': " + s + " is negative");
      return v;
    };
    auto number = [&](int c) { return numberIn(column[c], kColumns[c]); };
    auto integerIn = [&](int field, const char *name) -> int64_t {
      double v = numberIn(field, name);
      const std::string &s = fields[field];
      if (v != std::floor(v))
        throw Error(where + "column '" + name + "': '" + s + "' is not a whole number of bytes");
      if (v > static_cast<double>(kMaxOpBytes))
        throw Error(where + "column '" + name + "': " + s + " is over the limit of " +
                    std::to_string(kMaxOpBytes) + " bytes (16 TiB)");
      return static_cast<int64_t>(v);
    };
    auto integer = [&](int c) { return integerIn(column[c], kColumns[c]); };
    OpCost op;
    op.name = fields[column[0]];
    op.type = fields[column[1]];
    if (op.name.empty())
      throw Error(where + "empty op name");
    op.forwardSeconds = number(2);
    op.backwardInputSeconds = number(3);
    op.backwardWeightSeconds = number(4);
    op.activationBytes = integer(5);
    if (savedColumn >= 0)
      op.savedBytes = integerIn(savedColumn, kSavedColumn);
    op.parameterBytes = integer(6);
    op.optimizerStateBytes = integer(7);
    std::string producers = fields[column[8]];
    size_t start = 0;
    while (start <= producers.size() && !producers.empty()) {
      size_t end = producers.find(';', start);
      if (end == std::string::npos)
        end = producers.size();
      std::string p = producers.substr(start, end - start);
      if (p.empty())
        throw Error(where + "empty producer name in '" + producers + "'");
      op.producers.push_back(p);
      start = end + 1;
    }
    // Validate producers as rows arrive so the message carries the line number.
    for (const std::string &p : op.producers)
      if (!seen.count(p))
        throw Error(where + "op '" + op.name + "' reads '" + p +
                    "', which is not an earlier op (unknown, or the rows are not in a "
                    "topological order)");
    if (!seen.insert(op.name).second)
      throw Error(where + "op name '" + op.name + "' appears twice");
    validateOpCost(op, where);
    table.ops.push_back(std::move(op));
  }
  if (table.ops.empty())
    throw Error(file + ": no ops (only a header row)");
  validateCostTable(table, file);
  return table;
}

CostTable readCostTableCsvFile(const std::string &path) {
  std::istringstream in(readUserFile(path, "cost table", kMaxCostTableFileBytes));
  return readCostTableCsv(in, path);
}

void writeCostTableCsv(std::ostream &out, const CostTable &table) {
  for (int c = 0; c < kNumColumns; ++c)
    out << (c ? "," : "") << kColumns[c];
  out << "," << kSavedColumn << "\n";
  for (const OpCost &op : table.ops) {
    std::string producers;
    for (size_t i = 0; i < op.producers.size(); ++i)
      producers += (i ? ";" : "") + op.producers[i];
    out << quoteField(op.name) << ',' << quoteField(op.type) << ','
        << formatDouble(op.forwardSeconds) << ',' << formatDouble(op.backwardInputSeconds) << ','
        << formatDouble(op.backwardWeightSeconds) << ',' << op.activationBytes << ','
        << op.parameterBytes << ',' << op.optimizerStateBytes << ',' << quoteField(producers) << ','
        << op.keptBytes() << "\n";
  }
}

} // namespace pipec::partition
