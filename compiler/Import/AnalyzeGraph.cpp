// Analysis of the graph before anything is translated (docs/importer.md):
// the operator version each node follows (its row's versions, OnnxOps.cpp), which initializers are trained
// parameters or buffers, which values are known at import time, the nodes
// nothing can translate, and the static types of the graph inputs.
#include "compiler/Import/ImporterImpl.h"
#include "analysis/Settings/Declared.h"

#include "llvm/Support/Regex.h"

using namespace mlir;

namespace pipec::import::detail {

/// Whether an initializer is an additive attention mask, a buffer that
/// exporters write as an initializer like any parameter (docs/importer.md):
/// every path from it runs through views (Slice, Reshape, Unsqueeze,
/// Squeeze, Expand, Identity) into an Add whose only reader is a Softmax,
/// and its values are 0 and one value <= -1e9 (-inf, float's lowest, -1e9), or all 0 for
/// an `allZero` tensor.
/// Such a tensor is constant; trained, its 0 entries would move.
bool OnnxImporter::isAdditiveAttentionMask(const onnx::TensorProto &tensor, const Readers &readers,
                                           bool allZero) {
  auto kind = elementKindOf(tensor.data_type());
  if (!kind || !isFloating(*kind) || tensor.dims_size() < 2)
    return false;
  const onnx::GraphProto &graph = model.graph();
  for (const auto &output : graph.output())
    if (output.name() == tensor.name())
      return false;
  static const std::set<std::string> views{"Slice", "Reshape", "Unsqueeze", "Squeeze", "Expand", "Identity"};
  std::vector<std::string> frontier{tensor.name()};
  size_t visited = 0;
  while (!frontier.empty()) {
    std::string value = frontier.back();
    frontier.pop_back();
    auto found = readers.find(value);
    if (found == readers.end() || found->second.empty() || ++visited > 64)
      return false;
    for (const onnx::NodeProto *node : found->second) {
      if (!isDefaultDomain(node->domain()) || node->output_size() != 1)
        return false;
      if (views.count(node->op_type()) && node->input(0) == value) {
        frontier.push_back(node->output(0));
        continue;
      }
      auto sum = readers.find(node->output(0));
      if (node->op_type() != "Add" || sum == readers.end() || sum->second.size() != 1 ||
          sum->second[0]->op_type() != "Softmax")
        return false;
    }
  }
  HostTensor values = readTensor(tensor, "initializer '" + tensor.name() + "'");
  std::optional<double> fill;
  for (double v : values.floats) {
    if (v == 0.0)
      continue;
    if (!(v <= -1.0e9) || (fill && *fill != v))
      return false;
    fill = v;
  }
  return fill.has_value() || allZero;
}

/// Whether every reader takes `tensor` as the initial state (initial_h or
/// initial_c) of an RNN, GRU or LSTM and all its values are 0.
bool OnnxImporter::isZeroInitialState(const onnx::TensorProto &tensor, const Readers &readers) {
  auto found = readers.find(tensor.name());
  if (found == readers.end() || found->second.empty())
    return false;
  for (const onnx::NodeProto *node : found->second) {
    if (!isDefaultDomain(node->domain()) ||
        (node->op_type() != "RNN" && node->op_type() != "GRU" && node->op_type() != "LSTM"))
      return false;
    for (int index = 0; index < node->input_size(); ++index)
      if (node->input(index) == tensor.name() && index != 5 && index != 6)
        return false;
  }
  HostTensor values = readTensor(tensor, "initializer '" + tensor.name() + "'");
  return llvm::all_of(values.floats, [](double v) { return v == 0.0; });
}

/// The nodes reading `name`, as "Op 'node' input #k" ('#i' for an unnamed
/// node), for the reason an initializer carries no gradient.
std::string OnnxImporter::readersOf(const std::string &name) const {
  const onnx::GraphProto &graph = model.graph();
  std::vector<std::string> uses;
  for (int i = 0; i < graph.node_size(); ++i) {
    const onnx::NodeProto &node = graph.node(i);
    for (int index = 0; index < node.input_size(); ++index)
      if (node.input(index) == name)
        uses.push_back(node.op_type() + " '" + nodeName(i) + "' input #" + std::to_string(index));
  }
  std::string text = "read by ";
  for (size_t i = 0; i < uses.size() && i < 3; ++i)
    text += (i ? ", " : "") + uses[i];
  if (uses.size() > 3)
    text += " and " + std::to_string(uses.size() - 3) + " more";
  return text;
}

/// Decides, before translating anything, which initializers are trained
/// parameters, which are buffers (BatchNormalization statistics) and which
/// values are known at import time; then lists every unsupported node.
void OnnxImporter::analyzeGraph() {
  const onnx::GraphProto &graph = model.graph();
  for (const auto &tensor : graph.initializer())
    initializers[tensor.name()] = &tensor;
  for (const auto &node : graph.node())
    for (const auto &input : node.input())
      if (!input.empty())
        ++useCounts[input];
  for (const auto &output : graph.output())
    ++useCounts[output.name()];

  // Gradient flow, from the graph outputs backwards through differentiable inputs.
  std::set<std::string> carriesGradient;
  for (const auto &output : graph.output())
    carriesGradient.insert(output.name());
  for (int i = graph.node_size() - 1; i >= 0; --i) {
    const auto &node = graph.node(i);
    bool needed = llvm::any_of(node.output(), [&](const std::string &name) {
      return carriesGradient.count(name) > 0;
    });
    if (!needed)
      continue;
    const OnnxOp *row = findOnnxOp(node);
    for (int index = 0; index < node.input_size(); ++index) {
      bool differentiable = !row || row->differentiableInputs.contains(index);
      if (differentiable && !node.input(index).empty())
        carriesGradient.insert(node.input(index));
    }
  }
  for (const auto &node : graph.node())
    if (node.op_type() == "BatchNormalization" && isDefaultDomain(node.domain()))
      for (int index : {3, 4})
        if (index < node.input_size() && initializers.count(node.input(index)))
          bufferNames.insert(node.input(index));
  Readers readers;
  for (const auto &node : graph.node())
    for (const auto &input : node.input())
      readers[input].push_back(&node);
  std::vector<llvm::Regex> freezePatterns;
  for (const std::string &pattern : options.freeze) {
    freezePatterns.emplace_back("^(" + pattern + ")$");
    std::string problem;
    if (!freezePatterns.back().isValid(problem))
      failFile("--freeze '" + pattern + "' is not a regular expression: " + problem);
  }
  std::vector<bool> freezeMatched(freezePatterns.size(), false);
  const std::optional<TorchSignature> signature = torchSignature();
  // Every floating initializer that is not trained gets its reason
  // (frozenInitializers): nothing is frozen without a message.
  for (const auto &tensor : graph.initializer()) {
    auto kind = elementKindOf(tensor.data_type());
    if (!kind || !isFloating(*kind) || bufferNames.count(tensor.name()))
      continue;
    const std::string &name = tensor.name();
    if (!carriesGradient.count(name)) {
      frozenInitializers[name] = readers.count(name)
                                     ? "no gradient reaches it from the outputs (" +
                                           readersOf(name) + ")"
                                     : "not read by any node";
      continue;
    }
    // A scalar is a constant (eps, scale factors), never a trained weight.
    if (tensor.dims_size() == 0) {
      frozenInitializers[name] = "a scalar (exporters write eps and scale factors as scalars)";
      continue;
    }
    bool frozenByUser = false;
    for (size_t p = 0; p < freezePatterns.size(); ++p)
      if (freezePatterns[p].match(name))
        frozenByUser = freezeMatched[p] = true;
    if (frozenByUser) {
      frozenInitializers[name] = "--freeze";
      continue;
    }
    if (signature && signature->buffers.count(name)) {
      frozenInitializers[name] = "a buffer of the PyTorch model (the exporter's graph signature)";
      continue;
    }
    // The dynamo exporter's optimizer folds the attention mask of an
    // unpadded batch into an all-zero initializer that is no parameter.
    const bool exporterMade = signature && !signature->parameters.count(name);
    if (isAdditiveAttentionMask(tensor, readers, exporterMade)) {
      frozenInitializers[name] = "an additive attention mask (0 and a large negative value, or "
                                 "all 0 and not a PyTorch parameter, read by Add before Softmax)";
      continue;
    }
    // PyTorch's default zero initial state of an RNN, which the optimizer
    // writes as an initializer (a learned initial state is a parameter).
    if (exporterMade && isZeroInitialState(tensor, readers)) {
      frozenInitializers[name] = "a zero initial state of RNN/GRU/LSTM, not a PyTorch parameter";
      continue;
    }
    parameterNames.insert(name);
  }
  for (size_t p = 0; p < freezePatterns.size(); ++p)
    if (!freezeMatched[p])
      report("--freeze '" + options.freeze[p] + "' matches no trainable initializer");
  if (!llvm::all_of(freezeMatched, [](bool matched) { return matched; }))
    abandon();
  noteExporterArtifacts(signature);
  for (const auto &tensor : graph.initializer())
    if (!parameterNames.count(tensor.name()) && !bufferNames.count(tensor.name()))
      knownAtImport.insert(tensor.name());

  // Values known at import time, and the nodes nothing can translate.
  std::vector<std::string> unsupported;
  foldedNodes.assign(graph.node_size(), false);
  for (int i = 0; i < graph.node_size(); ++i) {
    const auto &node = graph.node(i);
    currentNodeIndex = i;
    const OnnxOp *row = findOnnxOp(node);
    bool foldable = row && row->fold &&
                    // Shape and Size read only the (static) shape.
                    (node.op_type() == "Shape" || node.op_type() == "Size" ||
                     llvm::all_of(node.input(), [&](const std::string &name) {
                       return name.empty() || knownAtImport.count(name) > 0;
                     }));
    if (foldable) {
      foldedNodes[i] = true; // run() folds exactly these (a node without outputs too)
      for (const auto &output : node.output())
        knownAtImport.insert(output);
      continue;
    }
    if (row) {
      int64_t version = resolvedVersion(node.op_type(), opset);
      int64_t oldest = row->versions.oldestSupported;
      if (version < oldest) {
        unsupported.push_back(
            "node '" + nodeName(i) + "' (" +
            node.op_type() +
            (version == 0 ? " does not exist at opset " + std::to_string(opset)
                          : " version " + std::to_string(version) + " of opset " +
                                std::to_string(opset) + "; pipec translates version " +
                                std::to_string(oldest) + " and newer") +
            ")");
        continue;
      }
    }
    bool hasSubgraph = llvm::any_of(node.attribute(), [](const onnx::AttributeProto &a) {
      return a.has_g() || a.graphs_size() > 0;
    });
    if (!row || !row->convert || hasSubgraph) {
      std::string domain = isDefaultDomain(node.domain()) ? "" : node.domain() + "::";
      std::string reason = row && row->fold
                               ? " (only supported when its inputs are known at import time)"
                               : "";
      unsupported.push_back("node '" + nodeName(i) + "' (" + domain + node.op_type() + ")" +
                            reason);
    }
  }
  if (!unsupported.empty()) {
    std::string message = std::to_string(unsupported.size()) +
                          " unsupported operator node(s) (opset " + std::to_string(opset) +
                          "): ";
    for (size_t i = 0; i < unsupported.size(); ++i)
      message += (i ? "; " : "") + unsupported[i];
    message += ". pipec translates: ";
    auto supported = supportedOnnxOps();
    for (size_t i = 0; i < supported.size(); ++i)
      message += (i ? ", " : "") + supported[i];
    message += " (and folds shape computations known at import time).";
    failFile(message);
  }
}

void OnnxImporter::resolveInputTypes() {
  std::vector<std::string> problems;
  std::set<std::string> graphInputs;
  for (const auto &input : model.graph().input()) {
    if (initializers.count(input.name()))
      continue; // older exporters list initializers as inputs too
    graphInputs.insert(input.name());
    const auto &type = input.type();
    if (!type.has_tensor_type()) {
      problems.push_back("input '" + input.name() + "' is not a tensor");
      continue;
    }
    auto kind = elementKindOf(type.tensor_type().elem_type());
    if (!kind) {
      problems.push_back("input '" + input.name() + "' has an unsupported element type (" +
                         std::to_string(type.tensor_type().elem_type()) + ")");
      continue;
    }
    auto given = options.inputShapes.find(input.name());
    std::vector<int64_t> shape;
    if (!type.tensor_type().has_shape() && given == options.inputShapes.end()) {
      problems.push_back("input '" + input.name() +
                         "' has no shape; give one with --input-shape " + input.name() +
                         "=d0,d1,...");
      continue;
    }
    const auto &dims = type.tensor_type().shape().dim();
    // The micro-batch size fills a free batch dimension, and must agree with
    // a fixed or given one (docs/importer.md, "The batch dimension").
    const bool batchFree = type.tensor_type().has_shape() && !dims.empty() &&
                           !(dims[0].has_dim_value() && dims[0].dim_value() >= 0);
    if (options.microbatchSize && given == options.inputShapes.end() && type.tensor_type().has_shape() &&
        !dims.empty() && !batchFree && dims[0].dim_value() != *options.microbatchSize) {
      problems.push_back("the micro-batch size is " + std::to_string(*options.microbatchSize) + " but input '" +
                         input.name() + "' fixes its batch dimension (dimension 0) at " +
                         std::to_string(dims[0].dim_value()) +
                         ", and the model does not import at that size to be re-specialized; re-export the model "
                         "with a dynamic batch dimension (torch.onnx.export's dynamic_shapes, or dynamic_axes with "
                         "dynamo=False), or use the exported size");
      continue;
    }
    if (options.microbatchSize && given != options.inputShapes.end() && !given->second.empty() &&
        given->second[0] != kMicrobatchDimension && given->second[0] != *options.microbatchSize) {
      problems.push_back("the micro-batch size is " + std::to_string(*options.microbatchSize) + " but the shape "
                         "given for input '" + input.name() + "' has " + std::to_string(given->second[0]) +
                         " in its batch dimension (dimension 0)");
      continue;
    }
    if (given != options.inputShapes.end()) {
      shape = given->second;
      if (!shape.empty() && shape[0] == kMicrobatchDimension) {
        if (!options.microbatchSize) {
          problems.push_back("the shape given for input '" + input.name() + "' leaves its batch dimension to the " +
                             ("micro-batch size (b), which is not given: " + settings::flag(settings::kMicrobatchSize) + " b, or plan with " + settings::flag(settings::kGpus) + " ") +
                             "and the planner chooses it");
          continue;
        }
        shape[0] = *options.microbatchSize;
      }
      if (type.tensor_type().has_shape() && dims.size() != static_cast<int>(shape.size())) {
        problems.push_back("--input-shape gives rank " + std::to_string(shape.size()) +
                           " for input '" + input.name() + "' of rank " +
                           std::to_string(dims.size()));
        continue;
      }
      for (int d = 0; d < dims.size() && type.tensor_type().has_shape(); ++d)
        if (dims[d].has_dim_value() && dims[d].dim_value() != shape[d])
          problems.push_back("--input-shape sets dimension " + std::to_string(d) +
                             " of input '" + input.name() + "' to " +
                             std::to_string(shape[d]) + " but the model fixes it to " +
                             std::to_string(dims[d].dim_value()));
    } else {
      std::vector<std::string> symbolic;
      for (int d = 0; d < dims.size(); ++d) {
        if (dims[d].has_dim_value() && dims[d].dim_value() >= 0)
          shape.push_back(dims[d].dim_value());
        else if (d == 0 && options.microbatchSize)
          shape.push_back(*options.microbatchSize);
        else
          symbolic.push_back(dims[d].has_dim_param() ? "'" + dims[d].dim_param() + "'"
                                                     : "dimension " + std::to_string(d));
      }
      if (!symbolic.empty()) {
        std::string list;
        for (size_t i = 0; i < symbolic.size(); ++i)
          list += (i ? ", " : "") + symbolic[i];
        const bool onlyBatch = symbolic.size() == 1 && batchFree && !options.microbatchSize;
        problems.push_back("input '" + input.name() + "' has dynamic dimensions (" + list + "); " +
                           (onlyBatch ? "its batch dimension (dimension 0) is the micro-batch size: give it with " +
                                        (settings::flag(settings::kMicrobatchSize) + " b, or plan with " + settings::flag(settings::kGpus) + " and the planner chooses it")
                                      : "give static ones with --input-shape " + input.name() +
                                            (batchFree && options.microbatchSize ? "=b,d1,... (b: the micro-batch size)"
                                                                                 : "=d0,d1,...") +
                                            (batchFree && !options.microbatchSize
                                                 ? (" (dimension 0, the batch, also with " + settings::flag(settings::kMicrobatchSize) + " b)")
                                                 : "")));
        continue;
      }
    }
    inputTypes[input.name()] =
        RankedTensorType::get(shape, mlirElementType(context, *kind));
  }
  for (const auto &[name, shape] : options.inputShapes)
    if (!graphInputs.count(name))
      problems.push_back("--input-shape names '" + name + "', which is not an input of the "
                         "model");
  if (!problems.empty()) {
    for (const auto &problem : problems)
      report(problem);
    abandon();
  }
}

} // namespace pipec::import::detail
