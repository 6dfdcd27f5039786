// ONNX's node conformance tests (Debian's libonnx-testdata) through the
// importer and the reference evaluator: every test whose operators are all
// tier 1 is imported, evaluated on each of its data sets and compared with
// the expected outputs. Prints "evaluator conformance: passed X of Y" and
// fails when a test listed in expected_passing.txt no longer passes, so the
// count can only go up. PIPEC_UPDATE_EXPECTED=1 rewrites that list.
//
// As test/conformance/import_node_tests.py does, operands that pipec needs
// at import time (Reshape's shape, Slice's bounds, ...) are bound to the data
// set's values as initializers before importing.
#include "compiler/Evaluator/Evaluator.h"
#include "compiler/Import/OnnxImporter.h"
#include "dialects/nn/NNDialect.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/IR/Diagnostics.h"
#include "mlir/IR/MLIRContext.h"
#include "llvm/ADT/APFloat.h"

#include <gtest/gtest.h>
#include <onnx/onnx_pb.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <set>
#include <sstream>

namespace fs = std::filesystem;
using pipec::eval::ElementKind;
using pipec::eval::Tensor;

namespace {

/// The tier-1 operators and the (op type, input position) pairs needed at
/// import time: test/conformance/tier1_operators.txt, which the import
/// conformance test (import_node_tests.py) reads too.
struct Tier1 {
  std::set<std::string> operators;
  std::set<std::pair<std::string, int>> importTimeOperands;
};

const Tier1 &tier1() {
  static const Tier1 list = [] {
    Tier1 read;
    std::ifstream file(PIPEC_TIER1_OPERATORS);
    if (!file)
      throw std::runtime_error("cannot read " PIPEC_TIER1_OPERATORS);
    std::string line;
    while (std::getline(file, line)) {
      std::istringstream fields(line.substr(0, line.find('#')));
      std::string op;
      if (!(fields >> op))
        continue;
      read.operators.insert(op);
      for (int position; fields >> position;)
        read.importTimeOperands.insert({op, position});
    }
    return read;
  }();
  return list;
}

struct Failure : std::runtime_error {
  using std::runtime_error::runtime_error;
};

onnx::TensorProto readTensorProto(const fs::path &path) {
  std::ifstream stream(path, std::ios::binary);
  onnx::TensorProto tensor;
  if (!stream || !tensor.ParseFromIstream(&stream))
    throw Failure("cannot read " + path.string());
  return tensor;
}

double halfBitsToDouble(uint16_t bits, bool brain) {
  llvm::APFloat value(brain ? llvm::APFloat::BFloat() : llvm::APFloat::IEEEhalf(),
                      llvm::APInt(16, bits));
  bool losesInfo = false;
  value.convert(llvm::APFloat::IEEEdouble(), llvm::APFloat::rmNearestTiesToEven, &losesInfo);
  return value.convertToDouble();
}

/// The element kinds the evaluator has, from ONNX's data types. `declared`
/// is the graph's type for the value: older test data stores bfloat16
/// tensors as their uint16 bits.
Tensor tensorFromProto(const onnx::TensorProto &proto, int32_t declared) {
  using T = onnx::TensorProto;
  if (proto.data_type() == T::UINT16 && declared == T::BFLOAT16) {
    onnx::TensorProto bits = proto;
    bits.set_data_type(T::BFLOAT16);
    return tensorFromProto(bits, declared);
  }
  Tensor tensor;
  tensor.shape.assign(proto.dims().begin(), proto.dims().end());
  int64_t count = tensor.numElements();
  const std::string &raw = proto.raw_data();
  bool hasRaw = proto.has_raw_data();
  auto rawAt = [&](int64_t index, auto zero) {
    decltype(zero) value;
    std::memcpy(&value, raw.data() + index * sizeof(value), sizeof(value));
    return value;
  };
  auto checkRaw = [&](size_t width) {
    if (raw.size() != static_cast<size_t>(count) * width)
      throw Failure("raw data size does not match the shape");
  };
  switch (proto.data_type()) {
  case T::FLOAT:
    tensor.kind = ElementKind::Float32;
    if (hasRaw) checkRaw(4);
    for (int64_t i = 0; i < count; ++i)
      tensor.floats.push_back(hasRaw ? rawAt(i, float()) : proto.float_data(i));
    break;
  case T::DOUBLE:
    tensor.kind = ElementKind::Float64;
    if (hasRaw) checkRaw(8);
    for (int64_t i = 0; i < count; ++i)
      tensor.floats.push_back(hasRaw ? rawAt(i, double()) : proto.double_data(i));
    break;
  case T::FLOAT16:
  case T::BFLOAT16: {
    bool brain = proto.data_type() == T::BFLOAT16;
    tensor.kind = brain ? ElementKind::BFloat16 : ElementKind::Float16;
    if (hasRaw) checkRaw(2);
    for (int64_t i = 0; i < count; ++i) {
      auto bits = hasRaw ? rawAt(i, uint16_t()) : static_cast<uint16_t>(proto.int32_data(i));
      tensor.floats.push_back(halfBitsToDouble(bits, brain));
    }
    break;
  }
  case T::INT64:
    tensor.kind = ElementKind::Int64;
    if (hasRaw) checkRaw(8);
    for (int64_t i = 0; i < count; ++i)
      tensor.ints.push_back(hasRaw ? rawAt(i, int64_t()) : proto.int64_data(i));
    break;
  case T::INT32:
    tensor.kind = ElementKind::Int32;
    if (hasRaw) checkRaw(4);
    for (int64_t i = 0; i < count; ++i)
      tensor.ints.push_back(hasRaw ? rawAt(i, int32_t()) : proto.int32_data(i));
    break;
  case T::INT8:
    tensor.kind = ElementKind::Int8;
    if (hasRaw) checkRaw(1);
    for (int64_t i = 0; i < count; ++i)
      tensor.ints.push_back(hasRaw ? rawAt(i, int8_t()) : static_cast<int8_t>(proto.int32_data(i)));
    break;
  case T::UINT8:
  case T::BOOL:
    tensor.kind = proto.data_type() == T::BOOL ? ElementKind::Bool : ElementKind::UInt8;
    if (hasRaw) checkRaw(1);
    for (int64_t i = 0; i < count; ++i)
      tensor.ints.push_back(hasRaw ? rawAt(i, uint8_t()) : proto.int32_data(i));
    break;
  default:
    throw Failure("data type " + std::to_string(proto.data_type()) +
                  " has no evaluator element kind");
  }
  return tensor;
}

/// Why `actual` differs from `expected`, or "" when it matches: same kind and
/// shape; integers exactly; floating point within tolerances of the kind
/// (NaN matches NaN, infinities match exactly).
std::string compareKindAndShape(const Tensor &actual, const Tensor &expected) {
  // pipec computes every floating type in float32 (trainingKind, docs/importer.md).
  if (actual.kind != pipec::import::trainingKind(expected.kind) || actual.shape != expected.shape)
    return std::string("got ") + pipec::import::elementKindName(actual.kind) +
           pipec::eval::shapeToString(actual.shape) + ", expected " +
           pipec::import::elementKindName(expected.kind) +
           pipec::eval::shapeToString(expected.shape);
  return "";
}

std::string compare(const Tensor &actual, const Tensor &expected) {
  if (std::string problem = compareKindAndShape(actual, expected); !problem.empty())
    return problem;
  // Float64 references are met in float32, float16 and bfloat16 ones within
  // their own rounding (pipec does not round to them).
  double rtol = 1e-4, atol = 1e-5;
  if (expected.kind == ElementKind::Float16)
    rtol = 1e-3, atol = 1e-4;
  else if (expected.kind == ElementKind::BFloat16)
    rtol = 1e-2, atol = 1e-3;
  for (int64_t i = 0; i < expected.numElements(); ++i) {
    if (!pipec::import::isFloating(expected.kind)) {
      if (actual.ints[i] != expected.ints[i])
        return "element " + std::to_string(i) + ": got " + std::to_string(actual.ints[i]) +
               ", expected " + std::to_string(expected.ints[i]);
      continue;
    }
    double a = actual.floats[i], e = expected.floats[i];
    bool same = (std::isnan(a) && std::isnan(e)) || a == e ||
                (std::isfinite(e) && std::abs(a - e) <= atol + rtol * std::abs(e));
    if (!same) {
      std::ostringstream text;
      text.precision(9);
      text << "element " << i << ": got " << a << ", expected " << e;
      return text.str();
    }
  }
  return "";
}

/// The checks that random dropout outputs still allow: every element is
/// either dropped (0, mask false) or kept and scaled by 1 / (1 - ratio), and
/// the kept fraction is within 5 standard deviations of 1 - ratio.
std::string checkDropoutProperties(const Tensor &input, const Tensor &output,
                                   const Tensor &mask, double ratio) {
  double scale = 1.0 / (1.0 - ratio);
  int64_t kept = 0, count = input.numElements();
  for (int64_t i = 0; i < count; ++i) {
    double expected = mask.ints[i] ? static_cast<float>(input.floats[i] * scale) : 0.0;
    if (std::abs(output.floats[i] - expected) > 1e-6 * (1 + std::abs(expected)))
      return "dropout element " + std::to_string(i) + " is neither dropped nor scaled";
    kept += mask.ints[i];
  }
  double mean = count * (1 - ratio), sigma = std::sqrt(count * ratio * (1 - ratio));
  if (std::abs(kept - mean) > 5 * sigma + 1)
    return "dropout kept " + std::to_string(kept) + " of " + std::to_string(count) +
           " elements at ratio " + std::to_string(ratio);
  return "";
}

class NodeTestRunner {
public:
  NodeTestRunner() {
    context.loadDialect<pipec::nn::NNDialect, mlir::func::FuncDialect>();
  }

