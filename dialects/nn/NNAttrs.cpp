// The `nn` attributes (NNAttrs.td): the kinds of pipec/vocabulary.h's tables
// as typed attributes, and `nn.role` on function arguments and results.
#include "dialects/nn/NNDialect.h"

#include "mlir/IR/Builders.h"
#include "mlir/IR/DialectImplementation.h"
#include "mlir/Interfaces/FunctionInterfaces.h"
#include "llvm/ADT/TypeSwitch.h"

using namespace mlir;
using namespace pipec::nn;

// A vocabulary kind reads and prints as its table spelling.
namespace {
/// Parses a keyword or string that `parse` knows; the error lists the table's
/// spellings.
template <typename Kind, typename Row, int N>
FailureOr<Kind> parseTableKind(AsmParser &parser, const char *what, const Row (&rows)[N],
                               bool (*parse)(std::string_view, Kind &)) {
  SMLoc where = parser.getCurrentLocation();
  std::string spelling;
  if (failed(parser.parseKeywordOrString(&spelling)))
    return failure();
  Kind kind;
  if (!parse(spelling, kind))
    return parser.emitError(where, "unknown ")
           << what << " '" << spelling << "' (" << ::pipec::spellingList(rows) << ")";
  return kind;
}
} // namespace

namespace mlir {
template <> struct FieldParser<::pipec::Unary> {
  static FailureOr<::pipec::Unary> parse(AsmParser &parser) {
    return parseTableKind(parser, "unary function", ::pipec::kUnaryFunctions, ::pipec::parseUnary);
  }
};
template <> struct FieldParser<::pipec::BinaryGradient> {
  static FailureOr<::pipec::BinaryGradient> parse(AsmParser &parser) {
    return parseTableKind(parser, "binary gradient", ::pipec::kBinaryGradients,
                          ::pipec::parseBinaryGradient);
  }
};
} // namespace mlir

namespace pipec {
static llvm::raw_ostream &operator<<(llvm::raw_ostream &os, Unary unary) {
  return os << unaryName(unary);
}
static llvm::raw_ostream &operator<<(llvm::raw_ostream &os, BinaryGradient gradient) {
  return os << binaryGradientName(gradient);
}
} // namespace pipec

#include "dialects/nn/NNEnums.cpp.inc"
#define GET_ATTRDEF_CLASSES
#include "dialects/nn/NNAttrs.cpp.inc"

void NNDialect::registerAttributes() {
  addAttributes<
#define GET_ATTRDEF_LIST
#include "dialects/nn/NNAttrs.cpp.inc"
      >();
}

namespace {
std::string roleSpellings() {
  std::string list;
  for (uint32_t value = 0; value <= getMaxEnumValForRole(); ++value)
    list += (list.empty() ? "" : ", ") + stringifyRole(static_cast<Role>(value)).str();
  return list;
}

/// `nn.role` must be a role and `nn.name` a string wherever they appear.
LogicalResult verifyFunctionAttribute(Operation *op, StringRef what, unsigned index,
                                      NamedAttribute attribute) {
  if (attribute.getName() == kRoleAttrName && !llvm::isa<RoleAttr>(attribute.getValue()))
    return op->emitOpError() << what << " #" << index << ": nn.role must be a #nn.role<...> ("
                             << roleSpellings() << "), got " << attribute.getValue();
  if (attribute.getName() == kNameAttrName && !llvm::isa<StringAttr>(attribute.getValue()))
    return op->emitOpError() << what << " #" << index << ": nn.name must be a string, got "
                             << attribute.getValue();
  return success();
}
} // namespace

LogicalResult NNDialect::verifyRegionArgAttribute(Operation *op, unsigned, unsigned index,
                                                  NamedAttribute attribute) {
  return verifyFunctionAttribute(op, "argument", index, attribute);
}

LogicalResult NNDialect::verifyRegionResultAttribute(Operation *op, unsigned, unsigned index,
                                                     NamedAttribute attribute) {
  return verifyFunctionAttribute(op, "result", index, attribute);
}

namespace pipec::nn {

std::optional<Role> argumentRole(FunctionOpInterface function, unsigned index) {
  if (auto role = function.getArgAttrOfType<RoleAttr>(index, kRoleAttrName))
    return role.getValue();
  return std::nullopt;
}

std::optional<Role> resultRole(FunctionOpInterface function, unsigned index) {
  if (auto role = function.getResultAttrOfType<RoleAttr>(index, kRoleAttrName))
    return role.getValue();
  return std::nullopt;
}

std::optional<int64_t> microbatchSize(FunctionOpInterface function) {
  for (unsigned i = 0; i < function.getNumArguments(); ++i) {
    const std::optional<Role> role = argumentRole(function, i);
    if (role != Role::Input && role != Role::Label)
      continue;
    if (auto type = llvm::dyn_cast<RankedTensorType>(function.getArgumentTypes()[i]))
      return type.getRank() ? type.getDimSize(0) : 1;
  }
  return std::nullopt;
}

void setArgumentRole(FunctionOpInterface function, unsigned index, Role role) {
  function.setArgAttr(index, kRoleAttrName, RoleAttr::get(function->getContext(), role));
}

void setResultRole(FunctionOpInterface function, unsigned index, Role role) {
  function.setResultAttr(index, kRoleAttrName, RoleAttr::get(function->getContext(), role));
}

NamedAttribute roleAttribute(MLIRContext *context, Role role) {
  return NamedAttribute(StringAttr::get(context, kRoleAttrName), RoleAttr::get(context, role));
}

} // namespace pipec::nn
