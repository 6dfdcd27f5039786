#include "passes/JsonResource.h"

#include "mlir/IR/AsmState.h"
#include "mlir/IR/BuiltinAttributes.h"
#include "mlir/IR/BuiltinTypes.h"

#include <nlohmann/json.hpp>

using namespace mlir;

namespace pipec::passes {

Attribute jsonResource(MLIRContext *context, StringRef key, const nlohmann::json &document) {
  const std::string text = document.dump();
  auto type = RankedTensorType::get({static_cast<int64_t>(text.size())}, IntegerType::get(context, 8));
  AsmResourceBlob blob = HeapAsmResourceBlob::allocateAndCopyInferAlign(ArrayRef<char>(text.data(), text.size()));
  return DenseI8ResourceElementsAttr::get(type, key, std::move(blob));
}

FailureOr<nlohmann::json> jsonFromResource(Attribute attribute, std::string &problem) {
  auto resource = llvm::dyn_cast<DenseI8ResourceElementsAttr>(attribute);
  if (!resource || resource.getType().getRank() != 1) {
    problem = "is not a dense_resource of i8 (a JSON document's text)";
    return failure();
  }
  std::optional<ArrayRef<int8_t>> bytes = resource.tryGetAsArrayRef();
  if (!bytes) {
    problem = "its resource blob is missing (the IR was printed with resources elided)";
    return failure();
  }
  nlohmann::json document = nlohmann::json::parse(reinterpret_cast<const char *>(bytes->data()),
                                                  reinterpret_cast<const char *>(bytes->data()) + bytes->size(),
                                                  nullptr, /*allow_exceptions=*/false);
  if (document.is_discarded()) {
    problem = "its text is not a JSON document";
    return failure();
  }
  return document;
}

} // namespace pipec::passes