  /// Whether the test's operators are all tier 1 (and in the default domain).
  static bool isTier1(const onnx::ModelProto &model) {
    if (model.graph().node_size() == 0)
      return false;
    for (const auto &node : model.graph().node())
      if ((!node.domain().empty() && node.domain() != "ai.onnx") || !tier1().operators.count(node.op_type()))
        return false;
    return true;
  }

  /// Runs every data set of one test; throws Failure with the first reason.
  void run(const fs::path &directory, const onnx::ModelProto &model, const fs::path &workdir) {
    std::vector<fs::path> dataSets;
    for (const auto &entry : fs::directory_iterator(directory))
      if (entry.is_directory() && entry.path().filename().string().rfind("test_data_set_", 0) == 0)
        dataSets.push_back(entry.path());
    std::sort(dataSets.begin(), dataSets.end());
    if (dataSets.empty())
      throw Failure("no test_data_set_*");
    for (const fs::path &dataSet : dataSets)
      runDataSet(model, dataSet, workdir / (directory.filename().string() + ".onnx"));
  }

private:
  void runDataSet(onnx::ModelProto model, const fs::path &dataSet, const fs::path &boundPath) {
    const auto &graph = model.graph();
    std::set<std::string> initialized;
    for (const auto &initializer : graph.initializer())
      initialized.insert(initializer.name());
    // Graph inputs, in the order of input_<i>.pb, and their values.
    std::map<std::string, onnx::TensorProto> inputs;
    std::map<std::string, int32_t> declared;
    int position = 0;
    for (const auto &input : graph.input())
      if (!initialized.count(input.name())) {
        inputs[input.name()] =
            readTensorProto(dataSet / ("input_" + std::to_string(position++) + ".pb"));
        declared[input.name()] = input.type().tensor_type().elem_type();
      }

    std::set<std::string> bound;
    for (const auto &node : graph.node())
      for (int i = 0; i < node.input_size(); ++i)
        if (tier1().importTimeOperands.count({node.op_type(), i}) && inputs.count(node.input(i)))
          bound.insert(node.input(i));
    for (const std::string &name : bound) {
      onnx::TensorProto *initializer = model.mutable_graph()->add_initializer();
      *initializer = inputs[name];
      initializer->set_name(name);
    }
    auto *graphInputs = model.mutable_graph()->mutable_input();
    for (int i = graphInputs->size() - 1; i >= 0; --i)
      if (bound.count(graphInputs->Get(i).name()))
        graphInputs->DeleteSubrange(i, 1);
    {
      std::ofstream stream(boundPath, std::ios::binary);
      if (!model.SerializeToOstream(&stream))
        throw Failure("cannot write " + boundPath.string());
    }

    std::vector<std::string> errors;
    // ONNX's own semantics: BatchNormalization as the file's form says.
    pipec::import::ImportOptions options;
    options.batchNorm = pipec::import::BatchNormStatistics::AsExported;
    auto module = pipec::import::importOnnxModel(context, boundPath.string(), options, errors);
    if (!module)
      throw Failure("import: " + (errors.empty() ? std::string("failed") : firstLine(errors[0])));
    auto forward = module->lookupSymbol<mlir::func::FuncOp>("forward");
    if (!forward)
      throw Failure("import: no @forward");

    std::vector<Tensor> arguments;
    for (unsigned i = 0; i < forward.getNumArguments(); ++i) {
      auto name = forward.getArgAttrOfType<mlir::StringAttr>(i, "nn.name");
      if (!name)
        throw Failure("argument " + std::to_string(i) + " has no nn.name");
      std::string key = name.getValue().str();
      const onnx::TensorProto *proto = nullptr;
      if (inputs.count(key))
        proto = &inputs[key];
      for (const auto &initializer : model.graph().initializer())
        if (initializer.name() == key)
          proto = &initializer;
      if (!proto)
        throw Failure("no data for argument " + key);
      Tensor argument = tensorFromProto(*proto, declared.count(key) ? declared[key] : 0);
      if (argument.kind != pipec::import::trainingKind(argument.kind)) { // float32, as pipec computes
        argument.kind = pipec::import::trainingKind(argument.kind);
        for (double &value : argument.floats)
          value = static_cast<float>(value);
      }
      arguments.push_back(std::move(argument));
    }

    std::string diagnostics;
    mlir::ScopedDiagnosticHandler handler(&context, [&](mlir::Diagnostic &diagnostic) {
      diagnostics += diagnostic.str();
      return mlir::success();
    });
    auto results = pipec::eval::evaluateFunction(forward, arguments);
    if (mlir::failed(results))
      throw Failure("evaluate: " + diagnostics);

    auto randomDropouts = checkRandomDropouts(forward, arguments);
    for (int j = 0; j < graph.output_size(); ++j) {
      std::string name = graph.output(j).name();
      int found = -1;
      for (unsigned r = 0; r < forward.getNumResults(); ++r)
        if (auto attr = forward.getResultAttrOfType<mlir::StringAttr>(r, "nn.name"))
          if (attr.getValue() == name)
            found = static_cast<int>(r);
      if (found < 0)
        throw Failure("output " + name + " is not a result of @forward");
      Tensor expected =
          tensorFromProto(readTensorProto(dataSet / ("output_" + std::to_string(j) + ".pb")),
                          graph.output(j).type().tensor_type().elem_type());
      const Tensor &actual = (*results)[found];
      // Random dropout values depend on the generator: only kind and shape.
      std::string problem = randomDropouts.count(static_cast<unsigned>(found))
                                ? compareKindAndShape(actual, expected)
                                : compare(actual, expected);
      if (!problem.empty())
        throw Failure("output " + name + ": " + problem);
      ++comparedOutputs;
    }
    ++evaluatedDataSets;
  }

