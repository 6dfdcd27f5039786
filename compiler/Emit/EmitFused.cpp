// pipe.fused: one loop (CPU) or one kernel (CUDA) computing every body op
// per element, storing only the yielded values (docs/optimization.md). The
// formulas are the kernels' own (pipec/unary_math.h, pipec/binary_math.h).
#include "compiler/Emit/StageEmitter.h"

#include "dialects/pipe/NormJoins.h"


namespace pipec::emit::detail {

namespace {

/// The element of an input of shape `shape` that element `index` of the
/// iteration space `space` reads under numpy broadcasting.
std::string broadcastIndex(ArrayRef<int64_t> shape, ArrayRef<int64_t> space,
                           const std::string &index) {
  while (!shape.empty() && shape.front() == 1)
    shape = shape.drop_front(); // leading ones broadcast like missing axes
  int64_t count = 1, spaceCount = 1;
  for (int64_t d : shape)
    count *= d;
  for (int64_t d : space)
    spaceCount *= d;
  if (count == spaceCount)
    return index; // same elements in the same order
  if (count == 1)
    return "0";
  size_t offset = space.size() - shape.size();
  // The trailing dimensions: index % their product.
  if (space.take_back(shape.size()) == shape)
    return "(" + index + " % " + std::to_string(count) + ")";
  // Leading dimensions kept, trailing ones broadcast ([..., 1]): index / inner.
  size_t kept = shape.size();
  while (kept > 0 && shape[kept - 1] == 1)
    --kept;
  if (shape.take_front(kept) == space.slice(offset, kept)) {
    int64_t inner = 1, outer = 1;
    for (int64_t d : space.drop_front(offset + kept))
      inner *= d;
    for (int64_t d : space.take_front(offset))
      outer *= d;
    std::string row = "(" + index + " / " + std::to_string(inner) + ")";
    return outer == 1 ? row : "(" + row + " % " + std::to_string(count) + ")";
  }
  // General: sum over the input's non-broadcast axes.
  std::string expression;
  int64_t spaceStride = 1, inputStride = 1;
  for (int64_t axis = static_cast<int64_t>(space.size()) - 1; axis >= 0; --axis) {
    int64_t inputAxis = axis - static_cast<int64_t>(offset);
    if (inputAxis >= 0 && shape[inputAxis] != 1)
      expression += (expression.empty() ? "" : " + ") + ("(" + index + " / " +
                    std::to_string(spaceStride) + " % " + std::to_string(space[axis]) + ") * " +
                    std::to_string(inputStride));
    if (inputAxis >= 0)
      inputStride *= shape[inputAxis];
    spaceStride *= space[axis];
  }
  return "(" + (expression.empty() ? std::string("0") : expression) + ")";
}

// Float values are floats in the body, stored as float or (bf16 storage)
// pk::bf16: loaded with one conversion, rounded once when stored. i1
// values (comparisons, the conditions of wheres) are bools in the body and
// uint8_t in memory.
std::string scalarType(Value value) {
  return tensorType(value).getElementType().isInteger(1) ? std::string("bool") : std::string("float");
}
std::string memoryType(Value value) {
  Type element = tensorType(value).getElementType();
  return element.isInteger(1) ? std::string("uint8_t") : cType(element);
}

} // namespace

struct StageEmitter::FusedLoop {
  // CUDA: each thread takes V consecutive elements, and the operands read
  // or written at the element's own index (not broadcast) move in one
  // aligned load or store of V elements (up to 16 bytes) each; the launch
  // falls back to V = 1 when a pointer or the count does not allow it.
  struct PackedOperand {
    std::string name, type, pointer; // the kernel's parameter, its element type, the launch's argument
    int64_t bytes;                   // per element
  };
  static std::string packedName(const std::string &name) { return name + "v.v[v]"; }

  const std::string index = "i";
  // Scalars of the loop body, by value.
  llvm::DenseMap<Value, std::string> scalar;
  std::string loop;
  llvm::raw_string_ostream code{loop};
  SmallVector<std::string> parameters, arguments;
  SmallVector<PackedOperand> packedInputs, packedOutputs;
  std::string prologue; // CUDA: before the loop
  int temporary = 0;

