// The operator table's contract (compiler/Import/OnnxOps.h,
// docs/adding-an-op.md): a throw-away ONNX operator added through one row —
// versions, converter, fold, shape rule, differentiable inputs — imports,
// folds, re-specializes and differentiates with nothing else edited; a row
// that lacks a part is refused; and every built-in row's versions agree with
// ONNX's own operator registry.
#include "compiler/Evaluator/Evaluator.h"
#include "compiler/Import/ImporterImpl.h"
#include "compiler/Import/OnnxImporter.h"
#include "passes/Passes.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/IR/MLIRContext.h"
#include "mlir/Pass/PassManager.h"

#include <gtest/gtest.h>
#include <onnx/defs/schema.h>
#include <onnx/onnx_pb.h>

#include <cctype>
#include <cmath>
#include <filesystem>
#include <fstream>

namespace fs = std::filesystem;
using namespace pipec::import::detail;
using pipec::import::ImportOptions;

namespace {

constexpr const char *kCube = "PipecTestCube";
/// The same operator with the opposite choices: not followed by
/// re-specialization, no gradient through its input.
constexpr const char *kOpaqueCube = "PipecTestOpaqueCube";

/// y = x * x * x, converted to two nn.mul and folded with the host's Mul.
OnnxOp cubeRow(const char *type, ShapeRule shape, DifferentiableInputs differentiable) {
  return OnnxOp(
      type, {{1}, 1},
      [](OnnxImporter &importer, const onnx::NodeProto &node) {
        mlir::Value x = importer.operand(node, 0);
        mlir::Value square = importer.build<pipec::nn::MulOp>(node, {x, x});
        importer.define(node, 0, importer.build<pipec::nn::MulOp>(node, {square, x}));
      },
      [](OnnxImporter &importer, const onnx::NodeProto &node) -> std::vector<pipec::import::HostTensor> {
        const pipec::import::HostTensor &x = importer.constantInput(node, 0, "first");
        return {pipec::import::fold::binary("Mul", pipec::import::fold::binary("Mul", x, x), x)};
      },
      shape, differentiable);
}

void registerCubes() {
  static bool registered = [] {
    std::string error;
    EXPECT_TRUE(registerOnnxOp(cubeRow(kCube, ShapeRule::SameShape, {0}), error)) << error;
    EXPECT_TRUE(registerOnnxOp(cubeRow(kOpaqueCube, ShapeRule::Unfollowed,
                                       DifferentiableInputs::none()),
                               error))
        << error;
    return true;
  }();
  (void)registered;
}

class OnnxOpRowTest : public ::testing::Test {
protected:
  void SetUp() override {
    registerCubes();
    directory = fs::temp_directory_path() /
                ("pipec-op-row-" + std::to_string(::getpid()) + "-" +
                 ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(directory);
    fs::create_directories(directory);
    context.loadDialect<pipec::nn::NNDialect, mlir::func::FuncDialect>();
  }
  void TearDown() override { fs::remove_all(directory); }

  /// x [2, 4] (the batch traced at 2), w [4] trained, c = 2 a constant:
  /// y = reshape(op(x * w) * op(c), [2, 2, 2]). op(c) is folded; the
  /// reshape's target holds the traced batch, which re-specialization must
  /// follow through op to rewrite.
  std::string writeModel(const char *op) {
    onnx::ModelProto model;
    model.set_ir_version(8);
    model.add_opset_import()->set_version(13);
    auto *graph = model.mutable_graph();
    graph->set_name("cube");
    auto floats = [&](const char *name, std::vector<int64_t> dims, std::vector<float> values) {
      auto *tensor = graph->add_initializer();
      tensor->set_name(name);
      tensor->set_data_type(onnx::TensorProto_DataType_FLOAT);
      for (int64_t d : dims)
        tensor->add_dims(d);
      for (float v : values)
        tensor->add_float_data(v);
    };
    floats("w", {4}, {0.5f, -1.0f, 1.5f, 2.0f});
    floats("c", {}, {2.0f});
    auto *shape = graph->add_initializer();
    shape->set_name("shape");
    shape->set_data_type(onnx::TensorProto_DataType_INT64);
    shape->add_dims(3);
    for (int64_t d : {2, 2, 2})
      shape->add_int64_data(d);
    auto value = [](onnx::ValueInfoProto *info, const char *name, std::vector<int64_t> dims) {
      info->set_name(name);
      auto *tensor = info->mutable_type()->mutable_tensor_type();
      tensor->set_elem_type(onnx::TensorProto_DataType_FLOAT);
      for (int64_t d : dims)
        tensor->mutable_shape()->add_dim()->set_dim_value(d);
    };
    value(graph->add_input(), "x", {2, 4});
    value(graph->add_output(), "y", {2, 2, 2});
    auto node = [&](const char *type, const char *name, std::vector<const char *> inputs,
                    const char *output) {
      auto *n = graph->add_node();
      n->set_op_type(type);
      n->set_name(name);
      for (const char *input : inputs)
        n->add_input(input);
      n->add_output(output);
    };
    node("Mul", "scale", {"x", "w"}, "xw");
    node(op, "cube", {"xw"}, "cubed");
    node(op, "cube_constant", {"c"}, "c3");
    node("Mul", "times", {"cubed", "c3"}, "scaled");
    node("Reshape", "reshape", {"scaled", "shape"}, "y");
    std::string path = (directory / (std::string(op) + ".onnx")).string();
    std::ofstream(path, std::ios::binary) << model.SerializeAsString();
    return path;
  }

  mlir::OwningOpRef<mlir::ModuleOp> import(const std::string &path, const ImportOptions &options,
                                           std::vector<std::string> &errors) {
    return pipec::import::importOnnxModel(context, path, options, errors);
  }

  static std::string frozenReason(mlir::ModuleOp module, llvm::StringRef name) {
    auto frozen = module->getAttrOfType<mlir::DictionaryAttr>(pipec::nn::kFrozenAttrName);
    auto reason = frozen ? frozen.getAs<mlir::StringAttr>(name) : nullptr;
    return reason ? reason.str() : "";
  }

  fs::path directory;
  mlir::MLIRContext context;
};

std::string joined(const std::vector<std::string> &lines) {
  std::string text;
  for (const auto &line : lines)
    text += line + "\n";
  return text;
}

TEST_F(OnnxOpRowTest, AThrowAwayOperatorImportsFoldsAndDifferentiatesFromItsRow) {
  std::vector<std::string> errors;
  auto module = import(writeModel(kCube), ImportOptions(), errors);
  ASSERT_TRUE(module) << joined(errors);
  EXPECT_EQ(frozenReason(*module, "w"), "") << "w reaches the loss through the row's input 0";

  // Converted: one nn.mul for x * w, two per cube, one for the product;
  // folded: op(2) = 8 is a constant, not computed.
  int multiplies = 0;
  bool foldedEight = false;
  module->walk([&](mlir::Operation *op) {
    multiplies += llvm::isa<pipec::nn::MulOp>(op);
    if (auto constant = llvm::dyn_cast<pipec::nn::ConstantOp>(op))
      if (auto dense = llvm::dyn_cast<mlir::DenseElementsAttr>(constant.getValue()))
        foldedEight = foldedEight || (dense.getNumElements() == 1 &&
                                      dense.getSplatValue<mlir::APFloat>().convertToFloat() == 8.0f);
  });
  EXPECT_EQ(multiplies, 4);
  EXPECT_TRUE(foldedEight) << "op(c) was not folded to 8";

  // Differentiated: the loss mean((y - labels)^2), and the gradient autodiff
  // derives for w against the formula dL/dw_j = sum_i dL/dy_ij * 24 (x_ij w_j)^2 x_ij.
  mlir::PassManager passes(&context);
  pipec::passes::AppendLossOptions loss;
  loss.loss = pipec::Loss::Mse;
  passes.addPass(pipec::passes::createAppendLoss(loss));
  passes.addPass(pipec::passes::createAutodiff());
  ASSERT_TRUE(mlir::succeeded(passes.run(*module)));
  auto trainStep = module->lookupSymbol<mlir::func::FuncOp>("train_step");
  ASSERT_TRUE(trainStep);
  const std::vector<double> x = {0.1, -0.2, 0.3, 0.4, -0.5, 0.6, 0.7, -0.8};
  const std::vector<double> w = {0.5, -1.0, 1.5, 2.0};
  const std::vector<double> labels = {0.1, 0.2, -0.3, 0.4, 0.0, -0.1, 0.2, 0.3};
  std::vector<pipec::eval::Tensor> arguments;
  for (unsigned a = 0; a < trainStep.getNumArguments(); ++a) {
    auto name = trainStep.getArgAttrOfType<mlir::StringAttr>(a, pipec::nn::kNameAttrName);
    ASSERT_TRUE(name);
    if (name == "x")
      arguments.push_back(pipec::eval::Tensor::ofFloats(pipec::eval::ElementKind::Float32, {2, 4}, x));
    else if (name == "w")
      arguments.push_back(pipec::eval::Tensor::ofFloats(pipec::eval::ElementKind::Float32, {4}, w));
    else
      arguments.push_back(pipec::eval::Tensor::ofFloats(pipec::eval::ElementKind::Float32, {2, 2, 2}, labels));
  }
  auto results = pipec::eval::evaluateFunction(trainStep, arguments);
  ASSERT_TRUE(mlir::succeeded(results));
  ASSERT_GE(results->size(), 2u);
  const pipec::eval::Tensor &gradient = (*results)[1];
  ASSERT_EQ(gradient.shape, std::vector<int64_t>{4});
  for (int j = 0; j < 4; ++j) {
    double expected = 0;
    for (int i = 0; i < 2; ++i) {
      double xw = x[i * 4 + j] * w[j], y = 8 * xw * xw * xw;
      expected += 2 * (y - labels[i * 4 + j]) / 8 * 24 * xw * xw * x[i * 4 + j];
    }
    EXPECT_NEAR(gradient.floats[j], expected, 1e-5 * (1 + std::fabs(expected))) << "w[" << j << "]";
  }
}

TEST_F(OnnxOpRowTest, AThrowAwayOperatorReSpecializesByItsShapeRule) {
  ImportOptions options;
  options.inputShapes["x"] = {3, 4};
  std::vector<std::string> errors;
  auto module = import(writeModel(kCube), options, errors);
  ASSERT_TRUE(module) << joined(errors);
  auto forward = module->lookupSymbol<mlir::func::FuncOp>("forward");
  auto result = llvm::cast<mlir::RankedTensorType>(forward.getResultTypes()[0]);
  EXPECT_EQ(result.getShape(), llvm::ArrayRef<int64_t>({3, 2, 2}))
      << "the reshape's traced batch was not followed through the operator";
}

TEST_F(OnnxOpRowTest, TheRowDecidesWhatIsFollowedAndTrained) {
  std::vector<std::string> errors;
  auto module = import(writeModel(kOpaqueCube), ImportOptions(), errors);
  ASSERT_TRUE(module) << joined(errors);
  EXPECT_NE(frozenReason(*module, "w").find("no gradient reaches it"), std::string::npos)
      << "w is behind the row's only input, which is not differentiable: frozen, with a message";

  ImportOptions options;
  options.inputShapes["x"] = {3, 4};
  errors.clear();
  EXPECT_FALSE(import(writeModel(kOpaqueCube), options, errors));
  EXPECT_NE(joined(errors).find("pipec does not know how PipecTestOpaqueCube carries a dimension "
                                "that changes"),
            std::string::npos)
      << joined(errors);
}

TEST(OnnxOpRows, ARowWithoutARequiredPartIsRefused) {
  registerCubes();
  auto converter = [](OnnxImporter &, const onnx::NodeProto &) {};
  EXPECT_NE(checkOnnxOp(OnnxOp("PipecTestNothing", {{1}, 1}, nullptr, nullptr, ShapeRule::SameShape,
                               {0})),
            "");
  EXPECT_NE(checkOnnxOp(OnnxOp("PipecTestUnordered", {{13, 7}, 7}, converter, nullptr,
                               ShapeRule::SameShape, {0})),
            "");
  EXPECT_NE(checkOnnxOp(OnnxOp("PipecTestNoVersions", {{}, 1}, converter, nullptr,
                               ShapeRule::SameShape, {0})),
            "");
  EXPECT_NE(checkOnnxOp(OnnxOp("PipecTestOldest", {{1, 13}, 7}, converter, nullptr,
                               ShapeRule::SameShape, {0})),
            "");
  EXPECT_EQ(checkOnnxOp(OnnxOp("PipecTestComplete", {{1, 13}, 13}, converter, nullptr,
                               ShapeRule::SameShape, {0})),
            "");
  std::string error;
  EXPECT_FALSE(registerOnnxOp(OnnxOp("Add", {{1}, 1}, converter, nullptr, ShapeRule::Broadcast,
                                     DifferentiableInputs::all()),
                              error));
  EXPECT_NE(error.find("two rows"), std::string::npos) << error;
  EXPECT_FALSE(registerOnnxOp(OnnxOp(kCube, {{1}, 1}, converter, nullptr, ShapeRule::SameShape, {0}),
                              error));
}

/// Every built-in row's versions against ONNX's registry (the library pipec
/// links): at each opset it knows, the version a node follows is the
/// schema's since_version.
TEST(OnnxOpRows, VersionsAgreeWithOnnxsRegistry) {
  const int newest = onnx::OpSchemaRegistry::DomainToVersionRange::Instance().Map().at("").second;
  for (const OnnxOp &row : onnxOps()) {
    if (row.type.rfind("PipecTest", 0) == 0)
      continue;
    for (int opset = 1; opset <= newest; ++opset) {
      const onnx::OpSchema *schema = onnx::OpSchemaRegistry::Schema(row.type, opset, "");
      int64_t expected = schema ? schema->SinceVersion() : 0;
      EXPECT_EQ(resolvedVersion(row.type, opset), expected) << row.type << " at opset " << opset;
    }
  }
}

/// docs/adding-an-op.md quotes rows of the table: each must be a row of
/// compiler/Import/OnnxOps.cpp as it is (white space aside), so the document
/// cannot drift from the code it teaches.
TEST(OnnxOpRows, TheRowsTheDocumentQuotesAreTheTables) {
  auto read = [](const std::string &path) {
    std::ifstream file(path);
    EXPECT_TRUE(file) << path;
    std::string text((std::istreambuf_iterator<char>(file)), std::istreambuf_iterator<char>());
    std::string collapsed;
    for (char c : text)
      if (!std::isspace(static_cast<unsigned char>(c)) || (!collapsed.empty() && collapsed.back() != ' '))
        collapsed += std::isspace(static_cast<unsigned char>(c)) ? ' ' : c;
    return collapsed;
  };
  const std::string document = read(PIPEC_SOURCE_DIR "/docs/adding-an-op.md");
  const std::string table = read(PIPEC_SOURCE_DIR "/compiler/Import/OnnxOps.cpp");
  int quoted = 0;
  for (size_t at = document.find("{\"", 0); at != std::string::npos; at = document.find("{\"", at + 1)) {
    size_t nameEnd = document.find('"', at + 2);
    if (nameEnd == std::string::npos || document.compare(nameEnd, 5, "\", {{") != 0)
      continue; // not a row: a row starts {"Type", {{versions
    int depth = 0;
    size_t end = at;
    for (; end < document.size(); ++end) {
      depth += document[end] == '{' ? 1 : document[end] == '}' ? -1 : 0;
      if (depth == 0)
        break;
    }
    std::string row = document.substr(at, end + 1 - at);
    ++quoted;
    EXPECT_NE(table.find(row), std::string::npos) << "docs/adding-an-op.md quotes a row that is not the table's: " << row;
  }
  EXPECT_GE(quoted, 2) << "the document no longer quotes rows of the table";
}

} // namespace