  /// Results of @forward produced by training-mode dropouts with ratio > 0,
  /// after checking those dropouts' properties on their (argument) inputs.
  std::set<unsigned> checkRandomDropouts(mlir::func::FuncOp forward,
                                         const std::vector<Tensor> &arguments) {
    std::set<unsigned> random;
    auto returnOp = llvm::cast<mlir::func::ReturnOp>(forward.getBody().front().getTerminator());
    std::vector<pipec::nn::DropoutOp> dropouts;
    forward.walk([&](pipec::nn::DropoutOp dropout) { dropouts.push_back(dropout); });
    for (pipec::nn::DropoutOp dropout : dropouts) {
      double ratio = dropout.getRatio().convertToFloat();
      if (!dropout.getTraining() || ratio == 0)
        continue;
      for (auto [index, value] : llvm::enumerate(returnOp.getOperands()))
        if (value.getDefiningOp() == dropout.getOperation())
          random.insert(static_cast<unsigned>(index));
      auto argument = llvm::dyn_cast<mlir::BlockArgument>(dropout.getInput());
      if (!argument)
        throw Failure("a random dropout's input is not an argument: cannot check it");
      const Tensor &input = arguments[argument.getArgNumber()];
      auto values = pipec::eval::evaluateOp(dropout, {input});
      if (mlir::failed(values))
        throw Failure("dropout did not evaluate");
      std::string problem = checkDropoutProperties(input, (*values)[0], (*values)[1], ratio);
      if (!problem.empty())
        throw Failure(problem);
    }
    return random;
  }

public:
  int evaluatedDataSets = 0, comparedOutputs = 0;

private:
  static std::string firstLine(const std::string &text) { return text.substr(0, text.find('\n')); }