  // A dropout's keep test for element `index`: draw i of the stream `key`
  // against `threshold`, both the call's, passed to the loop by value (on
  // CUDA the key as a pk::StreamKey, resolved once per thread before the
  // loop: it reads the call's key from device memory). Returns the bool's name.
  std::string drawKeep(bool cuda, const std::string &key, const std::string &threshold) {
    const std::string id = std::to_string(temporary), keep = "t" + std::to_string(temporary++);
    if (cuda) {
      parameters.push_back("pk::StreamKey streamKey" + id);
      prologue += "  const uint64_t key" + id + " = streamKey" + id + ".resolve();\n";
    } else {
      parameters.push_back("uint64_t key" + id);
    }
    arguments.push_back(key);
    parameters.push_back("uint64_t threshold" + id);
    arguments.push_back(threshold);
    code << "    const bool " << keep << " = pipec::kernels::dropoutDraw(key" << id << ", (uint64_t)" << index
         << ") >= threshold" << id << ";\n";
    return keep;
  }

  // The kernel's signature and the launch's arguments.
  std::string signature() const {
    std::string signature = "int64_t n";
    for (const std::string &parameter : parameters)
      signature += ", " + parameter;
    return signature;
  }
  std::string call(int64_t count) const {
    std::string call = std::to_string(count);
    for (const std::string &argument : arguments)
      call += ", " + argument;
    return call;
  }

  // CUDA: the work on the V elements from i0 (defined before it): packed
  // loads, the body per element, packed stores, at `indent`. With
  // `aligned` (a row kernel's template flag) the packed operands move
  // whole only where it is true, else element by element.
  std::string packCode(const std::string &indent, const std::string &aligned = "") const {
    std::string text;
    llvm::raw_string_ostream code(text);
    for (const PackedOperand &input : packedInputs)
      code << indent << "const pk::Packed<" << input.type << ", V> " << input.name << "v = "
           << (aligned.empty() ? "" : aligned + " ? ") << "pk::loadPacked<V>(" << input.name << " + i0)"
           << (aligned.empty() ? "" : " : pk::loadElements<V>(" + input.name + " + i0)") << ";\n";
    for (const PackedOperand &output : packedOutputs)
      code << indent << "pk::Packed<" << output.type << ", V> " << output.name << "v;\n";
    code << "#pragma unroll\n" << indent << "for (int v = 0; v < V; ++v) {\n" << indent << "  const int64_t i = i0 + v;\n";
    SmallVector<StringRef> lines;
    StringRef(loop).rtrim('\n').split(lines, '\n');
    const std::string lineIndent(indent.size() - 2, ' '); // the body's lines come indented by 4
    for (StringRef line : lines)
      code << lineIndent << line << "\n";
    code << indent << "}\n";
    for (const PackedOperand &output : packedOutputs) {
      if (!aligned.empty())
        code << indent << "if (!" << aligned << ")\n"
             << indent << "  pk::storeElements(" << output.name << " + i0, " << output.name << "v);\n"
             << indent << "else\n  ";
      code << indent << "pk::storePacked(" << output.name << " + i0, " << output.name << "v);\n";
    }
    return text;
  }

  // CUDA: the __global__ template over V running the loop on packed operands.
  std::string cudaKernel(const std::string &kernel) const {
    return "template <int V>\n__global__ void " + kernel + "(" + signature() + ") {\n" + prologue +
           "  for (int64_t c = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; c < n / V;"
           " c += (int64_t)gridDim.x * blockDim.x) {\n"
           "    const int64_t i0 = c * V;\n" +
           packCode("    ") + "  }\n}\n\n";
  }

  // CUDA: the kernel of a loop joined to a row norm (pipe/NormJoins.h),
  // templated on the rows' lane group P, the norm's width V and whether
  // the loop's packed operands are aligned for it (A). `before` and
  // `after` are the norm's parameters; `rowWork` is what each row runs,
  // with `{pack}` standing for the loop's work on the pack from i0.
  std::string rowKernel(const std::string &kernel, const std::string &before, const std::string &after,
                        const std::string &rowWork) const {
    std::string parameterList = "int64_t rows, int64_t inner" + before;
    for (const std::string &parameter : parameters)
      parameterList += ", " + parameter;
    parameterList += after;
    std::string work = rowWork;
    work.replace(work.find("{pack}"), 6, packCode("      ", "A"));
    return "template <class P, int V, bool A>\n__global__ void " + kernel + "(" + parameterList + ") {\n" + prologue +
           "  for (int64_t r = P::first(); r < rows; r += P::step()) {\n" + work + "  }\n}\n\n";
  }

