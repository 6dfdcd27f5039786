// ONNX → `nn` importer. Phases, each reporting every problem it finds before
// stopping: load (file, protobuf, opset), analysis (supported ops, which
// initializers are trained, which values are known at import time, input
// shapes), then translation node by node (shape sub-graphs folded on the
// host, everything else becomes one `nn` op located at its node), then a
// cross-check against ONNX's own shape inference and a final verify. This
// file holds the driver; the operator table is OnnxOps.cpp, and
// ImporterImpl.h lists where each phase lives.
#include "compiler/Import/OnnxImporter.h"
#include "analysis/Settings/Declared.h"
#include "compiler/Import/ImporterImpl.h"
#include "compiler/Import/ModelValidation.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/IR/Verifier.h"

#include <onnx/shape_inference/implementation.h>

#include <cassert>
#include <set>
#include <sstream>

using namespace mlir;

namespace pipec::import {

std::optional<ElementKind> elementKindOf(Type type) {
  if (type.isF32()) return ElementKind::Float32;
  if (type.isF64()) return ElementKind::Float64;
  if (type.isF16()) return ElementKind::Float16;
  if (type.isBF16()) return ElementKind::BFloat16;
  if (type.isInteger(64)) return ElementKind::Int64;
  if (type.isInteger(32)) return ElementKind::Int32;
  if (type.isInteger(1)) return ElementKind::Bool;
  if (type.isUnsignedInteger(8)) return ElementKind::UInt8;
  if (type.isInteger(8)) return ElementKind::Int8;
  return std::nullopt;
}

namespace detail {

//===----------------------------------------------------------------------===//
// Driver
//===----------------------------------------------------------------------===//

/// Compares our static types with those ONNX's shape inference found; a
/// disagreement means a translation bug or an inconsistent model.
void OnnxImporter::crossCheckShapeInference() {
  // A copy for ONNX to annotate, without the data of trained parameters and
  // buffers (only their types matter to shape inference): the weights are
  // not duplicated in memory.
  onnx::ModelProto inferred;
  {
    google::protobuf::RepeatedPtrField<onnx::TensorProto> initializerList;
    initializerList.Swap(model.mutable_graph()->mutable_initializer());
    inferred = model;
    initializerList.Swap(model.mutable_graph()->mutable_initializer());
  }
  for (const auto &tensor : model.graph().initializer()) {
    onnx::TensorProto *copy = inferred.mutable_graph()->add_initializer();
    if (knownAtImport.count(tensor.name())) {
      *copy = tensor;
    } else {
      copy->set_name(tensor.name());
      copy->set_data_type(tensor.data_type());
      *copy->mutable_dims() = tensor.dims();
    }
  }
  try {
    onnx::ShapeInferenceOptions inferenceOptions{/*check_type=*/false, /*error_mode=*/0,
                                                 /*enable_data_propagation=*/false};
    onnx::shape_inference::InferShapes(inferred, onnx::OpSchemaRegistry::Instance(),
                                       inferenceOptions);
  } catch (const std::exception &) {
    return; // ONNX could not infer; our own inference stands alone
  }
  for (const auto &info : inferred.graph().value_info()) {
    auto it = values.find(info.name());
    if (it == values.end() || !info.type().has_tensor_type() ||
        !info.type().tensor_type().has_shape())
      continue;
    std::vector<int64_t> theirs;
    bool isStatic = true;
    for (const auto &dim : info.type().tensor_type().shape().dim()) {
      isStatic &= dim.has_dim_value();
      theirs.push_back(dim.dim_value());
    }
    auto ours = typeOf(it->second).getShape();
    if (isStatic && ArrayRef<int64_t>(theirs) != ours)
      report("value '" + info.name() + "' has shape [" +
             join(std::vector<int64_t>(ours.begin(), ours.end())) +
             "] here but ONNX shape inference says [" + join(theirs) + "]");
  }
}

/// Float16, bfloat16 and float64 in the file: the import says that pipec
/// trains float32 master copies and computes in float32 (trainingKind).
void OnnxImporter::noteNarrowOrWideFloats() {
  const onnx::GraphProto &graph = model.graph();
  std::map<std::string, int> initializersByKind;
  std::set<std::string> otherValues;
  auto other = [](int32_t type) {
    auto kind = elementKindOf(type);
    return kind && isFloating(*kind) && *kind != ElementKind::Float32
               ? std::optional<std::string>(elementKindName(*kind))
               : std::nullopt;
  };
  for (const auto &tensor : graph.initializer())
    if (auto name = other(tensor.data_type()); name && !knownAtImport.count(tensor.name()))
      ++initializersByKind[*name];
  for (const auto &input : graph.input())
    if (auto name = other(input.type().tensor_type().elem_type()))
      otherValues.insert(*name);
  for (const auto &node : graph.node())
    if (node.op_type() == "Cast")
      if (auto name = other(static_cast<int32_t>(intAttr(node, "to", 0))))
        otherValues.insert(*name);
  if (initializersByKind.empty() && otherValues.empty())
    return;
  std::string note;
  for (const auto &[kind, count] : initializersByKind) {
    note += (note.empty() ? "" : ", ") + std::to_string(count) + " initializer(s) are " + kind;
    otherValues.insert(kind);
  }
  std::string kinds;
  for (const std::string &kind : otherValues)
    kinds += (kinds.empty() ? "" : "/") + kind;
  importNotes.push_back(
      (note.empty() ? std::string("the model computes in ") + kinds : note) +
      ": pipec keeps float32 master copies of the parameters and buffers (exact from float16 "
      "and bfloat16, rounded from float64) and computes the model's " + kinds +
      (" arithmetic in float32 (" + settings::flag(settings::kPrecision) + " bf16 runs matrix products in bfloat16)"));
}

bool OnnxImporter::readInitializers(std::map<std::string, HostTensor> &values) {
  if (!loadOnly())
    return false;
  try {
    for (const auto &tensor : model.graph().initializer())
      values[tensor.name()] =
          inTrainingKind(readTensor(tensor, "initializer '" + tensor.name() + "'"));
    return true;
  } catch (const ImportAborted &) {
    return false;
  }
}

bool OnnxImporter::loadOnly() {
  try {
    loadModel();
    // The initializers as run() names them: shared running statistics get
    // their copies (the job's buffers are those).
    privatizeRunningStatistics();
    // Every initializer's data present and of its size, before anything is
    // written (a missing external data file is said here, not half-way).
    for (const auto &tensor : model.graph().initializer())
      checkTensorData(tensor, "initializer '" + tensor.name() + "'");
    return true;
  } catch (const ImportAborted &) {
    return false;
  }
}

bool OnnxImporter::readInitializerChunks(const std::string &name, int64_t chunkElements,
                                         const std::function<void(const HostTensor &)> &consume) {
  try {
    for (const auto &tensor : model.graph().initializer())
      if (tensor.name() == name) {
        readTensorChunks(tensor, "initializer '" + name + "'", chunkElements,
                         [&](const HostTensor &chunk) { consume(inTrainingKind(chunk)); });
        return true;
      }
    failFile("has no initializer '" + name + "'");
  } catch (const ImportAborted &) {
    return false;
  }
}

std::optional<bool> OnnxImporter::batchDimensionIsFree() {
  try {
    loadModel();
  } catch (const ImportAborted &) {
    return std::nullopt;
  }
  std::set<std::string> initializerNames;
  for (const auto &tensor : model.graph().initializer())
    initializerNames.insert(tensor.name());
  bool any = false;
  for (const auto &input : model.graph().input()) {
    if (initializerNames.count(input.name()))
      continue;
    any = true;
    auto given = options.inputShapes.find(input.name());
    if (given != options.inputShapes.end()) {
      if (given->second.empty() || given->second[0] != kMicrobatchDimension)
        return false; // a scalar, or a size given
      continue;
    }
    const auto &type = input.type();
    if (!type.has_tensor_type() || !type.tensor_type().has_shape())
      return false; // no shape: --input-shape gives it whole
    const auto &dims = type.tensor_type().shape().dim();
    if (dims.empty() || (dims[0].has_dim_value() && dims[0].dim_value() >= 0))
      return false; // a scalar, or a size the file fixes
  }
  return any;
}

OwningOpRef<ModuleOp> OnnxImporter::run() {
  context.loadDialect<nn::NNDialect, func::FuncDialect>();
  // Every problem reaches the caller through `errors`: op and module
  // verification collect their diagnostics (DiagnosticCapture), and any other
  // diagnostic (none is expected) is dropped rather than printed.
  ScopedDiagnosticHandler silence(&context, [](Diagnostic &) { return success(); });
  try {
    loadModel();
    checkOpsets();
    respecializeIfAsked();
    // The shapes as validation bounds them: a batch dimension left to the
    // micro-batch size has it (1 when none is given, which
    // resolveInputTypes reports).
    std::map<std::string, std::vector<int64_t>> shapes = options.inputShapes;
    for (auto &[name, dims] : shapes)
      if (!dims.empty() && dims[0] == kMicrobatchDimension)
        dims[0] = options.microbatchSize.value_or(1);
    if (!validateModel(model, path, opset, shapes, errors))
      abandon();
    privatizeRunningStatistics();
    analyzeGraph();
    resolveInputTypes();
    const onnx::GraphProto &graph = model.graph();

    // Initializers: trained parameters and buffers become arguments, the
    // rest are constants for folding.
    // A trained parameter's or buffer's data is not needed to plan: a model
    // whose external data file is absent is planned from its graph.
    std::set<std::string> absentFiles;
    for (const auto &tensor : graph.initializer()) {
      std::string what = "initializer '" + tensor.name() + "'";
      if (knownAtImport.count(tensor.name()))
        constants[tensor.name()] = readTensor(tensor, what);
      else if (std::optional<std::string> absent = absentExternalData(tensor))
        absentFiles.insert(*absent);
      else
        checkTensorData(tensor, what);
    }
    for (const std::string &file : absentFiles)
      importNotes.push_back("the external data file '" + file +
                            "' of the trained parameters is missing: the model is planned from its "
                            "graph, and writing a job (" + settings::flag(settings::kOut) + ") needs the file");

    auto fileLoc = FileLineColLoc::get(&context, path, 0, 0);
    OwningOpRef<ModuleOp> module = ModuleOp::create(fileLoc);
    module->getOperation()->setAttr(nn::kSourceAttrName, builder.getStringAttr(path));
    module->getOperation()->setAttr(nn::kOpsetAttrName, builder.getI64IntegerAttr(opset));
    if (!frozenInitializers.empty()) {
      SmallVector<NamedAttribute> frozen;
      for (const auto &[name, reason] : frozenInitializers)
        frozen.push_back(builder.getNamedAttr(name, builder.getStringAttr(reason)));
      module->getOperation()->setAttr(nn::kFrozenAttrName, builder.getDictionaryAttr(frozen));
    }
    noteNarrowOrWideFloats();
    if (graph.output_size() > 1) {
      std::string others;
      for (int index = 1; index < graph.output_size() && index < 6; ++index)
        others += (index > 1 ? ", '" : "'") + graph.output(index).name() + "'";
      importNotes.push_back("the model has " + std::to_string(graph.output_size()) +
                            " outputs: training computes the loss from the first, '" +
                            graph.output(0).name() + "'; the others (" + others +
                            (graph.output_size() > 6 ? " and more" : "") +
                            ") are not used, and parameters only they read get a zero gradient");
    }
    if (!model.producer_name().empty())
      module->getOperation()->setAttr(
          "nn.producer",
          builder.getStringAttr(model.producer_name() + " " + model.producer_version()));

    SmallVector<Type> argumentTypes;
    SmallVector<std::pair<std::string, nn::Role>> arguments;
    for (const auto &tensor : graph.initializer()) {
      if (knownAtImport.count(tensor.name()))
        continue;
      std::vector<int64_t> shape(tensor.dims().begin(), tensor.dims().end());
      argumentTypes.push_back(RankedTensorType::get(
          shape, mlirElementType(context, *elementKindOf(tensor.data_type()))));
      arguments.push_back(
          {tensor.name(), bufferNames.count(tensor.name()) ? nn::Role::Buffer : nn::Role::Param});
    }
    for (const auto &input : graph.input()) {
      if (initializers.count(input.name()))
        continue;
      auto type = inputTypes.find(input.name());
      assert(type != inputTypes.end() &&
             "resolveInputTypes gave every graph input that is not an initializer a type, or abandoned");
      argumentTypes.push_back(type->second);
      arguments.push_back({input.name(), nn::Role::Input});
    }

    builder.setInsertionPointToEnd(module->getBody());
    // All argument attributes at once: setting them one by one rebuilds the
    // whole attribute array each time (quadratic in the parameter count).
    SmallVector<DictionaryAttr> argumentAttributes;
    argumentAttributes.reserve(arguments.size());
    for (const auto &argument : arguments)
      argumentAttributes.push_back(builder.getDictionaryAttr(
          {builder.getNamedAttr(nn::kNameAttrName, builder.getStringAttr(argument.first)),
           nn::roleAttribute(&context, argument.second)}));
    auto function = func::FuncOp::create(builder, fileLoc, "forward",
                                         builder.getFunctionType(argumentTypes, {}),
                                         ArrayRef<NamedAttribute>{}, argumentAttributes);
    Block *body = function.addEntryBlock();
    for (auto [index, argument] : llvm::enumerate(arguments)) {
      body->getArgument(index).setLoc(
          NameLoc::get(builder.getStringAttr(argument.first), fileLoc));
      values[argument.first] = body->getArgument(index);
    }
    builder.setInsertionPointToEnd(body);

    for (int i = 0; i < graph.node_size(); ++i) {
      const auto &node = graph.node(i);
      currentNodeIndex = i;
      nodeVersion = resolvedVersion(node.op_type(), opset);
      const OnnxOp *row = findOnnxOp(node);
      if (foldedNodes[i]) {
        std::vector<HostTensor> results;
        try {
          results = row->fold(*this, node);
        } catch (const FoldError &error) {
          fail(node, error.what());
        }
        for (size_t r = 0; r < results.size() && static_cast<int>(r) < node.output_size(); ++r)
          if (!node.output(r).empty())
            constants[node.output(r)] = std::move(results[r]);
        continue;
      }
      assert(row && row->convert &&
             "analyzeGraph abandoned the import on a node that is neither folded nor converted");
      row->convert(*this, node);
      for (const auto &output : node.output())
        if (!output.empty() && !values.count(output) && !sequences.count(output) &&
            useCounts[output] > 0)
          fail(node, "output '" + output + "' is used but this translation does not produce it");
    }

    SmallVector<Value> results;
    SmallVector<Type> resultTypes;
    for (const auto &output : graph.output()) {
      auto it = values.find(output.name());
      Value value;
      if (it != values.end()) {
        value = it->second;
      } else if (auto constant = constants.find(output.name()); constant != constants.end()) {
        value = materialize(constant->second, NameLoc::get(builder.getStringAttr(output.name())));
      } else {
        failFile("graph output '" + output.name() + "' is produced by no node");
      }
      results.push_back(value);
      resultTypes.push_back(value.getType());
    }
    func::ReturnOp::create(builder, fileLoc, results);
    function.setFunctionType(builder.getFunctionType(argumentTypes, resultTypes));
    SmallVector<DictionaryAttr> resultAttributes;
    for (const auto &output : graph.output())
      resultAttributes.push_back(builder.getDictionaryAttr(
          {builder.getNamedAttr(nn::kNameAttrName, builder.getStringAttr(output.name()))}));
    function.setAllResultAttrs(resultAttributes);

    // After the conversion: converters add notes too (integers compared in float32).
    if (!importNotes.empty()) {
      SmallVector<Attribute> notes;
      for (const std::string &note : importNotes)
        notes.push_back(builder.getStringAttr(note));
      module->getOperation()->setAttr(nn::kImportNotesAttrName, builder.getArrayAttr(notes));
    }
    crossCheckShapeInference();
    checkInferredModel(model, path, *module, values, constants, errors);
    if (!errors.empty())
      return nullptr;
    DiagnosticCapture diagnostics(context);
    if (failed(mlir::verify(*module))) {
      report("the imported module does not verify: " + diagnostics.text());
      return nullptr;
    }
    return module;
  } catch (const ImportAborted &) {
    return nullptr;
  } catch (const std::exception &error) {
    report(error.what());
    return nullptr;
  }
}

} // namespace detail

bool parseInputShape(const std::string &text, ImportOptions &options, std::string &error) {
  auto equals = text.find('=');
  if (equals == std::string::npos || equals == 0) {
    error = "--input-shape expects name=d0,d1,..., got '" + text + "'";
    return false;
  }
  std::string name = text.substr(0, equals);
  std::vector<int64_t> dims;
  std::stringstream stream(text.substr(equals + 1));
  std::string item;
  while (std::getline(stream, item, ',')) {
    if (dims.empty() && item == "b") { // the batch dimension: the micro-batch size
      dims.push_back(kMicrobatchDimension);
      continue;
    }
    char *end = nullptr;
    long long value = std::strtoll(item.c_str(), &end, 10);
    if (item.empty() || *end != '\0' || value <= 0) {
      error = "--input-shape " + name + ": '" + item + "' is not a positive dimension";
      return false;
    }
    dims.push_back(value);
  }
  options.inputShapes[name] = dims;
  return true;
}

std::optional<bool> batchDimensionIsFree(const std::string &path, const ImportOptions &options,
                                         std::vector<std::string> &errors) {
  MLIRContext context;
  detail::OnnxImporter importer(context, path, options, errors);
  return importer.batchDimensionIsFree();
}

bool readInitializerValues(const std::string &path, std::map<std::string, HostTensor> &values,
                           std::vector<std::string> &errors) {
  MLIRContext context;
  detail::OnnxImporter importer(context, path, ImportOptions(), errors);
  return importer.readInitializers(values);
}

InitializerReader::InitializerReader(const std::string &path)
    : context(std::make_unique<MLIRContext>()),
      importer(std::make_unique<detail::OnnxImporter>(*context, path, options, problems)),
      loaded(importer->loadOnly()) {}

InitializerReader::~InitializerReader() = default;

bool InitializerReader::readChunks(const std::string &name, int64_t chunkElements,
                                   const std::function<void(const HostTensor &)> &consume) {
  return loaded && importer->readInitializerChunks(name, chunkElements, consume);
}

std::vector<std::string> supportedOnnxOps() {
  std::vector<std::string> names;
  for (const detail::OnnxOp &row : detail::onnxOps())
    if (row.convert)
      names.push_back(row.type);
  std::sort(names.begin(), names.end());
  return names;
}

OwningOpRef<ModuleOp> importOnnxModel(MLIRContext &context, const std::string &path,
                                      const ImportOptions &options,
                                      std::vector<std::string> &errors) {
  detail::OnnxImporter importer(context, path, options, errors);
  return importer.run();
}

} // namespace pipec::import
