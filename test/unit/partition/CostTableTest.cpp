#include "analysis/Partition/CostTable.h"
#include "analysis/Partition/Error.h"

#include <gtest/gtest.h>

#include <sstream>

using namespace pipec::partition;

namespace {

const char *kHeader = "name,type,fwd_s,bwd_input_s,bwd_weight_s,activation_bytes,parameter_bytes,optimizer_bytes,producers\n";

CostTable parse(const std::string &body) {
  std::istringstream in(std::string(kHeader) + body);
  return readCostTableCsv(in, "costs.csv");
}

std::string errorOf(const std::string &text) {
  std::istringstream in(text);
  try {
    readCostTableCsv(in, "costs.csv");
  } catch (const Error &e) {
    return e.what();
  }
  return "no error";
}

} // namespace

TEST(CostTable, ReadsRowsAndProducers) {
  CostTable t = parse("a,Gemm,1e-3,2e-3,3e-3,100,40,80,\n"
                      "b,Relu,0.5,0,0,100,0,0,a\n"
                      "c,Add,0.25,0,0,7,0,0,a;b\n");
  ASSERT_EQ(t.ops.size(), 3u);
  EXPECT_EQ(t.ops[0].type, "Gemm");
  EXPECT_DOUBLE_EQ(t.ops[0].computeSeconds(), 6e-3);
  EXPECT_EQ(t.ops[0].optimizerStateBytes, 80);
  EXPECT_TRUE(t.ops[0].producers.empty());
  EXPECT_EQ(t.ops[2].producers, (std::vector<std::string>{"a", "b"}));
  EXPECT_EQ(t.producerIndices()[2], (std::vector<int>{0, 1}));
}

TEST(CostTable, ColumnsInAnyOrder) {
  std::istringstream in("producers,name,type,fwd_s,bwd_input_s,bwd_weight_s,activation_bytes,parameter_bytes,optimizer_bytes\n"
                        ",x,T,1,2,3,4,5,6\n");
  CostTable t = readCostTableCsv(in, "f.csv");
  EXPECT_EQ(t.ops[0].name, "x");
  EXPECT_EQ(t.ops[0].optimizerStateBytes, 6);
}

TEST(CostTable, WriteThenReadRoundTripsWithQuoting) {
  CostTable t;
  OpCost a;
  a.name = "layer,1 \"q\"";
  a.type = "Mat\nMul";
  a.forwardSeconds = 1.0 / 3;
  a.activationBytes = 123456789012;
  a.parameterBytes = 5;
  OpCost b = a;
  b.name = "b";
  b.producers = {a.name};
  t.ops = {a, b};
  std::stringstream s;
  writeCostTableCsv(s, t);
  CostTable back = readCostTableCsv(s, "rt.csv");
  ASSERT_EQ(back.ops.size(), 2u);
  EXPECT_EQ(back.ops[0].name, a.name);
  EXPECT_EQ(back.ops[0].type, a.type);
  EXPECT_EQ(back.ops[0].forwardSeconds, a.forwardSeconds); // exact: 17 digits
  EXPECT_EQ(back.ops[0].activationBytes, a.activationBytes);
  EXPECT_EQ(back.ops[1].producers, b.producers);
}

TEST(CostTable, SavedBytesAreOptionalAndRoundTrip) {
  // Without the column every output counts as kept (tables written before it).
  std::istringstream old(std::string(kHeader) + "a,T,1,0,0,400,0,0,\n");
  CostTable without = readCostTableCsv(old, "old.csv");
  EXPECT_FALSE(without.ops[0].savedBytes.has_value());
  EXPECT_EQ(without.ops[0].keptBytes(), 400);
  std::istringstream given(std::string("saved_bytes,") + kHeader + "96,a,T,1,0,0,400,0,0,\n");
  CostTable with = readCostTableCsv(given, "new.csv");
  EXPECT_EQ(with.ops[0].keptBytes(), 96);
  std::stringstream written;
  writeCostTableCsv(written, with);
  EXPECT_EQ(readCostTableCsv(written, "rt.csv").ops[0].keptBytes(), 96);
  // The composite an op becomes at -O2 may keep more than the op's own results.
  std::istringstream more(std::string("saved_bytes,") + kHeader + "800,a,T,1,0,0,400,0,0,\n");
  EXPECT_EQ(readCostTableCsv(more, "more.csv").ops[0].keptBytes(), 800);
  std::istringstream negative(std::string("saved_bytes,") + kHeader + "-1,a,T,1,0,0,400,0,0,\n");
  EXPECT_THROW(readCostTableCsv(negative, "neg.csv"), Error);
}

TEST(CostTable, ErrorsNameFileLineAndReason) {
  std::string h = kHeader;
  EXPECT_EQ(errorOf(h + "a,T,1,0,0,1,0,0,\nb,T,1,0,0,1,0,0,zz\n"),
            "costs.csv:3: op 'b' reads 'zz', which is not an earlier op (unknown, or the rows are not "
            "in a topological order)");
  EXPECT_NE(errorOf(h + "a,T,1,0,0,1,0,0,b\nb,T,1,0,0,1,0,0,\n").find("costs.csv:2: op 'a' reads 'b'"),
            std::string::npos);
  EXPECT_EQ(errorOf(h + "a,T,-1,0,0,1,0,0,\n"), "costs.csv:2: column 'fwd_s': -1 is negative");
  EXPECT_EQ(errorOf(h + "a,T,1,0,0,1x,0,0,\n"), "costs.csv:2: column 'activation_bytes': '1x' is not a number");
  EXPECT_EQ(errorOf(h + "a,T,1,0,0,1.5,0,0,\n"),
            "costs.csv:2: column 'activation_bytes': '1.5' is not a whole number of bytes");
  EXPECT_EQ(errorOf(h + "a,T,1,0,0,1,0,0\n"), "costs.csv:2: expected 9 fields, found 8");
  EXPECT_EQ(errorOf(h + "a,T,1,0,0,1,0,0,\na,T,1,0,0,1,0,0,\n"), "costs.csv:3: op name 'a' appears twice");
  EXPECT_EQ(errorOf("name,type,fwd_s,bwd_input_s,bwd_weight_s,activation_bytes,parameter_bytes,producers\n"),
            "costs.csv:1: missing column 'optimizer_bytes'");
  EXPECT_EQ(errorOf(""), "costs.csv: empty file (expected a header row)");
  EXPECT_EQ(errorOf(h), "costs.csv: no ops (only a header row)");
  EXPECT_EQ(errorOf(h + "\"a,T,1\n"), "costs.csv:2: unterminated quoted field");
  EXPECT_EQ(errorOf(h + "a,T,nan,0,0,1,0,0,\n"), "costs.csv:2: column 'fwd_s': 'nan' is not a number");
}

TEST(CostTable, MissingFileIsAnError) {
  EXPECT_THROW(readCostTableCsvFile("/nonexistent/costs.csv"), Error);
}