  // CUDA: a rowKernel's launch: the lane group rowLaunch chooses (at
  // compile time: the shape is static); V the norm's 16-byte width when the
  // row length divides and the norm's `normPointers` are aligned for it, as
  // the library's norms choose it (so the joined norm keeps their bits),
  // else 1; A whether the loop's packed operands are aligned too.
  std::string rowLaunch(const std::string &kernel, int64_t rows, int64_t inner, int64_t width,
                        const std::string &before, const SmallVector<std::string> &normPointers,
                        const std::string &after) const {
    const std::string w = std::to_string(width);
    std::string normPacked = std::to_string(inner) + " % " + w + " == 0", loopAligned = "true";
    for (const std::string &pointer : normPointers)
      normPacked += " && pk::packedAligned<" + w + ">(" + pointer + ")";
    for (const PackedOperand &operand : llvm::concat<const PackedOperand>(packedInputs, packedOutputs))
      loopAligned += " && pk::packedAligned<" + w + ">(" + operand.pointer + ")";
    std::string arguments = std::to_string(rows) + ", " + std::to_string(inner) + before;
    for (const std::string &argument : this->arguments)
      arguments += ", " + argument;
    arguments += after;
    auto launch = [&](const std::string &v, const char *a) {
      return kernel + "<Lanes, " + v + ", " + a + "><<<walk.grid, walk.threads, 0, stream>>>(" + arguments + ");\n";
    };
    return "  {\n    constexpr pk::RowLaunch walk = pk::rowLaunch(" + std::to_string(rows) + ", " +
           std::to_string(inner) + ");\n"
           "    using Lanes = std::conditional_t<walk.warpPerRow, pk::WarpLanes, pk::BlockLanes>;\n"
           "    const bool normPacked = " + normPacked + ";\n" +
           "    const bool loopAligned = " + loopAligned + ";\n" +
           "    const cudaStream_t stream = static_cast<cudaStream_t>(call->stream);\n"
           "    if (normPacked && loopAligned)\n      " + launch(w, "true") +
           "    else if (normPacked)\n      " + launch(w, "false") + "    else\n      " + launch("1", "true") +
           "    if (cudaError_t error = cudaGetLastError(); error != cudaSuccess)\n"
           "      throw std::runtime_error(std::string(\"pipe.fused: \") + cudaGetErrorString(error));\n  }\n";
  }

  // CUDA: the launch, packed (V: 16 bytes of the widest packed operand, at
  // most 8 elements) when the count divides and every packed pointer is
  // aligned, else one element per thread.
  std::string cudaLaunch(const std::string &kernel, int64_t count) const {
    int64_t widest = 1;
    for (const PackedOperand &operand : llvm::concat<const PackedOperand>(packedInputs, packedOutputs))
      widest = std::max(widest, operand.bytes);
    const int64_t width = std::min<int64_t>(8, 16 / widest);
    std::string packable = std::to_string(count) + " % " + std::to_string(width) + " == 0";
    for (const PackedOperand &operand : llvm::concat<const PackedOperand>(packedInputs, packedOutputs))
      packable += " && pk::packedAligned<" + std::to_string(width) + ">(" + operand.pointer + ")";
    const std::string arguments = call(count);
    auto launch = [&](int64_t v) {
      const std::string threads = v == 1 ? std::to_string(count) : std::to_string(count / v);
      return kernel + "<" + std::to_string(v) + "><<<(unsigned)std::min<int64_t>((" + threads +
             " + 255) / 256, 65535), 256, 0, static_cast<cudaStream_t>(call->stream)>>>(" + arguments + ");\n";
    };
    return "  if (" + std::to_string(count) + " > 0) {\n    if (" + packable + ")\n      " + launch(width) +
           "    else\n      " + launch(1) + "    if (cudaError_t error = cudaGetLastError(); error != cudaSuccess)\n" +
           "      throw std::runtime_error(std::string(\"pipe.fused: \") + cudaGetErrorString(error));\n  }\n";
  }

