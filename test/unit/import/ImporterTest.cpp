// Importer behaviour that is easiest to set up in C++: external data files,
// hostile locations, and the --input-shape parser.
#include "compiler/Import/Npy.h"
#include "compiler/Import/OnnxImporter.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/IR/MLIRContext.h"

#include <gtest/gtest.h>
#include <onnx/onnx_pb.h>

#include <filesystem>
#include <fstream>

#include <sys/stat.h>

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
  std::string writeModel(const std::string &location, int64_t length = 16,
                         const std::string &offset = "") {
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
    if (!offset.empty()) {
      auto *offsetEntry = weight->add_external_data();
      offsetEntry->set_key("offset");
      offsetEntry->set_value(offset);
    }
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

  void writeWeights(const fs::path &path, int padding = 0) {
    float values[4] = {1, 2, 3, 4};
    std::ofstream out(path, std::ios::binary);
    out << std::string(padding, '\x7f');
    out.write(reinterpret_cast<char *>(values), sizeof values);
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
  // A trained parameter's data is not needed to plan: the import succeeds
  // (with a note), and reading the weights for a job says the file is missing.
  bool imported = false;
  auto errors = import(writeModel("absent.bin"), imported);
  EXPECT_TRUE(imported);
  EXPECT_TRUE(errors.empty());
  pipec::import::InitializerReader reader((directory / "model" / "model.onnx").string());
  EXPECT_FALSE(reader.ok());
  ASSERT_EQ(reader.errors().size(), 1u);
  EXPECT_NE(reader.errors()[0].find("'absent.bin', which is missing"), std::string::npos)
      << reader.errors()[0];

  writeWeights(directory / "model" / "weights.bin");
  errors = import(writeModel("weights.bin", 8), imported);
  EXPECT_FALSE(imported);
  ASSERT_EQ(errors.size(), 1u);
  EXPECT_NE(errors[0].find("expects 16 bytes"), std::string::npos) << errors[0];
}

TEST_F(ImporterTest, ReadsExternalDataAtAnOffset) {
  writeWeights(directory / "model" / "weights.bin", 8);
  std::map<std::string, pipec::import::HostTensor> values;
  std::vector<std::string> errors;
  ASSERT_TRUE(pipec::import::readInitializerValues(writeModel("weights.bin", 16, "8"), values,
                                                   errors))
      << errors.front();
  EXPECT_EQ(values.at("w").floats, (std::vector<double>{1, 2, 3, 4}));
}

TEST_F(ImporterTest, RefusesExternalOffsetsThatOverflow) {
  writeWeights(directory / "model" / "weights.bin");
  for (const char *offset : {"9223372036854775807", "9223372036854775800", "17"}) {
    bool imported = true;
    auto errors = import(writeModel("weights.bin", 16, offset), imported);
    EXPECT_FALSE(imported) << offset;
    ASSERT_EQ(errors.size(), 1u) << offset;
    EXPECT_NE(errors[0].find("initializer 'w' expects 16 bytes of external data at offset " +
                             std::string(offset)),
              std::string::npos)
        << errors[0];
    // readInitializerValues (the weights for training) refuses them too.
    std::map<std::string, pipec::import::HostTensor> values;
    std::vector<std::string> readErrors;
    EXPECT_FALSE(pipec::import::readInitializerValues(
        (directory / "model" / "model.onnx").string(), values, readErrors));
  }
  for (const char *offset : {"-16", "1e3", "18446744073709551616", " 8"}) {
    bool imported = true;
    auto errors = import(writeModel("weights.bin", 16, offset), imported);
    EXPECT_FALSE(imported) << offset;
    ASSERT_EQ(errors.size(), 1u) << offset;
    EXPECT_NE(errors[0].find("which is not a non-negative 64-bit integer"), std::string::npos)
        << errors[0];
  }
}

TEST_F(ImporterTest, RefusesNonRegularExternalDataWithoutBlocking) {
  ASSERT_EQ(::mkfifo((directory / "model" / "weights.bin").c_str(), 0600), 0);
  bool imported = true;
  auto errors = import(writeModel("weights.bin"), imported);
  EXPECT_FALSE(imported);
  ASSERT_EQ(errors.size(), 1u);
  EXPECT_NE(errors[0].find("external data file is a FIFO, not a regular file"), std::string::npos)
      << errors[0];
}

TEST_F(ImporterTest, RefusesNonRegularModelsWithoutBlocking) {
  bool imported = true;
  auto errors = import("/dev/zero", imported);
  EXPECT_FALSE(imported);
  ASSERT_EQ(errors.size(), 1u);
  EXPECT_EQ(errors[0], "/dev/zero: ONNX model is a character device, not a regular file");
  std::string fifo = (directory / "model.onnx").string();
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  errors = import(fifo, imported);
  EXPECT_FALSE(imported);
  ASSERT_EQ(errors.size(), 1u);
  EXPECT_NE(errors[0].find("ONNX model is a FIFO, not a regular file"), std::string::npos)
      << errors[0];
}

TEST_F(ImporterTest, NpyHeadersAreCheckedAgainstTheFileSize) {
  using pipec::import::HostTensor;
  using namespace std::string_literals;
  std::string path = (directory / "a.npy").string(), error;
  HostTensor tensor = HostTensor::ofFloats(pipec::import::ElementKind::Float32, {2, 3},
                                           {1, 2, 3, 4, 5, 6});
  ASSERT_TRUE(pipec::import::writeNpy(path, tensor, error)) << error;
  auto back = pipec::import::readNpy(path, error);
  ASSERT_TRUE(back) << error;
  EXPECT_EQ(back->shape, tensor.shape);
  EXPECT_EQ(back->floats, tensor.floats);

  auto writeRaw = [&](const std::string &bytes) {
    std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes;
  };
  auto headerOf = [](const std::string &dict, char version = 1) {
    std::string header = std::string("\x93NUMPY") + version + '\0';
    if (version == 1)
      header += std::string{static_cast<char>(dict.size() & 0xff),
                            static_cast<char>(dict.size() >> 8)};
    else
      header += std::string{static_cast<char>(dict.size() & 0xff),
                            static_cast<char>((dict.size() >> 8) & 0xff), '\0', '\0'};
    return header + dict;
  };
  struct Case {
    std::string bytes, reason;
  };
  const Case cases[] = {
      {"\x93NUMPY\x02\x00\xff\xff\xff\xff"s, "header length 4294967295 runs past the end"},
      {headerOf("{'descr': '<f4', 'fortran_order': False, 'shape': (4294967296, 4294967296), }"),
       "need more than 2^63 bytes"},
      {headerOf("{'descr': '<f4', 'fortran_order': False, 'shape': (1000000, 1000000), }"),
       "need 4000000000000 bytes of data but the file holds 0"},
      {headerOf("{'descr': '<f4', 'fortran_order': False, 'shape': (x2, 3), }"),
       "shape entry 'x2' is not a dimension"},
      {headerOf("{'descr': '<f4', 'fortran_order': False, 'shape': (-2, 3), }"),
       "shape entry '-2' is not a dimension"},
      {headerOf("{'descr': '<f4', 'fortran_order': False, }"), "header has no shape"},
      {headerOf("{'descr': '<f4', 'fortran_order': False, 'shape': (2,), }") + std::string(12, 'x'),
       "need 8 bytes of data but the file holds 12"},
      {"\x93NUMPY\x07\x00\x00\x00"s, "unsupported .npy format version 7"},
      {"\x93NUM", "not a .npy file"},
  };
  for (const Case &c : cases) {
    writeRaw(c.bytes);
    error.clear();
    EXPECT_FALSE(pipec::import::readNpy(path, error)) << c.reason;
    EXPECT_NE(error.find(c.reason), std::string::npos) << error;
  }
  ASSERT_EQ(::mkfifo((directory / "fifo.npy").c_str(), 0600), 0);
  EXPECT_FALSE(pipec::import::readNpy((directory / "fifo.npy").string(), error));
  EXPECT_NE(error.find(".npy file is a FIFO, not a regular file"), std::string::npos) << error;
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
