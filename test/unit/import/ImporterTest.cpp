// Importer behaviour that is easiest to set up in C++: external data files,
// hostile locations, and the --input-shape parser.
#include "compiler/Import/OnnxImporter.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/IR/MLIRContext.h"

#include <gtest/gtest.h>
#include <onnx/onnx_pb.h>

#include <filesystem>
#include <fstream>

namespace fs = std::filesystem;
using pipec::import::ImportOptions;

namespace {

/// A folder of its own per test, removed afterwards.
class ImporterTest : public ::testing::Test {
protected:
  void SetUp() override {
    directory = fs::temp_directory_path() /
                ("pipec-import-" + std::to_string(::getpid()) + "-" +
                 ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(directory);
    fs::create_directories(directory / "model");
  }
  void TearDown() override { fs::remove_all(directory); }

  /// y = x * w with w (4 floats) stored externally at `location`.
  std::string writeModel(const std::string &location, int64_t length = 16) {
    onnx::ModelProto model;
    model.set_ir_version(8);
    model.add_opset_import()->set_version(13);
    auto *graph = model.mutable_graph();
    graph->set_name("external");
    auto *weight = graph->add_initializer();
    weight->set_name("w");
    weight->set_data_type(onnx::TensorProto_DataType_FLOAT);
    weight->add_dims(4);
    weight->set_data_location(onnx::TensorProto_DataLocation_EXTERNAL);
    auto *entry = weight->add_external_data();
    entry->set_key("location");
    entry->set_value(location);
    auto *lengthEntry = weight->add_external_data();
    lengthEntry->set_key("length");
    lengthEntry->set_value(std::to_string(length));
    auto addValue = [](onnx::ValueInfoProto *value, const char *name) {
      value->set_name(name);
      auto *tensor = value->mutable_type()->mutable_tensor_type();
      tensor->set_elem_type(onnx::TensorProto_DataType_FLOAT);
      tensor->mutable_shape()->add_dim()->set_dim_value(4);
    };
    addValue(graph->add_input(), "x");
    addValue(graph->add_output(), "y");
    auto *node = graph->add_node();
    node->set_op_type("Mul");
    node->set_name("scale");
    node->add_input("x");
    node->add_input("w");
    node->add_output("y");
    std::string path = (directory / "model" / "model.onnx").string();
    std::ofstream(path, std::ios::binary) << model.SerializeAsString();
    return path;
  }

  void writeWeights(const fs::path &path) {
    float values[4] = {1, 2, 3, 4};
    std::ofstream(path, std::ios::binary).write(reinterpret_cast<char *>(values), sizeof values);
  }

  std::vector<std::string> import(const std::string &path, bool &imported) {
    mlir::MLIRContext context;
    std::vector<std::string> errors;
    auto module = pipec::import::importOnnxModel(context, path, ImportOptions(), errors);
    imported = static_cast<bool>(module);
    return errors;
  }

  fs::path directory;
};

TEST_F(ImporterTest, ReadsExternalDataBesideTheModel) {
  writeWeights(directory / "model" / "weights.bin");
  bool imported = false;
  auto errors = import(writeModel("weights.bin"), imported);
  EXPECT_TRUE(imported);
  EXPECT_TRUE(errors.empty()) << errors.front();
}

TEST_F(ImporterTest, RefusesAbsoluteExternalLocations) {
  writeWeights(directory / "secret.bin");
  bool imported = true;
  auto errors = import(writeModel((directory / "secret.bin").string()), imported);
  EXPECT_FALSE(imported);
  ASSERT_EQ(errors.size(), 1u);
  EXPECT_NE(errors[0].find("outside the model's folder"), std::string::npos) << errors[0];
}

TEST_F(ImporterTest, RefusesParentDirectoryLocations) {
  writeWeights(directory / "secret.bin");
  bool imported = true;
  auto errors = import(writeModel("../secret.bin"), imported);
  EXPECT_FALSE(imported);
  ASSERT_EQ(errors.size(), 1u);
  EXPECT_NE(errors[0].find("initializer 'w' refers to external data '../secret.bin' outside"),
            std::string::npos)
      << errors[0];
}

TEST_F(ImporterTest, RefusesLinksThatLeaveTheModelFolder) {
  writeWeights(directory / "secret.bin");
  fs::create_symlink(directory / "secret.bin", directory / "model" / "link.bin");
  bool imported = true;
  auto errors = import(writeModel("link.bin"), imported);
  EXPECT_FALSE(imported);
  ASSERT_EQ(errors.size(), 1u);
  EXPECT_NE(errors[0].find("outside the model's folder"), std::string::npos) << errors[0];
}

TEST_F(ImporterTest, ReportsMissingAndShortExternalData) {
  bool imported = true;
  auto errors = import(writeModel("absent.bin"), imported);
  EXPECT_FALSE(imported);
  ASSERT_EQ(errors.size(), 1u);
  EXPECT_NE(errors[0].find("'absent.bin', which is missing"), std::string::npos) << errors[0];

  writeWeights(directory / "model" / "weights.bin");
  errors = import(writeModel("weights.bin", 8), imported);
  EXPECT_FALSE(imported);
  ASSERT_EQ(errors.size(), 1u);
  EXPECT_NE(errors[0].find("expects 16 bytes"), std::string::npos) << errors[0];
}

TEST(InputShape, ParsesAndRejects) {
  ImportOptions options;
  std::string error;
  ASSERT_TRUE(pipec::import::parseInputShape("tokens=2,16", options, error));
  EXPECT_EQ(options.inputShapes["tokens"], (std::vector<int64_t>{2, 16}));
  EXPECT_FALSE(pipec::import::parseInputShape("tokens", options, error));
  EXPECT_FALSE(pipec::import::parseInputShape("x=2,-1", options, error));
  EXPECT_NE(error.find("'-1' is not a positive dimension"), std::string::npos) << error;
  EXPECT_FALSE(pipec::import::parseInputShape("x=2,,3", options, error));
}

TEST(SupportedOps, CoverTierOne) {
  auto ops = pipec::import::supportedOnnxOps();
  for (const char *op : {"Gemm", "MatMul", "Add", "Relu", "Flatten", "Conv", "BatchNormalization",
                         "MaxPool", "AveragePool", "GlobalAveragePool", "Dropout", "Gather",
                         "LayerNormalization", "ReduceMean", "Sub", "Pow", "Sqrt", "Div", "Mul",
                         "Reshape", "Transpose", "Split", "Slice", "Softmax", "Where", "Erf",
                         "Gelu", "Tanh", "Sigmoid", "Concat", "Unsqueeze", "Squeeze", "Expand",
                         "Cast", "Equal", "SoftmaxCrossEntropyLoss"})
    EXPECT_NE(std::find(ops.begin(), ops.end(), op), ops.end()) << op;
}

} // namespace