  mlir::MLIRContext context;
};

TEST(EvaluatorConformance, OnnxNodeTests) {
  const char *override = std::getenv("PIPEC_ONNX_NODE_TESTS");
  fs::path root = override ? override : "/usr/share/libonnx-testdata/data/node";
  if (!fs::is_directory(root))
    GTEST_SKIP() << root << " is missing (Debian package libonnx-testdata)";
  fs::path workdir = fs::temp_directory_path() / ("pipec-eval-" + std::to_string(::getpid()));
  fs::create_directories(workdir);

  std::vector<fs::path> tests;
  for (const auto &entry : fs::directory_iterator(root))
    if (fs::exists(entry.path() / "model.onnx"))
      tests.push_back(entry.path());
  std::sort(tests.begin(), tests.end());

  NodeTestRunner runner;
  std::set<std::string> passed;
  std::map<std::string, std::string> failed;
  int attempted = 0;
  for (const fs::path &test : tests) {
    onnx::ModelProto model;
    std::ifstream stream(test / "model.onnx", std::ios::binary);
    if (!model.ParseFromIstream(&stream) || !NodeTestRunner::isTier1(model))
      continue;
    ++attempted;
    std::string name = test.filename().string();
    try {
      runner.run(test, model, workdir);
      passed.insert(name);
    } catch (const std::exception &error) {
      failed[name] = error.what();
    }
  }
  fs::remove_all(workdir);

  std::cout << "evaluator conformance: passed " << passed.size() << " of " << attempted
            << " tier-1 ONNX node tests (" << runner.evaluatedDataSets << " data sets, "
            << runner.comparedOutputs << " outputs compared)\n";
  for (const auto &[name, why] : failed)
    std::cout << "  not passed: " << name << ": " << why.substr(0, why.find('\n')) << "\n";

  if (std::getenv("PIPEC_UPDATE_EXPECTED")) {
    std::ofstream out(PIPEC_EVALUATOR_EXPECTED);
    for (const std::string &name : passed)
      out << name << "\n";
    std::cout << "wrote " << PIPEC_EVALUATOR_EXPECTED << "\n";
    return;
  }
  std::ifstream expectedFile(PIPEC_EVALUATOR_EXPECTED);
  ASSERT_TRUE(expectedFile) << "cannot read " << PIPEC_EVALUATOR_EXPECTED;
  std::string name;
  int expectedCount = 0;
  while (expectedFile >> name) {
    ++expectedCount;
    EXPECT_TRUE(passed.count(name))
        << name << " passed before and does not now: "
        << (failed.count(name) ? failed[name] : "not found in the test data");
  }
  EXPECT_GT(expectedCount, 0) << "the expected list is empty";
}

} // namespace
