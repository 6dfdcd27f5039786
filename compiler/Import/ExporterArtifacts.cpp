// What an exporter did to a model that training should know about
// (docs/importer.md, "Exporter artefacts"): PyTorch's graph signature (which
// initializers are parameters and which buffers), optimizations that change
// the trainable model (BatchNormalization folded into convolutions,
// equal-valued initializers merged, weights pre-transposed into new
// tensors), and BatchNormalization written in inference form.
//
// The dynamo exporter writes the signature and the optimizer's rule names as
// metadata_props of the graph (field 16) and of nodes (field 9), fields that
// the ONNX release pipec builds with (1.12) does not know: protobuf keeps
// them as unknown fields, read here.
#include "compiler/Import/ImporterImpl.h"

#include <regex>

namespace pipec::import::detail {
namespace {

constexpr int kNodeMetadataField = 9;
constexpr int kGraphMetadataField = 16;

/// Entries of a metadata_props field the compiled-in ONNX schema lacks.
std::vector<std::pair<std::string, std::string>>
newerMetadata(const google::protobuf::Message &message, int field) {
  std::vector<std::pair<std::string, std::string>> entries;
  const google::protobuf::UnknownFieldSet &unknown =
      message.GetReflection()->GetUnknownFields(message);
  for (int i = 0; i < unknown.field_count(); ++i) {
    const google::protobuf::UnknownField &entry = unknown.field(i);
    if (entry.number() != field ||
        entry.type() != google::protobuf::UnknownField::TYPE_LENGTH_DELIMITED)
      continue;
    onnx::StringStringEntryProto pair;
    if (pair.ParseFromString(entry.length_delimited()))
      entries.emplace_back(pair.key(), pair.value());
  }
  return entries;
}

bool isNormalization(const onnx::NodeProto &node) {
  static const std::set<std::string> kinds{"LayerNormalization", "BatchNormalization",
                                           "GroupNormalization", "InstanceNormalization",
                                           "RMSNormalization"};
  return isDefaultDomain(node.domain()) && kinds.count(node.op_type());
}

std::string listed(const std::vector<std::string> &names, size_t most = 3) {
  std::string text;
  for (size_t i = 0; i < names.size() && i < most; ++i)
    text += (i ? ", '" : "'") + names[i] + "'";
  if (names.size() > most)
    text += " and " + std::to_string(names.size() - most) + " more";
  return text;
}

} // namespace

void OnnxImporter::privatizeRunningStatistics() {
  onnx::GraphProto &graph = *model.mutable_graph();
  std::map<std::string, int> uses;
  for (const auto &node : graph.node())
    for (const auto &input : node.input())
      ++uses[input];
  std::map<std::string, const onnx::TensorProto *> byName;
  for (const auto &tensor : graph.initializer())
    byName[tensor.name()] = &tensor;
  std::set<std::string> taken;
  for (const auto &tensor : graph.initializer())
    taken.insert(tensor.name());
  std::vector<onnx::TensorProto> copies;
  int shared = 0;
  for (int i = 0; i < graph.node_size(); ++i) {
    onnx::NodeProto &node = *graph.mutable_node(i);
    if (node.op_type() != "BatchNormalization" || !isDefaultDomain(node.domain()))
      continue;
    for (int input : {3, 4}) {
      if (input >= node.input_size())
        continue;
      auto found = byName.find(node.input(input));
      if (found == byName.end() || uses[node.input(input)] < 2)
        continue;
      // A running statistic is one layer's state: a copy of its own.
      std::string base = node.input(input) + "." + nodeName(i) +
                         (input == 3 ? ".running_mean" : ".running_var");
      std::string name = base;
      for (int suffix = 1; !taken.insert(name).second; ++suffix)
        name = base + "." + std::to_string(suffix);
      copies.push_back(*found->second);
      copies.back().set_name(name);
      --uses[node.input(input)];
      node.set_input(input, name);
      ++shared;
    }
  }
  for (onnx::TensorProto &copy : copies)
    *graph.add_initializer() = std::move(copy);
  if (shared)
    importNotes.push_back(
        std::to_string(shared) + " BatchNormalization running statistic(s) shared an "
        "initializer with other tensors (an optimized export merged equal-valued initializers): "
        "each is now its layer's own copy, as in the original model");
}

std::optional<OnnxImporter::TorchSignature> OnnxImporter::torchSignature() const {
  for (const auto &[key, value] : newerMetadata(model.graph(), kGraphMetadataField)) {
    if (key != "pkg.torch.export.ExportedProgram.graph_signature")
      continue;
    // Lines such as "p_conv1_weight: PARAMETER target='conv1.weight'".
    TorchSignature signature;
    static const std::regex entry(R"((PARAMETER|BUFFER|CONSTANT_TENSOR) target='([^']*)')");
    for (std::sregex_iterator it(value.begin(), value.end(), entry), end; it != end; ++it)
      ((*it)[1] == "PARAMETER" ? signature.parameters : signature.buffers).insert((*it)[2]);
    return signature;
  }
  return std::nullopt;
}

void OnnxImporter::noteExporterArtifacts(const std::optional<TorchSignature> &signature) {
  const onnx::GraphProto &graph = model.graph();
  // Optimizer rules that change what is trained.
  std::vector<std::string> foldedNormalizations;
  for (int i = 0; i < graph.node_size(); ++i)
    for (const auto &[key, value] : newerMetadata(graph.node(i), kNodeMetadataField))
      if (key == "pkg.onnxscript.rewriter.rule_name" &&
          value.find("FuseBatchNorm") != std::string::npos)
        foldedNormalizations.push_back(nodeName(i));
  if (!foldedNormalizations.empty())
    importNotes.push_back(
        "the exporter's optimizer folded BatchNormalization into " +
        std::to_string(foldedNormalizations.size()) + " node(s) (" + listed(foldedNormalizations) +
        "; onnxscript's FuseBatchNorm rules): this file trains a model without batch "
        "normalization, unlike the original; re-export with torch.onnx.export(..., "
        "optimize=False)");

  // One initializer as the scale or bias of several normalization layers:
  // equal-valued initializers merged by an optimizer.
  std::map<std::string, std::vector<std::string>> normalizationReaders;
  for (int i = 0; i < graph.node_size(); ++i) {
    const onnx::NodeProto &node = graph.node(i);
    if (!isNormalization(node))
      continue;
    for (int input : {1, 2})
      if (input < node.input_size() && parameterNames.count(node.input(input)))
        normalizationReaders[node.input(input)].push_back(nodeName(i));
  }
  for (const auto &[name, readers] : normalizationReaders)
    if (readers.size() > 1)
      importNotes.push_back(
          "initializer '" + name + "' is the scale or bias of " + std::to_string(readers.size()) +
          " normalization layers (" + listed(readers) +
          "): an optimized export merged equal-valued initializers, so training keeps these "
          "layers tied, unlike the original model; re-export with optimize=False");

  if (signature) {
    // Parameters of the PyTorch model that the file does not have: folded
    // into others (BatchNorm into convolutions, a weight into its
    // transpose), merged with an equal one, or dropped (all-zero biases).
    std::vector<std::string> missing;
    for (const std::string &name : signature->parameters)
      if (!initializers.count(name))
        missing.push_back(name);
    if (!missing.empty())
      importNotes.push_back(
          std::to_string(missing.size()) + " of the PyTorch model's " +
          std::to_string(signature->parameters.size()) + " parameters (" + listed(missing) +
          ") are not initializers of the file: the exporter's optimizer folded, merged or "
          "dropped them; re-export with optimize=False to train them all");
    std::vector<std::string> made;
    for (const std::string &name : parameterNames)
      if (!signature->parameters.count(name) && !signature->buffers.count(name))
        made.push_back(name);
    if (!made.empty())
      importNotes.push_back(
          std::to_string(made.size()) + " trained initializer(s) (" + listed(made) +
          ") are not parameters of the PyTorch model (its graph signature): the exporter "
          "computed them from parameters (pre-transposed or folded weights), so training them "
          "trains another parameterization; re-export with optimize=False");
  }

  std::vector<std::string> inferenceForm;
  for (int i = 0; i < graph.node_size(); ++i) {
    const onnx::NodeProto &node = graph.node(i);
    if (node.op_type() != "BatchNormalization" || !isDefaultDomain(node.domain()))
      continue;
    int64_t version = resolvedVersion(node.op_type(), opset);
    bool training = version >= 14 ? intAttr(node, "training_mode", 0) != 0 : node.output_size() > 1;
    if (!training)
      inferenceForm.push_back(nodeName(i));
  }
  if (!inferenceForm.empty() && options.batchNorm == BatchNormStatistics::Batch)
    importNotes.push_back(
        std::to_string(inferenceForm.size()) + " BatchNormalization node(s) (" +
        listed(inferenceForm) +
        ") are in inference form in the file (the dynamo exporter writes them so even from "
        "train()); --batchnorm batch-stats (the default) trains them with batch statistics and "
        "updates the running ones, as PyTorch's train() does; --batchnorm running-stats keeps "
        "the running statistics");
}

} // namespace pipec::import::detail
