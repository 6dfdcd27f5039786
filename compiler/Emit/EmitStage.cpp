// The stage code generator: one translation unit per stage, one kernel call
// per op, storage for every value in the function that computes it, and the
// stage ABI around it (docs/codegen.md). The CPU and CUDA kernel libraries
// share one API, so both targets share this emitter; they differ only in
// where storage and constants live, how results reach the host, and the
// stream each entry point binds (docs/cuda-codegen.md).
#include "compiler/Emit/EmitStage.h"

#include "dialects/nn/NNDialect.h"
#include "dialects/pipe/PipeDialect.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/IR/BuiltinAttributes.h"
#include "mlir/IR/SymbolTable.h"
#include "llvm/ADT/DenseMap.h"
#include "llvm/ADT/StringMap.h"
#include "llvm/ADT/StringSwitch.h"
#include "llvm/ADT/TypeSwitch.h"
#include "llvm/Support/Format.h"
#include "llvm/Support/raw_ostream.h"

#include <cmath>
#include <cstdio>
#include <map>
#include <set>

using namespace mlir;

namespace pipec::emit {
namespace {

RankedTensorType tensorType(Value value) { return llvm::cast<RankedTensorType>(value.getType()); }

std::string cType(Type element) {
  if (element.isF32()) return "float";
  if (element.isF64()) return "double";
  if (element.isInteger(64)) return "int64_t";
  if (element.isInteger(32)) return "int32_t";
  if (element.isUnsignedInteger(8)) return "uint8_t";
  if (element.isInteger(8)) return "int8_t";
  if (element.isInteger(1)) return "uint8_t";
  return "";
}

const char *abiDtype(Type element) {
  if (element.isF32()) return "PIPEC_F32";
  if (element.isF64()) return "PIPEC_F64";
  if (element.isInteger(64)) return "PIPEC_I64";
  if (element.isInteger(32)) return "PIPEC_I32";
  return "PIPEC_BOOL";
}

int64_t elementBytes(Type element) {
  return std::max<int64_t>(1, element.getIntOrFloatBitWidth() / 8);
}

std::string list(ArrayRef<int64_t> values) {
  std::string text;
  for (auto [i, value] : llvm::enumerate(values))
    text += (i ? ", " : "") + std::to_string(value);
  return text;
}

std::string shapeOf(Value value) {
  return "pk::Shape{" + list(tensorType(value).getShape()) + "}";
}

std::string dims(ArrayRef<int64_t> values) { return "pk::Dims{" + list(values) + "}"; }

/// A name as diagnostics show it: the literal, cut after 200 bytes.
std::string shownName(StringRef text) {
  return cStringLiteral(text.take_front(200)) + (text.size() > 200 ? "..." : "");
}

std::string floatLiteral(double value) {
  if (std::isinf(value))
    return value < 0 ? "-HUGE_VALF" : "HUGE_VALF";
  if (std::isnan(value))
    return "NAN"; // float; widens exactly to double
  // Hexadecimal floating point: exact, so generated code matches the IR bit for bit.
  char text[64];
  std::snprintf(text, sizeof text, "%a", value);
  return text;
}

struct TensorInfo {
  std::string name;
  RankedTensorType type;
};

struct ParamInfo {
  std::string name;
  RankedTensorType type;
  bool trained;
};

class StageEmitter {
public:
  StageEmitter(pipe::StageOp stage, int numStages, const StageTarget &target, raw_ostream &os)
      : stage(stage), numStages(numStages), target(target), os(os) {}

  LogicalResult run();

private:
  func::FuncOp function(StringRef name) {
    return llvm::dyn_cast_or_null<func::FuncOp>(SymbolTable::lookupSymbolIn(stage, name));
  }
  void collectInterface();
  LogicalResult emitFunction(func::FuncOp function, StringRef cName, bool isStep);
  LogicalResult emitOp(Operation *op, bool isStep);
  LogicalResult emitOps(Block &block, bool isStep);
  std::string bind(Value value, std::string expression);
  std::string allocate(Value value);
  std::string ptr(Value value) { return names.lookup(value); }
  int paramIndex(StringRef name) const {
    for (auto [i, param] : llvm::enumerate(params))
      if (param.name == name)
        return static_cast<int>(i);
    return -1;
  }
  int trainedIndex(StringRef name) const {
    int index = 0;
    for (const auto &param : params) {
      if (param.name == name)
        return index;
      index += param.trained;
    }
    return -1;
  }

  /// The string literal of a name bound for a `const char *` of the stage
  /// ABI (a tensor, parameter or node name); refuses a NUL byte, which the
  /// C string would silently cut (`what` says whose name, `where` the op).
  std::string literal(StringRef text, StringRef what, Operation *where = nullptr) {
    if (text.contains('\0')) {
      InFlightDiagnostic diagnostic = where ? where->emitError() : stage.emitError();
      diagnostic << "stage " << stage.getId() << ": the name of " << what << " "
                 << shownName(text)
                 << " contains a NUL byte, which the stage library's C strings cannot hold";
      nameError = true;
    }
    return cStringLiteral(text);
  }

  bool cuda() const { return target.target == Target::Cuda; }
  const char *targetName() const { return cuda() ? "CUDA" : "CPU"; }
  std::string precisionEnum() const {
    if (target.precision == "bf16")
      return "pk::Precision::BF16";
    if (target.precision == "tf32")
      return "pk::Precision::TF32";
    return "pk::Precision::F32";
  }

  pipe::StageOp stage;
  int numStages;
  StageTarget target;
  raw_ostream &os;
  std::string body;      // the function being emitted
  std::string functions; // the functions emitted so far, written after the tables
  llvm::raw_string_ostream out{body};
  llvm::DenseMap<Value, std::string> names;
  int counter = 0;
  std::string constants;

