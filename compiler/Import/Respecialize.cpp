// Re-specializing a static export (docs/importer.md, "Another batch or
// sequence length").
//
// Every dimension a graph input changes is a symbol. Dimensions and small
// integer values (shape vectors) are followed through the graph as
// polynomials in the symbols, and every rule's result is checked against the
// shapes an import at the traced sizes found, so that a rule that does not
// apply is an error rather than a wrong rewrite. A dimension or element that
// comes from a constant carries a slot: the constant, the node that reads it
// and the position. Where a constant dimension must equal a symbolic one
// (broadcasting, a matrix product, a reshape's element count), its slot is
// bound to the symbol's polynomial, and the walk starts again until no slot
// is bound anew. Then each bound constant is rewritten for the nodes that
// bound it: values evaluated at the new sizes, tensors extended by their
// pattern.
#include "compiler/Import/Respecialize.h"
#include "compiler/Import/RespecializeInternal.h"

#include "compiler/Import/ImporterImpl.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <numeric>
#include <optional>
#include <set>

namespace pipec::import::detail::respecialize {

namespace {
/// The index of each element of `shape`, row-major (a small odometer).
bool nextIndex(std::vector<int64_t> &index, const std::vector<int64_t> &shape) {
  for (size_t d = shape.size(); d-- > 0;) {
    if (++index[d] < shape[d])
      return true;
    index[d] = 0;
  }
  return false;
}
int64_t offsetOf(const std::vector<int64_t> &index, const std::vector<int64_t> &shape) {
  int64_t offset = 0;
  for (size_t d = 0; d < shape.size(); ++d)
    offset = offset * shape[d] + index[d];
  return offset;
}
/// `v` rounded to what an element of `kind` holds.
double roundTo(ElementKind kind, double v) {
  switch (kind) {
  case ElementKind::Float32:
    return static_cast<double>(static_cast<float>(v));
  case ElementKind::Float64:
    return v;
  case ElementKind::Float16:
  case ElementKind::BFloat16:
    return v; // compared exactly: a progression of half values is rare
  default:
    return std::nearbyint(v);
  }
}
double valueAt(const HostTensor &t, int64_t offset) {
  return isFloating(t.kind) ? t.floats[offset] : static_cast<double>(t.ints[offset]);
}
} // namespace

std::optional<HostTensor> Respecializer::extend(const HostTensor &tensor,
                                                const std::map<int64_t, int64_t> &newDims,
                                                std::string &why) const {
  const std::vector<int64_t> &shape = tensor.shape;
  if (tensor.numElements() == 0) {
    why = "it is empty";
    return std::nullopt;
  }
  enum class Pattern { Equal, Progression, Band };
  std::map<int64_t, Pattern> patterns;
  std::pair<int64_t, int64_t> band{-1, -1};
  auto holds = [&](auto &&expected) {
    std::vector<int64_t> index(shape.size(), 0);
    do {
      if (valueAt(tensor, offsetOf(index, shape)) != expected(index))
        return false;
    } while (nextIndex(index, shape));
    return true;
  };
  std::vector<int64_t> open;
  for (const auto &entry : newDims) {
    const int64_t axis = entry.first;
    auto at0 = [&](std::vector<int64_t> index) {
      index[axis] = 0;
      return valueAt(tensor, offsetOf(index, shape));
    };
    if (holds([&](const std::vector<int64_t> &index) { return at0(index); })) {
      patterns[axis] = Pattern::Equal;
      continue;
    }
    if (shape[axis] >= 2) {
      // An arithmetic progression along the axis whose step may depend on the
      // other indices (positions times frequencies: rotary angles), equal
      // once rounded to the tensor's element type.
      auto at1 = [&](std::vector<int64_t> index) {
        index[axis] = 1;
        return valueAt(tensor, offsetOf(index, shape));
      };
      auto progression = [&](const std::vector<int64_t> &index) {
        return roundTo(tensor.kind, at0(index) + static_cast<double>(index[axis]) * (at1(index) - at0(index)));
      };
      if (holds(progression)) {
        patterns[axis] = Pattern::Progression;
        continue;
      }
    }
    open.push_back(axis);
  }
  // Two axes left: a band, values depending on (column - row) alone, such as
  // a causal mask; it extends when constant at both ends of the diagonals.
  if (open.size() == 2) {
    int64_t a = open[0], b = open[1];
    auto canonical = [&](std::vector<int64_t> index) {
      int64_t d = index[b] - index[a];
      index[a] = d >= 0 ? 0 : -d;
      index[b] = d >= 0 ? d : 0;
      return index;
    };
    if (holds([&](const std::vector<int64_t> &index) { return valueAt(tensor, offsetOf(canonical(index), shape)); })) {
      auto diagonal = [&](int64_t d) {
        std::vector<int64_t> index(shape.size(), 0);
        index[a] = d >= 0 ? 0 : -d;
        index[b] = d >= 0 ? d : 0;
        return valueAt(tensor, offsetOf(index, shape));
      };
      bool ok = true;
      if (newDims.at(b) > shape[b])
        ok = ok && shape[b] >= 2 && diagonal(shape[b] - 1) == diagonal(shape[b] - 2);
      if (newDims.at(a) > shape[a])
        ok = ok && shape[a] >= 2 && diagonal(-(shape[a] - 1)) == diagonal(-(shape[a] - 2));
      if (ok) {
        patterns[a] = patterns[b] = Pattern::Band;
        band = {a, b};
        open.clear();
      } else {
        why = "its values form a band along dimensions " + std::to_string(a) + " and " + std::to_string(b) +
              " that changes within the traced size, so its continuation is unknown";
        return std::nullopt;
      }
    }
  }
  if (!open.empty()) {
    why = "its values along dimension " + std::to_string(open[0]) +
          " follow no pattern pipec can extend (equal along it, an arithmetic progression, or a band "
          "such as a causal mask)";
    return std::nullopt;
  }
  HostTensor out;
  out.kind = tensor.kind;
  out.shape = shape;
  for (const auto &[axis, size] : newDims)
    out.shape[axis] = size;
  int64_t count = 1;
  for (int64_t d : out.shape)
    count = checkedProduct(count, d);
  if (count > kMaxFoldedElements) {
    why = "it would have " + std::to_string(count) + " elements";
    return std::nullopt;
  }
  std::vector<int64_t> index(out.shape.size(), 0);
  do {
    std::vector<int64_t> source = index;
    std::vector<std::pair<int64_t, int64_t>> progressions; // (axis, new index)
    for (const auto &[axis, pattern] : patterns) {
      if (pattern == Pattern::Equal)
        source[axis] = 0;
      else if (pattern == Pattern::Progression) {
        source[axis] = 0;
        progressions.push_back({axis, index[axis]});
      }
    }
    if (band.first >= 0) {
      auto [a, b] = band;
      int64_t d = std::clamp(index[b] - index[a], -(shape[a] - 1), shape[b] - 1);
      source[a] = d >= 0 ? 0 : -d;
      source[b] = d >= 0 ? d : 0;
    }
    double v = valueAt(tensor, offsetOf(source, shape));
    for (auto [axis, at] : progressions) {
      std::vector<int64_t> next = source;
      next[axis] = 1;
      v += static_cast<double>(at) * (valueAt(tensor, offsetOf(next, shape)) - valueAt(tensor, offsetOf(source, shape)));
    }
    v = roundTo(out.kind, v);
    if (isFloating(out.kind)) {
      out.floats.push_back(v);
    } else if (auto whole = wholeNumber(v)) {
      out.ints.push_back(*whole);
    } else {
      why = "its extended values leave the integers a double holds exactly";
      return std::nullopt;
    }
  } while (count > 0 && nextIndex(index, out.shape));
  return out;
}

namespace {
uint16_t floatToHalfBits(float value, bool bfloat) {
  uint32_t bits;
  std::memcpy(&bits, &value, 4);
  if (bfloat)
    return static_cast<uint16_t>((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16);
  uint16_t sign = static_cast<uint16_t>((bits >> 16) & 0x8000);
  int32_t exponent = static_cast<int32_t>((bits >> 23) & 0xFF) - 127 + 15;
  uint32_t mantissa = bits & 0x7FFFFF;
  if (((bits >> 23) & 0xFF) == 0xFF)
    return sign | 0x7C00 | (mantissa ? 0x200 : 0); // inf, NaN
  if (exponent >= 31)
    return sign | 0x7C00;
  if (exponent <= 0) { // subnormal or zero
    if (exponent < -10)
      return sign;
    mantissa |= 0x800000;
    return sign | static_cast<uint16_t>(mantissa >> (14 - exponent));
  }
  return sign | static_cast<uint16_t>(exponent << 10) | static_cast<uint16_t>(mantissa >> 13);
}

/// `value` as the data of `tensor` (its name and element type kept).
void storeTensor(const HostTensor &value, onnx::TensorProto &tensor) {
  std::string name = tensor.name();
  int32_t type = tensor.data_type();
  tensor.Clear();
  tensor.set_name(name);
  tensor.set_data_type(type);
  for (int64_t d : value.shape)
    tensor.add_dims(d);
  std::string raw;
  auto append = [&raw](auto sample) { raw.append(reinterpret_cast<const char *>(&sample), sizeof(sample)); };
  for (int64_t i = 0; i < value.numElements(); ++i) {
    switch (value.kind) {
    case ElementKind::Float32: append(static_cast<float>(value.floats[i])); break;
    case ElementKind::Float64: append(value.floats[i]); break;
    case ElementKind::Float16: append(floatToHalfBits(static_cast<float>(value.floats[i]), false)); break;
    case ElementKind::BFloat16: append(floatToHalfBits(static_cast<float>(value.floats[i]), true)); break;
    case ElementKind::Int64: append(value.ints[i]); break;
    case ElementKind::Int32: append(static_cast<int32_t>(value.ints[i])); break;
    case ElementKind::Int8: append(static_cast<int8_t>(value.ints[i])); break;
    case ElementKind::UInt8:
    case ElementKind::Bool: append(static_cast<uint8_t>(value.ints[i])); break;
    }
  }
  tensor.set_raw_data(raw);
}
} // namespace

void Respecializer::rewrite(std::vector<std::string> &notes) {
  auto &graph = *model.mutable_graph();
  // Bindings by constant, then by the edge (node, operand) that reads it.
  std::map<std::string, std::map<std::pair<int, int>, std::vector<int>>> bound;
  for (const auto &[slot, poly] : bindings)
    bound[slots[slot].constant][{slots[slot].node, slots[slot].operand}].push_back(slot);
  int copies = 0;
  for (const auto &[name, edges] : bound) {
    HostTensor original = constantValue(name);
    // Each edge's rewritten tensor; edges with the same result share it.
    std::vector<std::pair<std::pair<int, int>, HostTensor>> rewritten;
    for (const auto &[edge, edgeSlots] : edges) {
      std::map<int64_t, int64_t> newDims;
      std::vector<std::pair<int64_t, int64_t>> newValues;
      for (int slot : edgeSlots) {
        int64_t v = newValue(bindings.at(slot));
        if (v < 0)
          throw Failure{"constant '" + name + "' would hold " + std::to_string(v) + " (" +
                        describe(bindings.at(slot)) + ") at the new sizes"};
        if (slots[slot].isValue)
          newValues.push_back({slots[slot].index, v});
        else if (v != original.shape[slots[slot].index])
          newDims[slots[slot].index] = v;
      }
      HostTensor value = original;
      if (!newDims.empty()) {
        std::string why;
        auto extended = extend(original, newDims, why);
        if (!extended) {
          const auto &reader = graph.node(edge.first);
          std::vector<int64_t> wantedShape = original.shape;
          for (const auto &[axis, size] : newDims)
            wantedShape[axis] = size;
          throw Failure{"constant '" + name + "' " + shapeText(original.shape) + ", read by node '" +
                        (reader.name().empty() ? "#" + std::to_string(edge.first) : reader.name()) + "' (" +
                        reader.op_type() + "), must become " + shapeText(wantedShape) +
                        " (it holds the traced sizes), but " + why};
        }
        value = *extended;
        if (!newValues.empty())
          throw Failure{"constant '" + name + "' changes both its shape and its values"};
      }
      for (auto [index, v] : newValues) {
        if (isFloating(value.kind))
          value.floats[index] = static_cast<double>(v);
        else
          value.ints[index] = v;
      }
      rewritten.push_back({edge, value});
    }
    // Every node reading the constant: rewritten in place when all of them
    // read the same new tensor, otherwise each group gets its own copy.
    std::vector<std::pair<int, int>> readers;
    for (int n = 0; n < graph.node_size(); ++n)
      for (int k = 0; k < graph.node(n).input_size(); ++k)
        if (graph.node(n).input(k) == name)
          readers.push_back({n, k});
    auto same = [](const HostTensor &a, const HostTensor &b) {
      return a.shape == b.shape && a.ints == b.ints && a.floats == b.floats;
    };
    bool allSame = readers.size() == rewritten.size() &&
                   std::all_of(rewritten.begin(), rewritten.end(),
                               [&](const auto &r) { return same(r.second, rewritten[0].second); });
    bool isOutput = std::any_of(graph.output().begin(), graph.output().end(),
                                [&](const auto &o) { return o.name() == name; });
    auto describeChange = [&](const HostTensor &value) {
      return shapeText(original.shape) + (value.shape == original.shape ? " (values)" : " -> " + shapeText(value.shape));
    };
    if (allSame && !isOutput) {
      if (auto it = initializerIndex.find(name); it != initializerIndex.end()) {
        storeTensor(rewritten[0].second, *graph.mutable_initializer(it->second));
      } else {
        auto &node = *graph.mutable_node(constantNodeOf.at(name));
        int32_t type = 0;
        for (const auto &a : node.attribute())
          if (a.name() == "value")
            type = a.t().data_type();
        if (type == 0)
          type = isFloating(original.kind) ? onnx::TensorProto_DataType_FLOAT : onnx::TensorProto_DataType_INT64;
        node.clear_attribute();
        auto *attribute = node.add_attribute();
        attribute->set_name("value");
        attribute->set_type(onnx::AttributeProto_AttributeType_TENSOR);
        attribute->mutable_t()->set_data_type(type);
        storeTensor(rewritten[0].second, *attribute->mutable_t());
      }
      notes.push_back("'" + name + "' " + describeChange(rewritten[0].second));
      continue;
    }
    int32_t type = initializerIndex.count(name) ? graph.initializer(initializerIndex.at(name)).data_type() : 0;
    if (!type)
      for (const auto &a : graph.node(constantNodeOf.at(name)).attribute())
        if (a.name() == "value")
          type = a.t().data_type();
    if (!type)
      type = isFloating(original.kind) ? onnx::TensorProto_DataType_FLOAT : onnx::TensorProto_DataType_INT64;
    for (auto &[edge, value] : rewritten) {
      std::string copy = name + ".respecialized" + std::to_string(++copies);
      auto *tensor = graph.add_initializer();
      tensor->set_name(copy);
      tensor->set_data_type(type);
      storeTensor(value, *tensor);
      graph.mutable_node(edge.first)->set_input(edge.second, copy);
      const auto &reader = graph.node(edge.first);
      notes.push_back("'" + name + "' for node '" + (reader.name().empty() ? "#" + std::to_string(edge.first) : reader.name()) +
                      "' " + describeChange(value) +
                      " (as '" + copy + "')");
    }
  }
}

bool Respecializer::run(std::vector<std::string> &problems, std::vector<std::string> &notes) {
  auto &graph = *model.mutable_graph();
  for (int i = 0; i < graph.initializer_size(); ++i)
    initializerIndex[graph.initializer(i).name()] = i;
  for (int i = 0; i < graph.node_size(); ++i)
    if (graph.node(i).op_type() == "Constant" && isDefaultDomain(graph.node(i).domain()) && graph.node(i).output_size() == 1)
      constantNodeOf[graph.node(i).output(0)] = i;
  // The symbols: each (traced, new) pair of sizes a graph input changes.
  std::string change;
  for (const auto &input : graph.input()) {
    if (initializerIndex.count(input.name()))
      continue;
    auto wanted = newShapes.find(input.name());
    if (wanted == newShapes.end()) {
      problems.push_back("no new shape for input '" + input.name() + "'");
      return false;
    }
    const auto &dims = input.type().tensor_type().shape().dim();
    if (dims.size() != static_cast<int>(wanted->second.size())) {
      problems.push_back("input '" + input.name() + "' has rank " + std::to_string(dims.size()));
      return false;
    }
    std::vector<int64_t> before;
    for (int d = 0; d < dims.size(); ++d) {
      before.push_back(dims[d].has_dim_value() ? dims[d].dim_value() : wanted->second[d]);
      if (before[d] == wanted->second[d])
        continue;
      bool exists = false;
      for (size_t s = 0; s < tracedSizes.size(); ++s)
        exists = exists || (tracedSizes[s] == before[d] && newSizes[s] == wanted->second[d]);
      if (exists)
        continue;
      tracedSizes.push_back(before[d]);
      newSizes.push_back(wanted->second[d]);
      symbolNames.push_back(d == 0 ? "batch" : "'" + input.name() + "' dim " + std::to_string(d));
    }
    if (before != wanted->second)
      change += std::string(change.empty() ? "" : ", ") + "'" + input.name() + "' " + shapeText(before) + " -> " +
                shapeText(wanted->second);
  }
  try {
    // Each walk binds at least one more slot or ends the search; a slot is
    // bound once, so the walks are at most the slots' count.
    for (size_t walks = 0;; ++walks) {
      walk();
      if (!boundAnew) {
        if (firstFailure)
          throw *firstFailure;
        break;
      }
      if (walks + 1 >= kMaxWalks)
        throw Failure{"the search for the constants that hold the traced sizes does not settle in " +
                      std::to_string(kMaxWalks) + " walks of the graph"};
    }
    // The batch reaches the outputs: an output whose batch dimension stays
    // at the traced size computes on part of the new batch.
    for (size_t sym = 0; sym < symbolCount(); ++sym) {
      if (symbolNames[sym] != "batch")
        continue;
      for (const auto &output : graph.output()) {
        auto it = symbolic.find(output.name());
        if (it == symbolic.end() || it->second.dims.empty() || !tracedShape(output.name()))
          continue;
        bool follows = false;
        for (const auto &dim : it->second.dims)
          for (const auto &[exponents, coefficient] : dim.poly.terms)
            follows = follows || exponents[sym] > 0;
        if (!follows)
          throw Failure{"output '" + output.name() + "' " + shapeText(*tracedShape(output.name())) +
                        " does not follow the batch: some node computes it from the traced batch in a way "
                        "pipec does not follow"};
      }
    }
    std::vector<std::string> rewritten;
    rewrite(rewritten);
    for (auto &input : *graph.mutable_input()) {
      auto wanted = newShapes.find(input.name());
      if (wanted == newShapes.end())
        continue;
      auto *shape = input.mutable_type()->mutable_tensor_type()->mutable_shape();
      for (int d = 0; d < shape->dim_size(); ++d)
        shape->mutable_dim(d)->set_dim_value(wanted->second[d]);
    }
    // Recorded intermediate and output shapes are the traced ones.
    graph.clear_value_info();
    for (auto &output : *graph.mutable_output())
      if (output.type().has_tensor_type())
        output.mutable_type()->mutable_tensor_type()->clear_shape();
    std::string list;
    for (size_t i = 0; i < rewritten.size() && i < 8; ++i)
      list += (i ? ", " : "") + rewritten[i];
    if (rewritten.size() > 8)
      list += " and " + std::to_string(rewritten.size() - 8) + " more";
    notes.push_back("re-specialized from the traced sizes (" + change + "): " +
                    (rewritten.empty() ? std::string("no constant held them") : "rewrote " + list));
    return true;
  } catch (const Failure &failure) {
    problems.push_back("cannot re-specialize the export (" + change + "): " + failure.message);
    return false;
  }
}


} // namespace pipec::import::detail::respecialize

namespace pipec::import::detail {
using respecialize::Respecializer;

bool respecializeModel(onnx::ModelProto &model, const std::map<std::string, std::vector<int64_t>> &newShapes,
                       const TracedGraph &traced, std::vector<std::string> &problems,
                       std::vector<std::string> &notes) {
  return Respecializer(model, newShapes, traced).run(problems, notes);
}

} // namespace pipec::import::detail

namespace pipec::import::detail {

void OnnxImporter::respecializeIfAsked() {
  const auto &graph = model.graph();
  std::set<std::string> initializerNames;
  for (const auto &tensor : graph.initializer())
    initializerNames.insert(tensor.name());
  // The shapes asked for, and the traced ones: the file's sizes where it
  // fixes them, the asked ones where it leaves them free.
  std::map<std::string, std::vector<int64_t>> wanted, tracedShapes;
  bool changes = false;
  for (const auto &input : graph.input()) {
    if (initializerNames.count(input.name()))
      continue;
    if (!input.type().has_tensor_type() || !input.type().tensor_type().has_shape())
      return; // resolveInputTypes reports what is missing
    const auto &dims = input.type().tensor_type().shape().dim();
    std::vector<int64_t> asked, before;
    auto given = options.inputShapes.find(input.name());
    if (given != options.inputShapes.end() && given->second.size() != static_cast<size_t>(dims.size()))
      return;
    for (int d = 0; d < dims.size(); ++d) {
      bool fixedInFile = dims[d].has_dim_value() && dims[d].dim_value() >= 0;
      int64_t value = fixedInFile ? dims[d].dim_value() : -1;
      if (given != options.inputShapes.end())
        value = given->second[d] == kMicrobatchDimension && d == 0 ? options.microbatchSize.value_or(-1) : given->second[d];
      else if (d == 0 && options.microbatchSize)
        value = *options.microbatchSize;
      if (value < 0)
        return; // a free dimension nobody sized: resolveInputTypes reports it
      asked.push_back(value);
      before.push_back(fixedInFile ? dims[d].dim_value() : value);
      changes = changes || before.back() != value;
    }
    wanted[input.name()] = asked;
    tracedShapes[input.name()] = before;
  }
  if (!changes)
    return;

  // The model at its traced sizes: what every value's shape was, and which
  // values were known at import.
  ImportOptions tracedOptions = options;
  tracedOptions.inputShapes = tracedShapes;
  tracedOptions.microbatchSize.reset();
  std::vector<std::string> tracedErrors;
  OnnxImporter tracedImport(context, path, tracedOptions, tracedErrors);
  mlir::OwningOpRef<mlir::ModuleOp> tracedModule = tracedImport.run(); // keeps `values` alive
  if (!tracedModule)
    return; // the sizes asked for are refused as the file's (resolveInputTypes), or the file's errors are reported
  TracedGraph traced;
  for (const auto &[name, value] : tracedImport.values)
    traced.shapes[name] = std::vector<int64_t>(typeOf(value).getShape().begin(), typeOf(value).getShape().end());
  for (const auto &[name, value] : tracedImport.constants)
    traced.shapes[name] = value.shape;
  traced.constants = std::move(tracedImport.constants);
  traced.read = [this](const onnx::TensorProto &tensor) {
    return readTensor(tensor, "initializer '" + tensor.name() + "'");
  };
  std::vector<std::string> problems, notes;
  if (!respecializeModel(model, wanted, traced, problems, notes)) {
    for (const auto &problem : problems)
      report(problem);
    abandon();
  }
  importNotes.insert(importNotes.end(), notes.begin(), notes.end());
  for (const auto &[name, shape] : wanted)
    if (shape != tracedShapes[name])
      respecializedTo += (respecializedTo.empty() ? "'" : ", '") + name + "' " + shapeText(tracedShapes[name]) +
                         " -> " + shapeText(shape);
}

} // namespace pipec::import::detail
