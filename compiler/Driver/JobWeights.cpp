#include "compiler/Driver/JobWeights.h"

#include "dialects/nn/NNDialect.h"
#include "runtime/include/pipec/stage_abi.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "llvm/Support/ErrorHandling.h"
#include "llvm/Support/raw_ostream.h"

#include "pipec/tensor_file.h"

#include <cstring>
#include <set>

using namespace mlir;

namespace pipec {

AbiDtype abiDtype(Type element) {
  if (element.isF32()) return {PIPEC_F32, "f32"};
  if (element.isF64()) return {PIPEC_F64, "f64"};
  if (element.isInteger(64)) return {PIPEC_I64, "i64"};
  if (element.isInteger(32)) return {PIPEC_I32, "i32"};
  assert(element.isInteger(1) && "the IR holds f32, f64, i64, i32 and i1 tensors only");
  return {PIPEC_BOOL, "bool"};
}

namespace {
/// Element `e` of `value` stored as `dtype` at `out` (the weights file's
/// bytes): floats rounded once from the initializer's value, integers exact.
void storeElement(const import::HostTensor &value, int64_t e, int dtype, unsigned char *out) {
  auto store = [out](auto converted) { std::memcpy(out, &converted, sizeof converted); };
  switch (dtype) {
  case PIPEC_F32: return store(static_cast<float>(value.asDouble(e)));
  case PIPEC_F64: return store(value.asDouble(e));
  case PIPEC_I64: return store(static_cast<int64_t>(value.asInt(e)));
  case PIPEC_I32: return store(static_cast<int32_t>(value.asInt(e)));
  case PIPEC_BOOL: return store(static_cast<uint8_t>(value.asInt(e) != 0));
  }
  llvm_unreachable("abiDtype gives the stage ABI's dtypes only");
}
} // namespace

std::vector<std::pair<std::string, RankedTensorType>> stageWeightTensors(pipe::StageOp stage) {
  std::vector<std::pair<std::string, RankedTensorType>> wanted;
  std::set<std::string> seen;
  stage.walk([&](func::FuncOp function) {
    for (unsigned i = 0; i < function.getNumArguments(); ++i) {
      std::optional<nn::Role> role = nn::argumentRole(function, i);
      auto name = function.getArgAttrOfType<StringAttr>(i, nn::kNameAttrName);
      if ((role != nn::Role::Param && role != nn::Role::Buffer) ||
          !seen.insert(name.str()).second)
        continue;
      wanted.emplace_back(name.str(), llvm::cast<RankedTensorType>(function.getArgument(i).getType()));
    }
  });
  return wanted;
}

uint64_t stageWeightBytes(pipe::StageOp stage) {
  uint64_t bytes = 0;
  for (const auto &[name, type] : stageWeightTensors(stage))
    bytes += static_cast<uint64_t>(type.getNumElements()) * io::dtypeSize(abiDtype(type.getElementType()).code);
  return bytes;
}

LogicalResult writeStageWeights(pipe::StageOp stage, import::InitializerReader &initial,
                                const std::filesystem::path &file, raw_ostream &errs,
                                const std::function<void(uint64_t)> &wrote) {
  // The stage's parameters and buffers (names and IR types) first: the file
  // announces its count, then each tensor is read, converted and written.
  const std::vector<std::pair<std::string, RankedTensorType>> wanted = stageWeightTensors(stage);
  // Elements converted per chunk: memory stays flat whatever the tensor.
  constexpr int64_t kChunkElements = 1 << 20;
  try {
    io::TensorFileWriter writer(file.string(), wanted.size());
    std::vector<unsigned char> bytes;
    for (const auto &[name, type] : wanted) {
      const int dtype = abiDtype(type.getElementType()).code;
      const size_t elementBytes = io::dtypeSize(dtype);
      writer.begin(name, dtype, std::vector<int64_t>(type.getShape().begin(), type.getShape().end()));
      bool read = initial.readChunks(name, kChunkElements, [&](const import::HostTensor &chunk) {
        bytes.resize(static_cast<size_t>(chunk.numElements()) * elementBytes);
        for (int64_t e = 0; e < chunk.numElements(); ++e)
          storeElement(chunk, e, dtype, bytes.data() + e * elementBytes);
        writer.data(reinterpret_cast<const char *>(bytes.data()), bytes.size());
        if (wrote)
          wrote(bytes.size());
      });
      if (!read) {
        for (const std::string &problem : initial.errors())
          errs << "error: " << problem << "\n";
        return failure();
      }
      writer.end(); // checks the initializer filled its parameter's shape
    }
    writer.finish();
  } catch (const std::exception &problem) {
    errs << "error: " << problem.what() << "\n";
    return failure();
  }
  return success();
}

} // namespace pipec