  SmallVector<ParamInfo> params;
  SmallVector<TensorInfo> data, inputs, outputs;
  std::map<int64_t, int> inputIndex, outputIndex, gradOutputIndex, gradInputIndex;
  llvm::StringMap<int64_t> savedOffsets;
  int64_t workspaceBytes = 0;
  bool computesLoss = false;
  bool interfaceError = false;
  bool nameError = false; // a name literal() refused
  int phase = 0; // of the function being emitted: 0 F, 1 B, 2 W (the profile's)
  std::string optimizer = "PIPEC_ADAMW";
  int statePerParam = 2;
};

void StageEmitter::collectInterface() {
  for (StringRef name : {"fwd", "bwd_input", "bwd_weight", "step"}) {
    func::FuncOp f = function(name);
    if (!f)
      continue;
    for (unsigned i = 0; i < f.getNumArguments(); ++i) {
      auto role = f.getArgAttrOfType<StringAttr>(i, "nn.role");
      auto argName = f.getArgAttrOfType<StringAttr>(i, "nn.name");
      if (!role || !argName)
        continue;
      auto type = llvm::dyn_cast<RankedTensorType>(f.getArgument(i).getType());
      if (!type)
        continue;
      if ((role.getValue() == "param" || role.getValue() == "buffer") &&
          paramIndex(argName.getValue()) < 0)
        params.push_back({argName.str(), type, role.getValue() == "param"});
      if ((role.getValue() == "input" || role.getValue() == "label") &&
          llvm::none_of(data, [&](const TensorInfo &t) { return t.name == argName.getValue(); }))
        data.push_back({argName.str(), type});
    }
  }
  // Parameters that only @bwd_* read after weight stashing appear via restore.
  stage.walk([&](pipe::RestoreOp restore) {
    if (paramIndex(restore.getName()) < 0)
      params.push_back({restore.getName().str(), restore.getResult().getType(), true});
  });
  auto collect = [&](StringRef fn, auto opType, SmallVector<TensorInfo> *infos,
                     std::map<int64_t, int> &index) {
    using OpT = decltype(opType);
    func::FuncOp f = function(fn);
    if (!f)
      return;
    std::map<int64_t, TensorInfo> byTag;
    f.walk([&](OpT op) {
      Value value;
      if constexpr (std::is_same_v<OpT, pipe::RecvOp>)
        value = op.getResult();
      else
        value = op.getValue();
      auto nameAttr = op->template getAttrOfType<StringAttr>("name");
      byTag[op.getTag()] = {nameAttr ? nameAttr.str() : "t" + std::to_string(op.getTag()),
                            tensorType(value)};
    });
    int position = 0;
    for (auto &[tag, info] : byTag) {
      index[tag] = position++;
      if (infos)
        infos->push_back(info);
    }
  };
  collect("fwd", pipe::RecvOp(), &inputs, inputIndex);
  collect("fwd", pipe::SendOp(), &outputs, outputIndex);
  // The runtime sizes the gradient bundles like the activation bundles
  // (grad_outputs[i] like outputs[i], grad_inputs[i] like inputs[i]). Every
  // gradient crossing a boundary is the gradient of (a sum over uses of) an
  // activation that crossed it, so it fits the slot of an activation of its
  // size: each gradient, in tag order, takes the first free slot of equal
  // byte size. The sender (stage k+1, from its received activations) and the
  // receiver (stage k, from its sent ones) see the same list and agree.
  auto assignSlots = [&](StringRef fn, auto opType, ArrayRef<TensorInfo> activations,
                         std::map<int64_t, int> &index) -> LogicalResult {
    using OpT = decltype(opType);
    func::FuncOp f = function(fn);
    if (!f)
      return success();
    std::map<int64_t, Operation *> byTag;
    f.walk([&](OpT op) { byTag[op.getTag()] = op; });
    std::vector<bool> used(activations.size(), false);
    for (auto &[tag, op] : byTag) {
      Value value = op->getNumResults() ? op->getResult(0) : op->getOperand(0);
      auto type = tensorType(value);
      int64_t bytes = type.getNumElements() * elementBytes(type.getElementType());
      int slot = -1;
      for (auto [i, activation] : llvm::enumerate(activations)) {
        int64_t slotBytes = activation.type.getNumElements() *
                            elementBytes(activation.type.getElementType());
        if (!used[i] && slotBytes == bytes) {
          slot = static_cast<int>(i);
          break;
        }
      }
      if (slot < 0)
        return op->emitOpError("no activation of ")
               << bytes << " bytes crosses this boundary to carry this gradient";
      used[slot] = true;
      index[tag] = slot;
    }
    return success();
  };
  if (failed(assignSlots("bwd_input", pipe::RecvOp(), outputs, gradOutputIndex)) ||
      failed(assignSlots("bwd_input", pipe::SendOp(), inputs, gradInputIndex)))
    interfaceError = true;
  for (StringRef fn : {"fwd", "bwd_input"}) {
    func::FuncOp f = function(fn);
    if (!f)
      continue;
    for (unsigned i = 0; i < f.getNumResults(); ++i) {
      auto saved = f.getResultAttrOfType<StringAttr>(i, "pipe.saved");
      if (saved && !savedOffsets.count(saved.getValue())) {
        auto type = llvm::cast<RankedTensorType>(f.getResultTypes()[i]);
        savedOffsets[saved.getValue()] = workspaceBytes;
        int64_t bytes = type.getNumElements() * elementBytes(type.getElementType());
        workspaceBytes += (bytes + 63) / 64 * 64; // keep every slot 64-byte aligned
      }
      auto role = f.getResultAttrOfType<StringAttr>(i, "nn.role");
      if (role && role.getValue() == "loss")
        computesLoss = true;
    }
  }
  if (func::FuncOp step = function("step"))
    if (auto config = step->getAttrOfType<DictionaryAttr>("pipe.optimizer"))
      if (auto kind = config.getAs<StringAttr>("kind"); kind && kind.getValue() == "sgd") {
        optimizer = "PIPEC_SGD";
        statePerParam = 1;
      }
}

std::string StageEmitter::bind(Value value, std::string expression) {
  std::string name = "v" + std::to_string(counter++);
  out << "  " << cType(tensorType(value).getElementType()) << " *" << name << " = "
      << expression << ";\n";
  names[value] = name;
  return name;
}

std::string StageEmitter::allocate(Value value) {
  auto type = tensorType(value);
  std::string storage = "b" + std::to_string(counter);
  out << (cuda() ? "  pk::DeviceBuffer<" : "  std::vector<") << cType(type.getElementType()) << "> "
      << storage << "(" << std::max<int64_t>(1, type.getNumElements()) << ");\n";
  return bind(value, storage + ".data()");
}

LogicalResult StageEmitter::emitOps(Block &block, bool isStep) {
  for (Operation &op : block.without_terminator()) {
    // piperun --profile: time each kernel and report it under the name the
    // cost model and profiles use (pipe.cost's, else the ONNX node's).
    bool timed = !isStep && op.getDialect() && op.getDialect()->getNamespace() == "nn" &&
                 !llvm::isa<nn::ConstantOp, nn::ReshapeOp, nn::FlattenOp, nn::SqueezeOp,
                            nn::UnsqueezeOp>(op);
    std::string name;
    if (auto cost = op.getAttrOfType<DictionaryAttr>("pipe.cost"))
      name = cost.getAs<StringAttr>("name").str();
    else if (auto loc = llvm::dyn_cast<NameLoc>(op.getLoc()))
      name = loc.getName().str();
    else
      name = op.getName().getStringRef().str();
    std::string started = "started" + std::to_string(counter++);
    if (timed)
      out << "  const double " << started << " = call->timer ? secondsNow() : 0.0;\n";
    if (failed(emitOp(&op, isStep)) || nameError)
      return failure();
    if (timed)
      out << "  if (call->timer) call->timer(call->timer_user, "
          << literal(name, "node", &op) << ", "
          << phase << ", secondsNow() - " << started << ");\n";
  }
  return success();
}

LogicalResult StageEmitter::emitOp(Operation *op, bool isStep) {
  auto n = [](Value value) { return tensorType(value).getNumElements(); };
  auto elem = [](Value value) { return cType(tensorType(value).getElementType()); };
  auto binaryKind = [](Operation *op) {
    return llvm::TypeSwitch<Operation *, const char *>(op)
        .Case([](nn::AddOp) { return "pk::Binary::Add"; })
        .Case([](nn::SubOp) { return "pk::Binary::Sub"; })
        .Case([](nn::MulOp) { return "pk::Binary::Mul"; })
        .Case([](nn::DivOp) { return "pk::Binary::Div"; })
        .Default([](Operation *) { return "pk::Binary::Pow"; });
  };
  LogicalResult result = success();
  // Kinds become identifiers: only the kernels' own names pass.
  auto unaryKind = [&](StringRef kind) -> std::string {
    const char *name = llvm::StringSwitch<const char *>(kind)
                           .Case("relu", "Relu")
                           .Case("tanh", "Tanh")
                           .Case("sigmoid", "Sigmoid")
                           .Case("erf", "Erf")
                           .Case("sqrt", "Sqrt")
                           .Case("gelu", "Gelu")
                           .Case("gelu_tanh", "GeluTanh")
                           .Default(nullptr);
    if (!name) {
      result = op->emitOpError("has no ") << targetName() << " lowering for the unary kind "
                                          << shownName(kind);
      return "pk::Unary::Relu";
    }
    return std::string("pk::Unary::") + name;
  };
  auto opId = [&](Operation *op) -> std::string {
    if (auto seed = op->getAttrOfType<IntegerAttr>("seed"))
      return std::to_string(seed.getValue().getZExtValue()) + "ull";
    if (auto name = llvm::dyn_cast<NameLoc>(op->getLoc()))
      return "pk::dropoutOpId(" + literal(name.getName().getValue(), "node", op) + ")";
    return "0ull";
  };

  llvm::TypeSwitch<Operation *>(op)
      .Case<nn::AddOp, nn::SubOp, nn::MulOp, nn::DivOp, nn::PowOp>([&](Operation *op) {
        Value lhs = op->getOperand(0), rhs = op->getOperand(1);
        std::string y = allocate(op->getResult(0));
        out << "  pk::binary(" << binaryKind(op) << ", " << ptr(lhs) << ", " << shapeOf(lhs)
            << ", " << ptr(rhs) << ", " << shapeOf(rhs) << ", " << y << ");\n";
      })
      .Case([&](nn::EqualOp eq) {
        std::string y = allocate(eq.getResult());
        out << "  pk::equal<" << elem(eq.getLhs()) << ">(" << ptr(eq.getLhs()) << ", "
            << shapeOf(eq.getLhs()) << ", " << ptr(eq.getRhs()) << ", " << shapeOf(eq.getRhs())
            << ", " << y << ");\n";
      })
      .Case([&](nn::WhereOp where) {
        std::string y = allocate(where.getResult());
        out << "  pk::where<" << elem(where.getX()) << ">(" << ptr(where.getCondition()) << ", "
            << shapeOf(where.getCondition()) << ", " << ptr(where.getX()) << ", "
            << shapeOf(where.getX()) << ", " << ptr(where.getY()) << ", " << shapeOf(where.getY())
            << ", " << y << ");\n";
      })
      .Case<nn::ReluOp, nn::TanhOp, nn::SigmoidOp, nn::ErfOp, nn::SqrtOp, nn::GeluOp>(
          [&](Operation *op) {
            std::string kind = llvm::TypeSwitch<Operation *, std::string>(op)
                                   .Case([](nn::ReluOp) { return "relu"; })
                                   .Case([](nn::TanhOp) { return "tanh"; })
                                   .Case([](nn::SigmoidOp) { return "sigmoid"; })
                                   .Case([](nn::ErfOp) { return "erf"; })
                                   .Case([](nn::SqrtOp) { return "sqrt"; })
                                   .Case([](nn::GeluOp gelu) {
                                     return gelu.getApproximate() == "tanh" ? "gelu_tanh" : "gelu";
                                   })
                                   .Default([](Operation *) { return ""; });
            std::string y = allocate(op->getResult(0));
            out << "  pk::unary(" << unaryKind(kind) << ", " << ptr(op->getOperand(0)) << ", "
                << n(op->getResult(0)) << ", " << y << ");\n";
          })
      .Case([&](nn::CastOp cast) {
        std::string y = allocate(cast.getResult());
        out << "  pk::cast<" << elem(cast.getInput()) << ", " << elem(cast.getResult()) << ">("
            << ptr(cast.getInput()) << ", " << n(cast.getResult()) << ", " << y << ");\n";
      })
      .Case([&](nn::GemmOp gemm) {
        auto a = tensorType(gemm.getA());
        int64_t m = a.getDimSize(gemm.getTransA() ? 1 : 0), k = a.getDimSize(gemm.getTransA() ? 0 : 1);
        int64_t cols = tensorType(gemm.getResult()).getDimSize(1);
        std::string y = allocate(gemm.getResult());
        out << "  pk::gemm(" << ptr(gemm.getA()) << ", " << ptr(gemm.getB()) << ", "
            << (gemm.getC() ? ptr(gemm.getC()) : "nullptr") << ", "
            << (gemm.getC() ? shapeOf(gemm.getC()) : "pk::Shape{}") << ", " << y << ", " << m
            << ", " << cols << ", " << k << ", " << (gemm.getTransA() ? "true" : "false") << ", "
            << (gemm.getTransB() ? "true" : "false") << ", "
            << floatLiteral(gemm.getAlpha().convertToFloat()) << "f, "
            << floatLiteral(gemm.getBeta().convertToFloat()) << "f);\n";
      })
      .Case([&](nn::MatMulOp matmul) {
        std::string y = allocate(matmul.getResult());
        out << "  pk::matmul(" << ptr(matmul.getA()) << ", " << shapeOf(matmul.getA()) << ", "
            << ptr(matmul.getB()) << ", " << shapeOf(matmul.getB()) << ", " << y << ");\n";
      })
      .Case([&](nn::ConvOp conv) {
        std::string y = allocate(conv.getResult());
        out << "  pk::conv(" << ptr(conv.getInput()) << ", " << shapeOf(conv.getInput()) << ", "
            << ptr(conv.getWeight()) << ", " << shapeOf(conv.getWeight()) << ", "
            << (conv.getBias() ? ptr(conv.getBias()) : "nullptr") << ", " << y << ", "
            << dims(conv.getStrides()) << ", " << dims(conv.getPads()) << ", "
            << dims(conv.getDilations()) << ", " << conv.getGroup() << ");\n";
      })
      .Case([&](nn::ConvInputGradOp grad) {
        std::string y = allocate(grad.getResult());
        out << "  pk::convInputGrad(" << ptr(grad.getDy()) << ", " << shapeOf(grad.getDy()) << ", "
            << ptr(grad.getWeight()) << ", " << shapeOf(grad.getWeight()) << ", " << y << ", "
            << shapeOf(grad.getResult()) << ", " << dims(grad.getStrides()) << ", "
            << dims(grad.getPads()) << ", " << dims(grad.getDilations()) << ", "
            << grad.getGroup() << ");\n";
      })
      .Case([&](nn::ConvWeightGradOp grad) {
        std::string y = allocate(grad.getResult());
        out << "  pk::convWeightGrad(" << ptr(grad.getDy()) << ", " << shapeOf(grad.getDy())
            << ", " << ptr(grad.getInput()) << ", " << shapeOf(grad.getInput()) << ", " << y
            << ", " << shapeOf(grad.getResult()) << ", " << dims(grad.getStrides()) << ", "
            << dims(grad.getPads()) << ", " << dims(grad.getDilations()) << ", "
            << grad.getGroup() << ");\n";
      })
      .Case([&](nn::BatchNormOp norm) {
        std::string y = allocate(norm.getResult());
        std::string mean = allocate(norm.getNewRunningMean());
        std::string var = allocate(norm.getNewRunningVar());
        out << "  pk::batchNorm(" << ptr(norm.getInput()) << ", " << shapeOf(norm.getInput())
            << ", " << ptr(norm.getScale()) << ", " << ptr(norm.getBias()) << ", "
            << ptr(norm.getRunningMean()) << ", " << ptr(norm.getRunningVar()) << ", " << y
            << ", " << mean << ", " << var << ", "
            << floatLiteral(norm.getEpsilon().convertToFloat()) << "f, "
            << floatLiteral(norm.getMomentum().convertToFloat()) << "f, "
            << (norm.getTraining() ? "true" : "false") << ");\n";
      })
      .Case([&](nn::BatchNormGradOp grad) {
        std::string y = allocate(grad.getResult());
        out << "  pk::batchNormGrad(" << ptr(grad.getDy()) << ", " << ptr(grad.getInput()) << ", "
            << shapeOf(grad.getInput()) << ", " << ptr(grad.getScale()) << ", "
            << ptr(grad.getRunningMean()) << ", " << ptr(grad.getRunningVar()) << ", " << y
            << ", " << floatLiteral(grad.getEpsilon().convertToFloat()) << "f, "
            << (grad.getTraining() ? "true" : "false") << ");\n";
      })
      .Case([&](nn::BatchNormParamGradOp grad) {
        std::string scale = allocate(grad.getScaleGrad());
        std::string bias = allocate(grad.getBiasGrad());
        out << "  pk::batchNormParamGrad(" << ptr(grad.getDy()) << ", " << ptr(grad.getInput())
            << ", " << shapeOf(grad.getInput()) << ", " << ptr(grad.getRunningMean()) << ", "
            << ptr(grad.getRunningVar()) << ", " << scale << ", " << bias << ", "
            << floatLiteral(grad.getEpsilon().convertToFloat()) << "f, "
            << (grad.getTraining() ? "true" : "false") << ");\n";
      })
      .Case([&](nn::LayerNormOp norm) {
        std::string y = allocate(norm.getResult());
        std::string mean = allocate(norm.getMean());
        std::string inv = allocate(norm.getInvStdDev());
        out << "  pk::layerNorm(" << ptr(norm.getInput()) << ", " << shapeOf(norm.getInput())
            << ", " << ptr(norm.getScale()) << ", " << shapeOf(norm.getScale()) << ", "
            << (norm.getBias() ? ptr(norm.getBias()) : "nullptr") << ", "
            << (norm.getBias() ? shapeOf(norm.getBias()) : "pk::Shape{}") << ", " << y << ", "
            << mean << ", " << inv << ", " << static_cast<int64_t>(norm.getAxis()) << ", "
            << floatLiteral(norm.getEpsilon().convertToFloat()) << "f);\n";
      })
      .Case([&](nn::LayerNormGradOp grad) {
        std::string y = allocate(grad.getResult());
        out << "  pk::layerNormGrad(" << ptr(grad.getDy()) << ", " << ptr(grad.getInput()) << ", "
            << shapeOf(grad.getInput()) << ", " << ptr(grad.getScale()) << ", "
            << shapeOf(grad.getScale()) << ", " << y << ", "
            << static_cast<int64_t>(grad.getAxis()) << ", "
            << floatLiteral(grad.getEpsilon().convertToFloat()) << "f);\n";
      })
      .Case([&](nn::LayerNormParamGradOp grad) {
        std::string scale = allocate(grad.getScaleGrad());
        std::string bias = allocate(grad.getBiasGrad());
        out << "  pk::layerNormParamGrad(" << ptr(grad.getDy()) << ", " << ptr(grad.getInput())
            << ", " << shapeOf(grad.getInput()) << ", " << shapeOf(grad.getScaleGrad()) << ", "
            << scale << ", " << bias << ", " << static_cast<int64_t>(grad.getAxis()) << ", "
            << floatLiteral(grad.getEpsilon().convertToFloat()) << "f);\n";
      })
      .Case([&](nn::MaxPoolOp pool) {
        std::string y = allocate(pool.getResult());
        out << "  pk::maxPool(" << ptr(pool.getInput()) << ", " << shapeOf(pool.getInput()) << ", "
            << y << ", " << dims(pool.getKernelShape()) << ", " << dims(pool.getStrides()) << ", "
            << dims(pool.getPads()) << ", " << dims(pool.getDilations()) << ", "
            << (pool.getCeilMode() ? "true" : "false") << ");\n";
      })
      .Case([&](nn::MaxPoolGradOp grad) {
        std::string y = allocate(grad.getResult());
        out << "  pk::maxPoolGrad(" << ptr(grad.getDy()) << ", " << ptr(grad.getInput()) << ", "
            << shapeOf(grad.getInput()) << ", " << y << ", " << dims(grad.getKernelShape())
            << ", " << dims(grad.getStrides()) << ", " << dims(grad.getPads()) << ", "
            << dims(grad.getDilations()) << ", " << (grad.getCeilMode() ? "true" : "false")
            << ");\n";
      })
      .Case([&](nn::AveragePoolOp pool) {
        std::string y = allocate(pool.getResult());
        out << "  pk::averagePool(" << ptr(pool.getInput()) << ", " << shapeOf(pool.getInput())
            << ", " << y << ", " << dims(pool.getKernelShape()) << ", " << dims(pool.getStrides())
            << ", " << dims(pool.getPads()) << ", " << (pool.getCeilMode() ? "true" : "false")
            << ", " << (pool.getCountIncludePad() ? "true" : "false") << ");\n";
      })
      .Case([&](nn::AveragePoolGradOp grad) {
        std::string y = allocate(grad.getResult());
        out << "  pk::averagePoolGrad(" << ptr(grad.getDy()) << ", " << y << ", "
            << shapeOf(grad.getResult()) << ", " << dims(grad.getKernelShape()) << ", "
            << dims(grad.getStrides()) << ", " << dims(grad.getPads()) << ", "
            << (grad.getCeilMode() ? "true" : "false") << ", "
            << (grad.getCountIncludePad() ? "true" : "false") << ");\n";
      })
      .Case([&](nn::GlobalAveragePoolOp pool) {
        std::string y = allocate(pool.getResult());
        out << "  pk::globalAveragePool(" << ptr(pool.getInput()) << ", "
            << shapeOf(pool.getInput()) << ", " << y << ");\n";
      })
      .Case([&](nn::DropoutOp dropout) {
        std::string y = allocate(dropout.getResult());
        std::string mask = allocate(dropout.getMask());
        out << "  pk::dropout(" << ptr(dropout.getInput()) << ", " << n(dropout.getResult()) << ", "
            << y << ", " << mask << ", " << floatLiteral(dropout.getRatio().convertToFloat())
            << "f, " << (dropout.getTraining() ? "true" : "false")
            << ", pk::dropoutStreamKey(call->seed, call->step, call->microbatch, " << opId(dropout)
            << "));\n";
      })
      .Case([&](nn::DropoutGradOp grad) {
        std::string y = allocate(grad.getResult());
        out << "  pk::dropoutGrad(" << ptr(grad.getDy()) << ", " << ptr(grad.getMask()) << ", "
            << n(grad.getResult()) << ", " << y << ", "
            << floatLiteral(grad.getRatio().convertToFloat()) << "f, "
            << (grad.getTraining() ? "true" : "false") << ");\n";
      })
      .Case([&](nn::SoftmaxOp softmax) {
        std::string y = allocate(softmax.getResult());
        out << "  pk::softmax(" << ptr(softmax.getInput()) << ", " << shapeOf(softmax.getInput())
            << ", " << *nn::normalizeAxis(softmax.getAxis(), tensorType(softmax.getInput()).getRank())
            << ", " << y << ");\n";
      })
      .Case([&](nn::SoftmaxGradOp grad) {
        std::string y = allocate(grad.getResult());
        out << "  pk::softmaxGrad(" << ptr(grad.getDy()) << ", " << ptr(grad.getY()) << ", "
            << shapeOf(grad.getY()) << ", "
            << *nn::normalizeAxis(grad.getAxis(), tensorType(grad.getY()).getRank()) << ", " << y
            << ");\n";
      })
      .Case([&](nn::SoftmaxCrossEntropyLossOp loss) {
        std::string value = allocate(loss.getLoss());
        std::string logProb = allocate(loss.getLogProb());
        out << "  pk::softmaxCrossEntropyLoss<" << elem(loss.getLabels()) << ">("
            << ptr(loss.getScores()) << ", " << shapeOf(loss.getScores()) << ", "
            << ptr(loss.getLabels()) << ", "
            << (loss.getWeights() ? ptr(loss.getWeights()) : "nullptr") << ", pk::reductionKind("
            << literal(loss.getReduction(), "the reduction", loss) << "), "
            << (loss.getIgnoreIndex() ? "std::optional<int64_t>(" +
                                            std::to_string(*loss.getIgnoreIndex()) + ")"
                                      : "std::nullopt")
            << ", " << value << ", " << logProb << ");\n";
      })
      .Case([&](nn::SoftmaxCrossEntropyLossGradOp grad) {
        std::string y = allocate(grad.getResult());
        out << "  pk::softmaxCrossEntropyLossGrad<" << elem(grad.getLabels()) << ">("
            << ptr(grad.getDloss()) << ", " << ptr(grad.getScores()) << ", "
            << shapeOf(grad.getScores()) << ", " << ptr(grad.getLabels()) << ", "
            << (grad.getWeights() ? ptr(grad.getWeights()) : "nullptr") << ", pk::reductionKind("
            << literal(grad.getReduction(), "the reduction", grad) << "), "
            << (grad.getIgnoreIndex() ? "std::optional<int64_t>(" +
                                            std::to_string(*grad.getIgnoreIndex()) + ")"
                                      : "std::nullopt")
            << ", " << y << ");\n";
      })
      .Case([&](nn::ReduceMeanOp mean) {
        std::string y = allocate(mean.getResult());
        out << "  pk::reduceMean(" << ptr(mean.getInput()) << ", " << shapeOf(mean.getInput())
            << ", " << dims(mean.getAxes()) << ", " << y << ");\n";
      })
      .Case([&](nn::ReduceSumOp sum) {
        std::string y = allocate(sum.getResult());
        out << "  pk::reduceSum(" << ptr(sum.getInput()) << ", " << shapeOf(sum.getInput())
            << ", " << dims(sum.getAxes()) << ", " << y << ");\n";
      })
      .Case([&](nn::GatherOp gather) {
        std::string y = allocate(gather.getResult());
        int64_t axis = *nn::normalizeAxis(gather.getAxis(), tensorType(gather.getData()).getRank());
        out << "  pk::gather<" << elem(gather.getData()) << ", " << elem(gather.getIndices())
            << ">(" << ptr(gather.getData()) << ", " << shapeOf(gather.getData()) << ", "
            << ptr(gather.getIndices()) << ", " << shapeOf(gather.getIndices()) << ", " << axis
            << ", " << y << ");\n";
      })
      .Case([&](nn::GatherGradOp grad) {
        std::string y = allocate(grad.getResult());
        int64_t axis = *nn::normalizeAxis(grad.getAxis(), tensorType(grad.getResult()).getRank());
        out << "  pk::gatherGrad<" << elem(grad.getIndices()) << ">(" << ptr(grad.getDy()) << ", "
            << ptr(grad.getIndices()) << ", " << shapeOf(grad.getIndices()) << ", " << axis
            << ", " << y << ", " << shapeOf(grad.getResult()) << ");\n";
      })
      .Case<nn::ReshapeOp, nn::FlattenOp, nn::SqueezeOp, nn::UnsqueezeOp>([&](Operation *op) {
        // Row-major views: the same bytes under another shape.
        bind(op->getResult(0), ptr(op->getOperand(0)));
      })
      .Case([&](nn::ExpandOp expand) {
        std::string y = allocate(expand.getResult());
        out << "  pk::expand<" << elem(expand.getInput()) << ">(" << ptr(expand.getInput()) << ", "
            << shapeOf(expand.getInput()) << ", " << y << ", " << shapeOf(expand.getResult())
            << ");\n";
      })
      .Case([&](nn::TransposeOp transpose) {
        std::string y = allocate(transpose.getResult());
        out << "  pk::transpose<" << elem(transpose.getInput()) << ">(" << ptr(transpose.getInput())
            << ", " << shapeOf(transpose.getInput()) << ", " << dims(transpose.getPerm()) << ", "
            << y << ");\n";
      })
      .Case([&](nn::ConcatOp concat) {
        std::string y = allocate(concat.getResult());
        std::string t = elem(concat.getResult());
        int64_t axis = *nn::normalizeAxis(concat.getAxis(), tensorType(concat.getResult()).getRank());
        out << "  { const " << t << " *pieces[] = {";
        for (auto [i, input] : llvm::enumerate(concat.getInputs()))
          out << (i ? ", " : "") << ptr(input);
        out << "};\n    const pk::Shape shapes[] = {";
        for (auto [i, input] : llvm::enumerate(concat.getInputs()))
          out << (i ? ", " : "") << shapeOf(input);
        out << "};\n    pk::concat<" << t << ">(pieces, shapes, " << concat.getInputs().size()
            << ", " << axis << ", " << y << "); }\n";
      })
      .Case([&](nn::SplitOp split) {
        std::string t = elem(split.getInput());
        SmallVector<std::string> pieces;
        for (Value piece : split.getResults())
          pieces.push_back(allocate(piece));
        int64_t axis = *nn::normalizeAxis(split.getAxis(), tensorType(split.getInput()).getRank());
        out << "  { " << t << " *pieces[] = {";
        for (auto [i, piece] : llvm::enumerate(pieces))
          out << (i ? ", " : "") << piece;
        out << "};\n    pk::split<" << t << ">(" << ptr(split.getInput()) << ", "
            << shapeOf(split.getInput()) << ", " << axis << ", " << dims(split.getSizes())
            << ", pieces); }\n";
      })
      .Case([&](nn::SliceOp slice) {
        std::string y = allocate(slice.getResult());
        out << "  pk::slice<" << elem(slice.getInput()) << ">(" << ptr(slice.getInput()) << ", "
            << shapeOf(slice.getInput()) << ", " << dims(slice.getStarts()) << ", "
            << dims(slice.getEnds()) << ", " << dims(slice.getSteps()) << ", " << y << ");\n";
      })
      .Case([&](nn::SliceGradOp grad) {
        std::string y = allocate(grad.getResult());
        out << "  pk::sliceGrad(" << ptr(grad.getDy()) << ", " << y << ", "
            << shapeOf(grad.getResult()) << ", " << dims(grad.getStarts()) << ", "
            << dims(grad.getEnds()) << ", " << dims(grad.getSteps()) << ");\n";
      })
      .Case([&](nn::PadOp pad) {
        std::string y = allocate(pad.getResult());
        std::string t = elem(pad.getInput());
        out << "  pk::pad<" << t << ">(" << ptr(pad.getInput()) << ", " << shapeOf(pad.getInput())
            << ", " << dims(pad.getPads()) << ", static_cast<" << t << ">("
            << floatLiteral(pad.getValue().convertToDouble()) << "), " << y << ");\n";
      })
      .Case([&](nn::UnaryGradOp grad) {
        std::string y = allocate(grad.getResult());
        out << "  pk::unaryGrad(" << unaryKind(grad.getKind()) << ", " << ptr(grad.getDy()) << ", "
            << ptr(grad.getX()) << ", " << ptr(grad.getY()) << ", " << n(grad.getResult()) << ", "
            << y << ");\n";
      })
      .Case([&](nn::BinaryGradOp grad) {
        std::string y = allocate(grad.getResult());
        out << "  pk::binaryGrad(pk::binaryGradKind(" << literal(grad.getKind(), "the kind", grad)
            << "), "
            << ptr(grad.getDy()) << ", " << ptr(grad.getLhs()) << ", " << shapeOf(grad.getLhs())
            << ", " << ptr(grad.getRhs()) << ", " << shapeOf(grad.getRhs()) << ", " << y << ");\n";
      })
      .Case([&](nn::ConstantOp constant) {
        auto type = tensorType(constant.getResult());
        auto dense = llvm::dyn_cast<DenseElementsAttr>(constant.getValue());
        if (!dense) {
          result = constant.emitOpError(targetName()) << " code generation needs a dense constant";
          return;
        }
        std::string name = "c" + std::to_string(counter);
        std::string t = cType(type.getElementType());
        llvm::raw_string_ostream decl(constants);
        decl << t << " " << name << "[] = {";
        int64_t count = std::max<int64_t>(1, type.getNumElements());
        for (int64_t i = 0; i < count; ++i) {
          if (i)
            decl << ", ";
          if (llvm::isa<FloatType>(type.getElementType()))
            decl << floatLiteral(dense.getValues<APFloat>()[dense.isSplat() ? 0 : i]
                                     .convertToDouble());
          else if (type.getElementType().isInteger(1) || type.getElementType().isUnsignedInteger())
            decl << dense.getValues<APInt>()[dense.isSplat() ? 0 : i].getZExtValue();
          else
            decl << dense.getValues<APInt>()[dense.isSplat() ? 0 : i].getSExtValue();
        }
        decl << "};\n";
        if (!cuda()) {
          bind(constant.getResult(), name);
          return;
        }
        // Uploaded once, on the first call (the device is the rank's for the whole run).
        out << "  static const pk::DeviceConstant " << name << "Device(" << name << ", sizeof "
            << name << ");\n";
        bind(constant.getResult(), "static_cast<" + t + " *>(" + name + "Device.get())");
      })
      .Case([&](nn::SgdUpdateOp update) {
        out << "  pk::sgdUpdate(" << ptr(update.getParam()) << ", " << ptr(update.getGrad()) << ", "
            << ptr(update.getMomentumBuffer()) << ", " << n(update.getParam())
            << ", opt->step, opt->learning_rate, opt->momentum, opt->weight_decay);\n";
        names[update.getNewParam()] = ptr(update.getParam());
        names[update.getNewMomentumBuffer()] = ptr(update.getMomentumBuffer());
      })
      .Case([&](nn::AdamWUpdateOp update) {
        out << "  pk::adamwUpdate(" << ptr(update.getParam()) << ", " << ptr(update.getGrad())
            << ", " << ptr(update.getM()) << ", " << ptr(update.getV()) << ", "
            << n(update.getParam())
            << ", opt->step, opt->learning_rate, opt->beta1, opt->beta2, opt->epsilon, "
               "opt->weight_decay);\n";
        names[update.getNewParam()] = ptr(update.getParam());
        names[update.getNewM()] = ptr(update.getM());
        names[update.getNewV()] = ptr(update.getV());
      })
      .Case([&](pipe::RecvOp recv) {
        bool forward = llvm::cast<func::FuncOp>(recv->getParentOp()).getSymName() == "fwd";
        int index = forward ? inputIndex[recv.getTag()] : gradOutputIndex[recv.getTag()];
        bind(recv.getResult(), "static_cast<" + cType(recv.getType().getElementType()) + " *>(" +
                                   std::string(forward ? "const_cast<void *>(call->inputs["
                                                       : "const_cast<void *>(call->grad_outputs[") +
                                   std::to_string(index) + "]))");
      })
      .Case([&](pipe::SendOp send) {
        bool forward = llvm::cast<func::FuncOp>(send->getParentOp()).getSymName() == "fwd";
        int index = forward ? outputIndex[send.getTag()] : gradInputIndex[send.getTag()];
        auto type = tensorType(send.getValue());
        out << "  copyIfDistinct(call->" << (forward ? "outputs[" : "grad_inputs[") << index
            << "], " << ptr(send.getValue()) << ", "
            << type.getNumElements() * elementBytes(type.getElementType()) << ");\n";
      })
      .Case([&](pipe::AllReduceOp reduce) {
        // The runtime reduces gradients before calling step (stage ABI).
        names[reduce.getResult()] = ptr(reduce.getValue());
      })
      .Case([&](pipe::StashOp) {}) // weight versions are the runtime's
      .Case([&](pipe::RestoreOp restore) {
        bind(restore.getResult(), "static_cast<float *>(call->params[" +
                                      std::to_string(paramIndex(restore.getName())) + "])");
      })
      .Case([&](pipe::RecomputeOp recompute) {
        Block &block = recompute.getBody().front();
        for (auto [argument, input] : llvm::zip(block.getArguments(), recompute.getInputs()))
          names[argument] = ptr(input);
        if (failed(emitOps(block, isStep))) {
          result = failure();
          return;
        }
        auto yield = llvm::cast<pipe::YieldOp>(block.getTerminator());
        for (auto [value, yielded] : llvm::zip(recompute.getResults(), yield.getValues()))
          names[value] = ptr(yielded);
      })
      .Default([&](Operation *op) {
        result = op->emitOpError("has no ") << targetName() << " lowering";
      });
  return result;
}

LogicalResult StageEmitter::emitFunction(func::FuncOp f, StringRef cName, bool isStep) {
  body.clear();
  names.clear();
  out << "void " << cName << "(const " << (isStep ? "pipec_optimizer_call *opt" : "pipec_call *call")
      << ") {\n";
  if (cuda())
    out << "  pk::StreamScope streamScope(" << (isStep ? "opt" : "call") << "->stream, "
        << precisionEnum() << ");\n";
  if (!isStep)
    out << "  char *workspace = static_cast<char *>(call->workspace);\n  (void)workspace;\n";
  for (unsigned i = 0; i < f.getNumArguments(); ++i) {
    Value argument = f.getArgument(i);
    auto role = f.getArgAttrOfType<StringAttr>(i, "nn.role");
    auto name = f.getArgAttrOfType<StringAttr>(i, "nn.name");
    auto saved = f.getArgAttrOfType<StringAttr>(i, "pipe.saved");
    StringRef r = role ? role.getValue() : "";
    auto tensor = llvm::dyn_cast<RankedTensorType>(argument.getType());
    std::string t = tensor ? cType(tensor.getElementType()) : "";
    if (saved) {
      bind(argument, "reinterpret_cast<" + t + " *>(workspace + " +
                         std::to_string(savedOffsets.lookup(saved.getValue())) + ")");
    } else if (r == "param" || r == "buffer") {
      bind(argument, "static_cast<" + t + " *>(" + (isStep ? "opt" : "call") + "->params[" +
                         std::to_string(paramIndex(name.getValue())) + "])");
    } else if (r == "grad") {
      bind(argument, "static_cast<" + t + " *>(const_cast<void *>(opt->grads[" +
                         std::to_string(paramIndex(name.getValue())) + "]))");
    } else if (r == "optimizer_state") {
      auto state = f.getArgAttrOfType<StringAttr>(i, "pipe.state");
      int within = state && (state.getValue() == "exp_avg_sq") ? 1 : 0;
      bind(argument, "static_cast<" + t + " *>(opt->state[" +
                         std::to_string(trainedIndex(name.getValue()) * statePerParam + within) +
                         "])");
    } else if (r == "input" || r == "label") {
      int index = 0;
      for (auto [j, field] : llvm::enumerate(data))
        if (field.name == name.getValue())
          index = static_cast<int>(j);
      bind(argument, "static_cast<" + t + " *>(const_cast<void *>(call->data[" +
                         std::to_string(index) + "]))");
    } else if (r == "loss_scale" && cuda()) {
      std::string storage = "lossScale" + std::to_string(counter);
      out << "  pk::DeviceBuffer<float> " << storage << "(1);\n  pk::copyFromHost(" << storage
          << ".data(), &call->loss_scale, sizeof(float));\n";
      bind(argument, storage + ".data()");
    } else if (r == "loss_scale") {
      bind(argument, "const_cast<float *>(&call->loss_scale)");
    } else if (r == "microbatch" || r == "step") {
      continue; // scalars the ops read from the call directly
    } else if (tensor) {
      return f.emitOpError("argument #") << i << " has no role the " << targetName()
                                         << " code generator knows";
    }
  }
  if (failed(emitOps(f.getBody().front(), isStep)))
    return failure();
  auto ret = llvm::cast<func::ReturnOp>(f.getBody().front().getTerminator());
  for (auto [i, value] : llvm::enumerate(ret.getOperands())) {
    auto role = f.getResultAttrOfType<StringAttr>(i, "nn.role");
    auto name = f.getResultAttrOfType<StringAttr>(i, "nn.name");
    auto saved = f.getResultAttrOfType<StringAttr>(i, "pipe.saved");
    auto type = llvm::dyn_cast<RankedTensorType>(value.getType());
    int64_t bytes = type ? type.getNumElements() * elementBytes(type.getElementType()) : 0;
    StringRef r = role ? role.getValue() : "";
    if (saved) {
      out << "  copyIfDistinct(workspace + " << savedOffsets.lookup(saved.getValue()) << ", "
          << ptr(value) << ", " << bytes << ");\n";
    } else if (r == "loss" && cuda()) {
      if (!type || !type.getElementType().isF32())
        return f.emitOpError("result #") << i << ": the loss must be a float32 scalar";
      out << "  if (call->loss) pk::copyToHost(call->loss, " << ptr(value) << ", sizeof(float));\n";
    } else if (r == "loss") {
      out << "  if (call->loss) *call->loss = static_cast<float>(" << ptr(value) << "[0]);\n";
    } else if (r == "buffer_update") {
      out << "  copyIfDistinct(call->params[" << paramIndex(name.getValue()) << "], " << ptr(value)
          << ", " << bytes << ");\n";
    } else if (r == "grad") {
      out << "  accumulate(call->grad_params[" << paramIndex(name.getValue()) << "], "
          << ptr(value) << ", " << type.getNumElements() << ");\n";
    } else if (r == "param" && isStep) {
      out << "  copyIfDistinct(opt->params[" << paramIndex(name.getValue()) << "], " << ptr(value)
          << ", " << bytes << ");\n";
    } else if (r == "optimizer_state" && isStep) {
      auto state = f.getResultAttrOfType<StringAttr>(i, "pipe.state");
      int within = state && state.getValue() == "exp_avg_sq" ? 1 : 0;
      out << "  copyIfDistinct(opt->state[" << trainedIndex(name.getValue()) * statePerParam + within
          << "], " << ptr(value) << ", " << bytes << ");\n";
    } else {
      return f.emitOpError("result #") << i << " has no role the " << targetName()
                                       << " code generator knows";
    }
  }
  if (cuda()) // data errors (bad indices, labels) surface from the call that met them
    out << "  pk::raiseDeviceErrors();\n";
  out << "}\n\n";
  functions += body;
  return success();
}

LogicalResult StageEmitter::run() {
  collectInterface();
  if (interfaceError)
    return failure();
  // Every name the descriptor tables carry, checked before anything is written.
  for (const ParamInfo &param : params)
    literal(param.name, param.trained ? "parameter" : "buffer");
  for (const TensorInfo &field : data)
    literal(field.name, "data field");
  for (const TensorInfo &tensor : inputs)
    literal(tensor.name, "received tensor");
  for (const TensorInfo &tensor : outputs)
    literal(tensor.name, "sent tensor");
  if (nameError)
    return failure();
  os << "// Generated by pipec: pipeline stage " << stage.getId() << " of " << numStages
     << " for the " << targetName() << " target";
  if (cuda())
    os << " (matrix products in "
       << (target.precision == "bf16" ? "bf16" : target.precision == "tf32" ? "tf32" : "fp32")
       << ")";
  os << ". Do not edit.\n";
  if (cuda()) {
    // Tensors are device memory; every call runs on the stream the runtime
    // passes, and only the loss is copied back to the host.
    os << "#include \"pipec/cuda_kernels.h\"\n#include \"pipec/stage_abi.h\"\n\n"
       << "#include <cmath>\n#include <optional>\n#include <string>\n\n"
       << "namespace pk = pipec::kernels::cuda;\n\nnamespace {\n\n"
       << "thread_local std::string lastError;\n\n"
       << "void copyIfDistinct(void *to, const void *from, size_t bytes) { pk::copy(from, bytes, to); }\n\n"
       << "double secondsNow() { return pk::profileClock(); }\n\n"
       << "void accumulate(void *to, const float *from, int64_t n) {\n"
       << "  pk::accumulate(static_cast<float *>(to), from, n);\n}\n\n";
  } else {
    os << "#include \"pipec/cpu_kernels.h\"\n#include \"pipec/stage_abi.h\"\n\n"
       << "#include <chrono>\n#include <cmath>\n#include <cstring>\n#include <optional>\n#include <string>\n#include <vector>\n\n"
       << "namespace pk = pipec::kernels;\n\nnamespace {\n\n"
       << "thread_local std::string lastError;\n\n"
       << "void copyIfDistinct(void *to, const void *from, size_t bytes) {\n"
       << "  if (to != from) std::memcpy(to, from, bytes);\n}\n\n"
       << "double secondsNow() {\n"
       << "  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch())"
          ".count();\n}\n\n"
       << "void accumulate(void *to, const float *from, int64_t n) {\n"
       << "  float *target = static_cast<float *>(to);\n"
       << "  for (int64_t i = 0; i < n; ++i) target[i] += from[i];\n}\n\n";
  }

  // Functions are generated first (they collect the constant tables), then
  // written after the tables they use.
  for (auto [name, cName] : {std::pair<StringRef, StringRef>{"fwd", "forward"},
                             {"bwd_input", "backwardInput"},
                             {"bwd_weight", "backwardWeight"},
                             {"step", "step"}}) {
    func::FuncOp f = function(name);
    if (!f) {
      functions += ("void " + cName + "(const " +
                    (name == "step" ? "pipec_optimizer_call *" : "pipec_call *") + ") {}\n\n")
                       .str();
      continue;
    }
    phase = name == "bwd_input" ? 1 : name == "bwd_weight" ? 2 : 0;
    if (failed(emitFunction(f, cName, name == "step")) || nameError)
      return failure();
  }
  os << constants << "\n";

  auto tensorDescs = [&](StringRef table, ArrayRef<TensorInfo> infos) {
    for (auto [i, info] : llvm::enumerate(infos))
      os << "const int64_t " << table << "Shape" << i << "[] = {"
         << (info.type.getRank() ? list(info.type.getShape()) : "0") << "};\n";
    os << "const pipec_tensor_desc " << table << "[] = {";
    for (auto [i, info] : llvm::enumerate(infos))
      os << (i ? ",\n    " : "\n    ") << "{" << cStringLiteral(info.name) << ", "
         << abiDtype(info.type.getElementType()) << ", " << info.type.getRank() << ", " << table
         << "Shape" << i << "}";
    if (infos.empty())
      os << "{nullptr, PIPEC_F32, 0, nullptr}";
    os << "};\n";
  };
  for (auto [i, param] : llvm::enumerate(params))
    os << "const int64_t paramShape" << i << "[] = {"
       << (param.type.getRank() ? list(param.type.getShape()) : "0") << "};\n";
  os << "const pipec_param_desc params[] = {";
  for (auto [i, param] : llvm::enumerate(params))
    os << (i ? ",\n    " : "\n    ") << "{{" << cStringLiteral(param.name) << ", "
       << abiDtype(param.type.getElementType()) << ", " << param.type.getRank() << ", paramShape"
       << i << "}, " << (param.trained ? "PIPEC_TRAINED" : "PIPEC_BUFFER") << "}";
  if (params.empty())
    os << "{{nullptr, PIPEC_F32, 0, nullptr}, PIPEC_TRAINED}";
  os << "};\n";
  tensorDescs("dataFields", data);
  tensorDescs("inputTensors", inputs);
  tensorDescs("outputTensors", outputs);
  os << "\nconst pipec_stage_desc description = {PIPEC_STAGE_ABI_VERSION, "
     << stage.getId() << ", " << numStages << ", " << params.size() << ", params, "
     << data.size() << ", dataFields, " << inputs.size() << ", inputTensors, " << outputs.size()
     << ", outputTensors, " << (computesLoss ? 1 : 0) << ", " << workspaceBytes << ", "
     << optimizer << ", " << statePerParam << "};\n\n";
  os << functions;
  os << "template <class F> int guarded(F &&body) {\n"
     << "  try {\n    body();\n    return 0;\n  } catch (const std::exception &error) {\n"
     << "    lastError = error.what();\n    return 1;\n  }\n}\n\n} // namespace\n\n"
     << "extern \"C\" {\n"
     << "const pipec_stage_desc *pipec_stage_describe(void) { return &description; }\n"
     << "int pipec_stage_forward(const pipec_call *call) { return guarded([&] { forward(call); }); }\n"
     << "int pipec_stage_backward_input(const pipec_call *call) {\n"
     << "  return guarded([&] { backwardInput(call); });\n}\n"
     << "int pipec_stage_backward_weight(const pipec_call *call) {\n"
     << "  return guarded([&] { backwardWeight(call); });\n}\n"
     << "int pipec_stage_step(const pipec_optimizer_call *opt) { return guarded([&] { step(opt); }); }\n"
     << "const char *pipec_stage_last_error(void) { return lastError.c_str(); }\n"
     << "const char *pipec_stage_target(void) { return \"" << (cuda() ? "cuda" : "cpu")
     << "\"; }\n"
     << "}\n";
  return success();
}

} // namespace

std::string cStringLiteral(StringRef bytes) {
  std::string literal;
  literal.reserve(bytes.size() + 2);
  literal += '"';
  for (char c : bytes) {
    auto byte = static_cast<unsigned char>(c);
    if (byte >= 0x20 && byte < 0x7f && c != '"' && c != '\\' && c != '?') {
      literal += c;
    } else {
      literal += '\\';
      literal += static_cast<char>('0' + (byte >> 6));
      literal += static_cast<char>('0' + ((byte >> 3) & 7));
      literal += static_cast<char>('0' + (byte & 7));
    }
  }
  literal += '"';
  return literal;
}

LogicalResult emitStage(pipe::StageOp stage, int numStages, const StageTarget &target,
                        raw_ostream &os) {
  return StageEmitter(stage, numStages, target, os).run();
}

} // namespace pipec::emit