  // CPU: one loop; OpenMP splits the iterations when there are enough (each
  // element is independent, so results do not depend on the thread count),
  // and small loops never enter the OpenMP runtime.
  std::string cpuLoop(int64_t count) const {
    return "  [](" + signature() + ") {\n" + "    auto element = [&](int64_t i) {\n" + loop + "    };\n" +
           "    if (n >= 32768) {\n#pragma omp parallel for schedule(static)\n" +
           "      for (int64_t i = 0; i < n; ++i) element(i);\n" +
           "    } else {\n      for (int64_t i = 0; i < n; ++i) element(i);\n    }\n" + "  }(" + call(count) + ");\n";
  }
};

LogicalResult StageEmitter::emitFusedOp(Operation &op, FusedLoop &loop) {
  auto &scalar = loop.scalar;
  auto &code = loop.code;
  int &temporary = loop.temporary;
  std::string expression;
  auto operand = [&](unsigned i) { return scalar.lookup(op.getOperand(i)); };
  if (auto unary = llvm::dyn_cast<nn::UnaryElementwiseOpInterface>(op)) {
    expression = std::string("pipec::kernels::unaryValue<pipec::kernels::Unary::") +
                 unaryFunction(unary.getUnaryFunction()).enumerator + ">(" + operand(0) + ")";
  } else if (auto binary = llvm::dyn_cast<nn::BinaryElementwiseOpInterface>(op)) {
    expression = std::string("pipec::kernels::binaryValue<pipec::kernels::Binary::") +
                 binaryFunction(binary.getBinaryFunction()).enumerator + ">(" + operand(0) + ", " + operand(1) +
                 ")";
  } else if (llvm::isa<nn::WhereOp>(op)) {
    expression = "(" + operand(0) + " ? " + operand(1) + " : " + operand(2) + ")";
  } else if (auto grad = llvm::dyn_cast<nn::UnaryGradOp>(op)) {
    // Only the forward value the derivative reads is loaded.
    bool readsInput = derivativeReadsInput(grad.getKind());
    // (The op's second operand is x or y, whichever the kind reads.)
    expression = std::string("pipec::kernels::unaryGradient<pipec::kernels::Unary::") +
                 unaryFunction(grad.getKind()).enumerator + ">(" + operand(0) + ", " +
                 (readsInput ? operand(1) : "0.0f") + ", " + (readsInput ? "0.0f" : operand(1)) +
                 ")";
  } else if (auto grad = llvm::dyn_cast<nn::BinaryGradOp>(op)) {
    expression = std::string("pipec::kernels::binaryGradient<pipec::kernels::BinaryGrad::") +
                 binaryGradientKind(grad.getKind()).enumerator + ">(" + operand(0) + ", " +
                 operand(1) + ", " + operand(2) + ")";
  } else if (auto dropout = llvm::dyn_cast<nn::DropoutOp>(op)) {
    // pk::dropout's element: kept when draw i of the op's stream passes
    // the threshold, then x / (1 - ratio) rounded once; outside training
    // the threshold is 0 and the scale 1, so every element is kept as it
    // is. The key, threshold and scale are the call's, passed by value.
    const double ratio = dropout.getRatio().convertToFloat();
    if (!(ratio >= 0.0 && ratio < 1.0))
      return op.emitOpError("ratio must be in [0, 1), got ") << ratio;
    const std::string active = dropout.getTraining() ? "!call->inference" : "false",
                      ratioText = "(double)" + f32Literal(dropout.getRatio().convertToFloat());
    const std::string scale = "scale" + std::to_string(temporary);
    const std::string keep = loop.drawKeep(cuda(), dropoutStreamKey(dropout),
                                           "(" + active + " ? pipec::kernels::dropoutKeepThreshold(" + ratioText +
                                               ") : 0ull)");
    loop.parameters.push_back("double " + scale);
    loop.arguments.push_back("(" + active + " ? 1.0 / (1.0 - " + ratioText + ") : 1.0)");
    const std::string value = "t" + std::to_string(temporary++);
    code << "    const float " << value << " = " << keep << " ? (float)((double)" << operand(0) << " * " << scale
         << ") : 0.0f;\n";
    scalar[dropout.getResult()] = value;
    scalar[dropout.getMask()] = keep;
    return success();
  } else if (auto grad = llvm::dyn_cast<nn::DropoutGradOp>(op)) {
    // pk::dropoutGrad's element: dy / (1 - ratio) where kept, in training;
    // without a mask, kept where the forward's draw i passed (element i of
    // the loop is element i of the forward's dropout: the same shape).
    const double ratio = grad.getRatio().convertToFloat();
    if (!(ratio >= 0.0 && ratio < 1.0))
      return op.emitOpError("ratio must be in [0, 1), got ") << ratio;
    const std::string ratioText = "(double)" + f32Literal(grad.getRatio().convertToFloat());
    std::string keep = grad.getMask() ? operand(1) : "";
    if (!grad.getMask() && grad.getTraining() && ratio > 0.0)
      keep = loop.drawKeep(cuda(), dropoutStreamKey(static_cast<uint64_t>(grad.getDropoutOpId().value_or(0))),
                           "pipec::kernels::dropoutKeepThreshold(" + ratioText + ")");
    if (!grad.getTraining() || ratio == 0.0)
      expression = operand(0);
    else
      expression = "(" + keep + " ? (float)((double)" + operand(0) + " * (1.0 / (1.0 - " + ratioText +
                   "))) : 0.0f)";
  } else {
    return op.emitOpError("in a pipe.fused body has no element-wise ")
           << targetName() << " formula";
  }
  std::string name = "t" + std::to_string(temporary++);
  code << "    const " << scalarType(op.getResult(0)) << " " << name << " = " << expression << ";\n";
  scalar[op.getResult(0)] = name;
  return success();
}

LogicalResult StageEmitter::emitFused(pipe::FusedOp fused) {
  Block &body = fused.getBody().front();
  auto space = tensorType(fused.getResult(0)).getShape();
  int64_t count = tensorType(fused.getResult(0)).getNumElements();
  // A loop joined to a row norm's kernel (pipec-fuse-norm-loops): with an
  // epilogue the norm's input gradient is not an input but the pack the
  // norm's kernel hands the loop (normDx), rounded to its storage.
  if (failed(pipe::checkNormJoin(fused)))
    return failure();
  Operation *norm = pipe::joinedNorm(fused);
  if (norm && !cuda())
    return fused.emitOpError("runs in a norm's kernel (pipec-fuse-norm-loops), which only the CUDA target writes");
  auto grad = llvm::dyn_cast_or_null<nn::LayerNormGradOp>(norm);
  FusedLoop loop;
  // The inputs: one parameter each, read at the element's broadcast index.
  for (auto [i, input] : llvm::enumerate(fused.getInputs())) {
    if (grad && input == grad.getResult()) {
      loop.scalar[body.getArgument(i)] =
          tensorType(input).getElementType().isBF16() ? "float(pk::bf16(normDx[v]))" : "normDx[v]";
      continue;
    }
    std::string name = "in" + std::to_string(i);
    loop.parameters.push_back("const " + memoryType(input) + " *__restrict__ " + name);
    loop.arguments.push_back(ptr(input));
    const std::string at = broadcastIndex(tensorType(input).getShape(), space, loop.index);
    std::string element = name + "[" + at + "]";
    if (cuda() && at == loop.index) {
      loop.packedInputs.push_back({name, memoryType(input), loop.arguments.back(),
                                   elementBytes(tensorType(input).getElementType())});
      element = FusedLoop::packedName(name);
    }
    if (scalarType(input) == "bool")
      element = "bool(" + element + ")";
    else if (tensorType(input).getElementType().isBF16())
      element = "float(" + element + ")";
    loop.scalar[body.getArgument(i)] = element;
  }
  for (Operation &op : body.without_terminator())
    if (failed(emitFusedOp(op, loop)))
      return failure();
  // The yielded values: one output parameter each, stored at the element's index.
  auto yield = llvm::cast<pipe::YieldOp>(body.getTerminator());
  for (auto [i, pair] : llvm::enumerate(llvm::zip(fused.getResults(), yield.getValues()))) {
    auto [result, yielded] = pair;
    std::string name = "out" + std::to_string(i);
    loop.parameters.push_back(memoryType(result) + " *__restrict__ " + name);
    loop.arguments.push_back(allocate(result));
    std::string value = loop.scalar.lookup(yielded);
    if (tensorType(result).getElementType().isBF16())
      value = "pk::bf16(" + value + ")";
    if (cuda()) {
      loop.packedOutputs.push_back({name, memoryType(result), loop.arguments.back(),
                                    elementBytes(tensorType(result).getElementType())});
      loop.code << "    " << FusedLoop::packedName(name) << " = " << value << ";\n";
    } else {
      loop.code << "    " << name << "[" << loop.index << "] = " << value << ";\n";
    }
  }
  if (!cuda()) {
    out << loop.cpuLoop(count);
    return success();
  }
  std::string kernel = "fused" + std::to_string(counter++);
  if (!norm) {
    kernels += loop.cudaKernel(kernel);
    out << loop.cudaLaunch(kernel, count);
    return success();
  }
  // The norm's rows; the kernels' 16-byte width of its storage.
  Value x = grad ? grad.getInput() : llvm::cast<nn::LayerNormOp>(norm).getInput();
  FailureOr<pipe::NormRows> view =
      pipe::normRows(tensorType(x), grad ? grad.getAxis() : llvm::cast<nn::LayerNormOp>(norm).getAxis());
  if (failed(view))
    return norm->emitOpError("has an axis outside its input's rank");
  const int64_t rows = view->rows, inner = view->inner;
  const int64_t width = 16 / elementBytes(tensorType(x).getElementType());
  const std::string storage = cType(tensorType(x).getElementType());
  if (grad) {
    const std::string before = ", const " + storage + " *__restrict__ normDy, const " + storage +
                               " *__restrict__ normX, const float *__restrict__ normScale, float normEpsilon, "
                               "pipec::kernels::RowNorm normKind";
    kernels += loop.rowKernel(kernel, before, "",
                              "    pk::layerNormGradRow<P, V>(normDy + r * inner, normX + r * inner, inner, "
                              "normScale, normEpsilon, normKind,\n"
                              "                               [&](int64_t c, const float (&normDx)[V]) {\n"
                              "      const int64_t i0 = r * inner + c * V;\n{pack}"
                              "    });\n");
    out << loop.rowLaunch(kernel, rows, inner, width,
                          ", " + ptr(grad.getDy()) + ", " + ptr(grad.getInput()) + ", " + ptr(grad.getScale()) +
                              ", " + f32Literal(grad.getEpsilon().convertToFloat()) + ", " +
                              rowNorm(grad.getCentered()),
                          {ptr(grad.getDy()), ptr(grad.getInput()), ptr(grad.getScale())}, "");
    return success();
  }
  auto layerNorm = llvm::cast<nn::LayerNormOp>(norm);
  const std::string y = allocate(layerNorm.getResult()), mean = allocate(layerNorm.getMean()),
                    invStd = allocate(layerNorm.getInvStdDev());
  const std::string xName = "out" + std::to_string(llvm::cast<OpResult>(x).getResultNumber());
  const std::string bias = layerNorm.getBias() ? ptr(layerNorm.getBias()) : "nullptr";
  const std::string after = ", const float *__restrict__ normScale, const float *__restrict__ normBias, " + storage +
                            " *__restrict__ normY, float *__restrict__ normMean, float *__restrict__ normInvStd, "
                            "float normEpsilon, pipec::kernels::RowNorm normKind";
  kernels += loop.rowKernel(kernel, "", after,
                            "    for (int64_t c = P::lane(); c < inner / V; c += P::lanes()) {\n"
                            "      const int64_t i0 = r * inner + c * V;\n{pack}    }\n"
                            "    P::sync(); // the row's stored values, read back by every lane\n"
                            "    pk::layerNormRow<P, V>(" + xName + " + r * inner, inner, normScale, normBias, "
                            "normY + r * inner, r, normMean, normInvStd, normEpsilon, normKind);\n");
  SmallVector<std::string> normPointers{ptr(x), y, ptr(layerNorm.getScale())};
  if (layerNorm.getBias())
    normPointers.push_back(bias);
  out << loop.rowLaunch(kernel, rows, inner, width, "", normPointers,
                        ", " + ptr(layerNorm.getScale()) + ", " + bias + ", " + y + ", " + mean + ", " + invStd +
                            ", " + f32Literal(layerNorm.getEpsilon().convertToFloat()) + ", " +
                            rowNorm(layerNorm.getCentered()));
  return success();
}

} // namespace pipec::emit::detail
