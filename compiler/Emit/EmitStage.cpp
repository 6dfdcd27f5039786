// The stage code generator: one translation unit per stage, one kernel call
// per op (EmitOps.cpp), storage for every value in the function that computes
// it, and the stage ABI around it (docs/codegen.md). The CPU and CUDA kernel libraries
// share one API, so both targets share this emitter; they differ only in
// where storage and constants live, how results reach the host, and the
// stream each entry point binds (docs/cuda-codegen.md).
#include "compiler/Emit/StageEmitter.h"

#include "dialects/pipe/NormJoins.h"

#include "llvm/Support/ErrorHandling.h"
#include "llvm/Support/Format.h"

#include <cassert>
#include <cmath>
#include <cstdio>
#include <set>

using namespace mlir;

namespace pipec::emit {
namespace detail {

void StageEmitter::collectInterface() {
  for (StringRef name : {"fwd", "bwd_input", "bwd_weight", "step"}) {
    func::FuncOp f = function(name);
    if (!f)
      continue;
    for (unsigned i = 0; i < f.getNumArguments(); ++i) {
      std::optional<nn::Role> role = nn::argumentRole(f, i);
      auto argName = f.getArgAttrOfType<StringAttr>(i, nn::kNameAttrName);
      if (!role || !argName)
        continue;
      auto type = llvm::dyn_cast<RankedTensorType>(f.getArgument(i).getType());
      if (!type)
        continue;
      if ((*role == nn::Role::Param || *role == nn::Role::Buffer) &&
          paramIndex(argName.getValue()) < 0)
        params.push_back({argName.str(), type, *role == nn::Role::Param});
      if ((*role == nn::Role::Input || *role == nn::Role::Label) &&
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
      auto sharing = f.getResultAttrOfType<IntegerAttr>(i, pipe::kSavedSlotOfAttrName);
      if (saved && sharing && !savedOffsets.count(saved.getValue())) {
        // The same bytes as an earlier saved result: its slot.
        auto first = f.getResultAttrOfType<StringAttr>(sharing.getInt(), "pipe.saved");
        assert(first && savedOffsets.count(first.getValue()) &&
               "pipec-plan-memory names an earlier pipe.saved result");
        savedOffsets[saved.getValue()] = savedOffsets.lookup(first.getValue());
      } else if (saved && !savedOffsets.count(saved.getValue())) {
        auto type = llvm::cast<RankedTensorType>(f.getResultTypes()[i]);
        savedOffsets[saved.getValue()] = workspaceBytes;
        int64_t bytes = type.getNumElements() * elementBytes(type.getElementType());
        workspaceBytes += (bytes + 63) / 64 * 64; // keep every slot 64-byte aligned
      }
      if (nn::resultRole(f, i) == nn::Role::Loss)
        computesLoss = true;
    }
  }
  if (func::FuncOp step = function("step"))
    if (auto config = step->getAttrOfType<pipe::OptimizerAttr>(pipe::kOptimizerAttrName))
      if (config.getKind() == pipe::OptimizerKind::Sgd) {
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

pipe::StorageAttr StageEmitter::storageOf(Value value) const {
  auto result = llvm::dyn_cast<OpResult>(value);
  if (!result)
    return {};
  auto places = result.getOwner()->getAttrOfType<ArrayAttr>(pipe::kStorageAttrName);
  if (!places)
    return {};
  return llvm::cast<pipe::StorageAttr>(places[result.getResultNumber()]);
}

std::string StageEmitter::scratchArgument(Operation *op) const {
  auto place = op->getAttrOfType<DenseI64ArrayAttr>(pipe::kScratchAttrName);
  if (!place || place.size() != 2)
    return "";
  return ", kernelScratch(" + std::to_string(place[0]) + ", " + std::to_string(place[1]) + ")";
}

std::string StageEmitter::allocate(Value value) {
  auto type = tensorType(value);
  std::string t = cType(type.getElementType());
  if (pipe::StorageAttr place = storageOf(value)) {
    switch (place.getKind()) {
    case pipe::StorageKind::Arena:
      return bind(value, "reinterpret_cast<" + t + " *>(arena + " +
                             std::to_string(place.getOffset()) + ")");
    case pipe::StorageKind::Saved: {
      auto saved = current.getResultAttrOfType<StringAttr>(place.getOffset(), "pipe.saved");
      assert(saved && "pipec-plan-memory names a pipe.saved result of the function");
      return bind(value, "reinterpret_cast<" + t + " *>(workspace + " +
                             std::to_string(savedOffsets.lookup(saved.getValue())) + ")");
    }
    case pipe::StorageKind::Gradient: {
      auto name = current.getResultAttrOfType<StringAttr>(place.getOffset(), nn::kNameAttrName);
      assert(name && "a gradient result names its parameter (nn.name)");
      return bind(value, "static_cast<" + t + " *>(call->grad_params[" +
                             std::to_string(paramIndex(name.getValue())) + "])");
    }
    case pipe::StorageKind::Register:
      llvm_unreachable("a norm gradient's register value is never stored: its loop runs in the norm's kernel");
    case pipe::StorageKind::Buffer: {
      auto name = current.getResultAttrOfType<StringAttr>(place.getOffset(), nn::kNameAttrName);
      assert(name && "a buffer update result names its buffer (nn.name)");
      return bind(value, "static_cast<" + t + " *>(call->params[" + std::to_string(paramIndex(name.getValue())) +
                             "])");
    }
    }
  }
  assert(!current->hasAttr(pipe::kArenaSizeAttrName) &&
         "pipec-plan-memory places every result code generation stores");
  std::string storage = "b" + std::to_string(counter);
  out << (cuda() ? "  pk::DeviceBuffer<" : "  std::vector<") << t << "> " << storage << "("
      << std::max<int64_t>(1, type.getNumElements()) << ");\n";
  return bind(value, storage + ".data()");
}

/// The name piperun --profile reports an op's time under: the one the cost
/// model and profiles use (pipe.cost's, else the ONNX node's).
static std::string profileName(Operation &op) {
  if (auto cost = op.getAttrOfType<pipe::CostAttr>(pipe::kCostAttrName))
    return cost.getName().str();
  if (std::optional<StringRef> node = nn::nodeName(op.getLoc()))
    return node->str();
  return op.getName().getStringRef().str();
}

void StageEmitter::reportAbsorbed(Operation &op, const std::string &name) {
  // The other ONNX nodes the op absorbed (absorbedLocation) are reported
  // too, with no time of their own: it is in the op's.
  auto absorbed = llvm::dyn_cast<FusedLoc>(op.getLoc());
  if (!absorbed)
    return;
  const StringRef own = nn::nodeName(op.getLoc()).value_or(name);
  for (Location part : absorbed.getLocations())
    if (auto named = llvm::dyn_cast<NameLoc>(part); named && named.getName().getValue() != own)
      out << "  opAbsorbed(call, " << literal(named.getName().getValue(), "node", &op) << ", " << phase << ");\n";
}

LogicalResult StageEmitter::emitOps(Block &block, bool isStep) {
  for (Operation &op : block.without_terminator()) {
    // A norm, or a norm's gradient, whose kernel runs a loop
    // (pipec-fuse-norm-loops) is written, and timed, with the loop.
    if (pipe::loopJoinedTo(&op)) {
      if (!cuda())
        return op.emitOpError("runs a pipe.fused loop in its kernel (pipec-fuse-norm-loops), which only the CUDA "
                              "target writes");
      continue;
    }
    // piperun --profile: time each kernel and report it under profileName.
    auto fused = llvm::dyn_cast<pipe::FusedOp>(op);
    // A bf16 conversion is queued into the next table call (flushConversions),
    // untimed: pipec-bf16-storage's, of no ONNX node.
    const bool queued = cuda() && (isBf16Conversion(&op) || conversionMovedBy(&op));
    bool timed = !isStep && !queued &&
                 ((op.getDialect() && op.getDialect()->getNamespace() == "nn" &&
                   !llvm::isa<nn::ConstantOp, nn::ReshapeOp, nn::FlattenOp, nn::SqueezeOp, nn::UnsqueezeOp>(op)) ||
                  fused);
    std::string name = profileName(op);
    std::string started = "started" + std::to_string(counter++);
    if (timed)
      out << "  const double " << started << " = opStarted(call);\n";
    if (!llvm::isa<nn::AdamWUpdateOp, nn::SgdUpdateOp>(op))
      flushOptimizerUpdates(); // the updates so far, before an op that may read their results
    if (!queued && !nn::isView(&op))
      flushConversions(); // the conversions so far, before an op that may read them (a view reads nothing)
    if (failed(emitOp(&op, isStep)) || nameError)
      return failure();
    if (timed && fused) {
      // One loop computes every op of the group, and the norm whose kernel
      // runs it: its time is split evenly among them, under their own names.
      SmallVector<Operation *> members;
      for (Operation &member : fused.getBody().front().without_terminator())
        members.push_back(&member);
      Operation *norm = pipe::joinedNorm(fused);
      if (norm)
        members.push_back(norm);
      if (members.empty())
        continue;
      out << "  {\n    static const char *const nodes[] = {";
      for (auto [i, member] : llvm::enumerate(members))
        out << (i ? ", " : "") << literal(profileName(*member), "node", member);
      out << "};\n    opShared(call, nodes, " << members.size() << ", " << phase << ", " << started
          << ");\n  }\n";
      if (norm)
        reportAbsorbed(*norm, profileName(*norm));
      continue;
    }
    if (timed)
      out << "  opTimed(call, " << literal(name, "node", &op) << ", " << phase << ", " << started << ");\n";
    if (timed)
      reportAbsorbed(op, name);
  }
  flushOptimizerUpdates();
  flushConversions();
  return success();
}

LogicalResult StageEmitter::emitFunction(func::FuncOp f, StringRef cName, bool isStep) {
  body.clear();
  names.clear();
  current = f;
  drawsDropout = false;
  out << "void " << cName << "(const " << (isStep ? "pipec_optimizer_call *opt" : "pipec_call *call")
      << ") {\n";
  if (cuda())
    out << "  pk::StreamScope streamScope(" << (isStep ? "opt" : "call") << "->stream, "
        << precisionEnum() << ");\n";
  // CUDA: a call's work runs inside pk::CallGraphs::run, which replays it
  // from a CUDA graph (docs/cuda-codegen.md, "CUDA graphs"). The step is
  // three launches a step and keeps them.
  const bool graphed = cuda() && !isStep;
  const size_t workStart = body.size();
  if (!isStep)
    out << "  char *workspace = static_cast<char *>(call->workspace);\n  (void)workspace;\n";
  if (f->hasAttr(pipe::kArenaSizeAttrName))
    out << "  char *arena = stageArena();\n  (void)arena;\n";
  for (unsigned i = 0; i < f.getNumArguments(); ++i) {
    Value argument = f.getArgument(i);
    std::optional<nn::Role> r = nn::argumentRole(f, i);
    auto name = f.getArgAttrOfType<StringAttr>(i, nn::kNameAttrName);
    auto saved = f.getArgAttrOfType<StringAttr>(i, "pipe.saved");
    auto tensor = llvm::dyn_cast<RankedTensorType>(argument.getType());
    std::string t = tensor ? cType(tensor.getElementType()) : "";
    if (saved) {
      assert(savedOffsets.count(saved.getValue()) &&
             "pipec-verify-pipeline gives every pipe.saved argument a producer in @fwd or @bwd_input");
      bind(argument, "reinterpret_cast<" + t + " *>(workspace + " +
                         std::to_string(savedOffsets.lookup(saved.getValue())) + ")");
    } else if (r == nn::Role::Param || r == nn::Role::Buffer) {
      bind(argument, "static_cast<" + t + " *>(" + (isStep ? "opt" : "call") + "->params[" +
                         std::to_string(paramIndex(name.getValue())) + "])");
    } else if (r == nn::Role::Grad) {
      bind(argument, "static_cast<" + t + " *>(const_cast<void *>(opt->grads[" +
                         std::to_string(paramIndex(name.getValue())) + "]))");
    } else if (r == nn::Role::OptimizerState) {
      int within = pipe::argStateOf(f, i) == pipe::OptimizerState::ExpAvgSq ? 1 : 0;
      bind(argument, "static_cast<" + t + " *>(opt->state[" +
                         std::to_string(trainedIndex(name.getValue()) * statePerParam + within) +
                         "])");
    } else if (r == nn::Role::Input || r == nn::Role::Label) {
      int index = 0;
      for (auto [j, field] : llvm::enumerate(data))
        if (field.name == name.getValue())
          index = static_cast<int>(j);
      bind(argument, "static_cast<" + t + " *>(const_cast<void *>(call->data[" +
                         std::to_string(index) + "]))");
    } else if (r == nn::Role::LossScale && cuda()) {
      // Allocated on the first call, like the arena: no allocation per call.
      std::string storage = "lossScale" + std::to_string(counter);
      out << "  static pk::DeviceBuffer<float> " << storage << "(1);\n  pk::storeScalar("
          << storage << ".data(), call->loss_scale);\n";
      bind(argument, storage + ".data()");
    } else if (r == nn::Role::LossScale) {
      bind(argument, "const_cast<float *>(&call->loss_scale)");
    } else if (r == nn::Role::Microbatch || r == nn::Role::Step) {
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
    std::optional<nn::Role> r = nn::resultRole(f, i);
    auto name = f.getResultAttrOfType<StringAttr>(i, nn::kNameAttrName);
    auto saved = f.getResultAttrOfType<StringAttr>(i, "pipe.saved");
    auto type = llvm::dyn_cast<RankedTensorType>(value.getType());
    int64_t bytes = type ? type.getNumElements() * elementBytes(type.getElementType()) : 0;
    if (saved && f.getResultAttr(i, pipe::kSavedSlotOfAttrName)) {
      // stored by the earlier result whose slot it shares
    } else if (saved) {
      assert(savedOffsets.count(saved.getValue()) && "only @fwd and @bwd_input return pipe.saved values, and collectInterface gave each a slot");
      out << "  copyIfDistinct(workspace + " << savedOffsets.lookup(saved.getValue()) << ", "
          << ptr(value) << ", " << bytes << ");\n";
    } else if (r == nn::Role::Loss && cuda()) {
      if (!type || !type.getElementType().isF32())
        return f.emitOpError("result #") << i << ": the loss must be a float32 scalar";
      // The loss stays on the device: piperun reads an iteration's losses at
      // its end (docs/runtime.md), so the forward never waits.
      out << "  if (call->loss) pk::copy(" << ptr(value) << ", sizeof(float), call->loss);\n";
    } else if (r == nn::Role::Loss) {
      out << "  if (call->loss) *call->loss = static_cast<float>(" << ptr(value) << "[0]);\n";
    } else if (r == nn::Role::BufferUpdate) {
      out << "  copyIfDistinct(call->params[" << paramIndex(name.getValue()) << "], " << ptr(value)
          << ", " << bytes << ");\n";
    } else if (r == nn::Role::Grad) {
      if (accumulatesIntoGradient(value))
        continue; // its producer accumulated into the gradient buffer
      out << "  accumulate(call->grad_params[" << paramIndex(name.getValue()) << "], "
          << ptr(value) << ", " << type.getNumElements() << ");\n";
    } else if (r == nn::Role::Param && isStep) {
      out << "  copyIfDistinct(opt->params[" << paramIndex(name.getValue()) << "], " << ptr(value)
          << ", " << bytes << ");\n";
    } else if (r == nn::Role::OptimizerState && isStep) {
      int within = pipe::resultStateOf(f, i) == pipe::OptimizerState::ExpAvgSq ? 1 : 0;
      out << "  copyIfDistinct(opt->state[" << trainedIndex(name.getValue()) * statePerParam + within
          << "], " << ptr(value) << ", " << bytes << ");\n";
    } else {
      return f.emitOpError("result #") << i << " has no role the " << targetName()
                                       << " code generator knows";
    }
  }
  if (graphed) {
    std::string work = body.substr(workStart);
    body.resize(workStart);
    out << "  thread_local pk::CallGraphs graphs(" << cStringLiteral(cName) << ");\n"
        << "  graphs.run(call, description, " << (drawsDropout ? "true" : "false")
        << ", [&](const uint64_t *callKey) {\n    (void)callKey;\n";
    SmallVector<StringRef> lines;
    StringRef(work).rtrim('\n').split(lines, '\n');
    for (StringRef line : lines)
      out << (line.empty() ? "" : "  ") << line << "\n";
    out << "  });\n";
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
       << choiceName(target.precision)
       << ")";
  os << ". Do not edit.\n";
  if (cuda()) {
    // Tensors are device memory; every call runs on the stream the runtime
    // passes, and only the loss is copied back to the host.
    os << "#include \"pipec/cuda_kernels.h\"\n#include \"pipec/cuda_row_norm.cuh\"\n#include \"pipec/binary_math.h\"\n"
       << "#include \"pipec/stage_abi.h\"\n\n"
       << "#include <algorithm>\n#include <cmath>\n#include <optional>\n#include <stdexcept>\n#include <string>\n\n"
       << "namespace pk = pipec::kernels::cuda;\n\nnamespace {\n\n"
       << "thread_local std::string lastError;\n\n"
       << "void copyIfDistinct(void *to, const void *from, size_t bytes) { pk::copy(from, bytes, to); }\n\n"
       << "double secondsNow() { return pk::profileClock(); }\n\n"
       << "void accumulate(void *to, const float *from, int64_t n) {\n"
       << "  pk::accumulate(static_cast<float *>(to), from, n);\n}\n\n";
  } else {
    os << "#include \"pipec/cpu_kernels.h\"\n#include \"pipec/binary_math.h\"\n#include \"pipec/stage_abi.h\"\n\n"
       << "#include <chrono>\n#include <cmath>\n#include <cstring>\n#include <new>\n#include <optional>\n#include <string>\n#include <vector>\n\n"
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

  // piperun --profile's clock around each op (emitOps), out of line: a
  // function then holds plain calls, not two branches per op, and the host
  // compiler's time stays linear in the ops (docs/optimization.md,
  // "Compiling the stage").
  os << "[[gnu::noinline, maybe_unused]] double opStarted(const pipec_call *call) {\n"
     << "  return call->timer ? secondsNow() : 0.0;\n}\n\n"
     << "[[gnu::noinline, maybe_unused]] void opTimed(const pipec_call *call, const char *node, int phase,\n"
     << "                                            double started) {\n"
     << "  if (call->timer) call->timer(call->timer_user, node, phase, secondsNow() - started);\n}\n\n"
     << "// An ONNX node an op absorbed: reported, its time in the op's.\n"
     << "[[gnu::noinline, maybe_unused]] void opAbsorbed(const pipec_call *call, const char *node, int phase) {\n"
     << "  if (call->timer) call->timer(call->timer_user, node, phase, 0.0);\n}\n\n"
     << "// The ops of a fused loop: its time split evenly among them.\n"
     << "[[gnu::noinline, maybe_unused]] void opShared(const pipec_call *call, const char *const *nodes, int count,\n"
     << "                                             int phase, double started) {\n"
     << "  if (!call->timer) return;\n"
     << "  const double share = (secondsNow() - started) / count;\n"
     << "  for (int i = 0; i < count; ++i) call->timer(call->timer_user, nodes[i], phase, share);\n}\n\n";

  for (StringRef name : {"fwd", "bwd_input", "bwd_weight", "step"})
    if (func::FuncOp f = function(name)) {
      if (auto size = f->getAttrOfType<IntegerAttr>(pipe::kArenaSizeAttrName))
        arenaBytes = std::max<int64_t>(arenaBytes, size.getInt());
      if (auto size = f->getAttrOfType<IntegerAttr>(pipe::kThreadScratchSizeAttrName))
        threadScratchBytes = std::max<int64_t>(threadScratchBytes, size.getInt());
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
  if (constantBytes && !constantBytes->empty())
    // The file's bytes, aligned for any element type; the label is local
    // to this object file and the C++ declaration hidden, so the reference
    // stays inside the library.
    // PIPEC_STAGE_DIR is the source's folder (pipec --build and the
    // generated CMakeLists.txt define it; else the assembler's directory).
    os << "#ifndef PIPEC_STAGE_DIR\n#define PIPEC_STAGE_DIR \".\"\n#endif\n"
       << "extern \"C\" __attribute__((visibility(\"hidden\"))) const char pipecStageConstants[];\n"
       << "__asm__(\".section .rodata\\n.balign 64\\npipecStageConstants:\\n.incbin \\\"\" PIPEC_STAGE_DIR \"/"
       << target.constantsFile << "\\\"\\n.previous\\n\");\n\n";
  os << constants << "\n" << kernels;
  // One arena for every entry point (they never run at the same time on a
  // rank: one thread, one stream), allocated on the first call and kept:
  // the planned values and kernel scratch, then on the CPU each kernel
  // thread's scratch (docs/optimization.md, "Kernel scratch"). The arena
  // holds nothing from one call to the next, so a thread count raised
  // between calls gets a larger one.
  os << "constexpr int64_t kArenaBytes = " << std::max<int64_t>(64, arenaBytes) << ";\n";
  if (cuda()) {
    os << "char *stageArena() {\n  static pk::DeviceBuffer<char> arena(kArenaBytes);\n"
       << "  return arena.data();\n}\n\n"
       << "pk::Workspace kernelScratch(int64_t offset, int64_t bytes) {\n"
       << "  return pk::Workspace{stageArena() + offset, bytes};\n}\n\n";
  } else {
    os << "constexpr int64_t kThreadScratchBytes = " << threadScratchBytes << ";\n"
       << "struct StageArena {\n  char *data = nullptr;\n  int threads = 0;\n};\n"
       << "StageArena arenaState;\n\n"
       << "char *stageArena() {\n"
       << "  const int threads = kThreadScratchBytes > 0 ? pk::threads() : 0;\n"
       << "  if (!arenaState.data || threads > arenaState.threads) {\n"
       << "    ::operator delete(arenaState.data, std::align_val_t(64));\n"
       << "    arenaState.data = static_cast<char *>(\n"
       << "        ::operator new(kArenaBytes + threads * kThreadScratchBytes, std::align_val_t(64)));\n"
       << "    arenaState.threads = threads;\n  }\n  return arenaState.data;\n}\n\n"
       << "pk::Workspace kernelScratch(int64_t offset, int64_t bytes) {\n"
       << "  return pk::Workspace{arenaState.data + offset, bytes, arenaState.data + kArenaBytes, "
          "kThreadScratchBytes,\n                       arenaState.threads};\n}\n\n";
  }

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
  os << dimsDefinitions << "\n" << functions;
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

} // namespace detail

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
                        raw_ostream &os, std::string *constantBytes) {
  assert((target.constantsFile.empty() || constantBytes) &&
         "a constants file needs somewhere to put its bytes");
  return detail::StageEmitter(stage, numStages, target, os, constantBytes).run();
}

} // namespace pipec::emit
