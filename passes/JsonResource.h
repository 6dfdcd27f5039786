// JSON documents carried on the module as resource blobs, so that a pass can
// leave a structured result for a later pass or the job writer (the
// planner's plan.json document and the schedule: docs/layers.md, "The job as
// a product of the pipeline"). The attribute is a `dense_resource` of i8
// holding the document's text: printed IR shows a short handle
// (`dense_resource<pipe_schedule> : tensor<51234xi8>`) and the bytes in the
// file's resource section at its end (elided when printing with a limit),
// which the parser reads back.
#ifndef PIPEC_PASSES_JSONRESOURCE_H
#define PIPEC_PASSES_JSONRESOURCE_H

#include "mlir/IR/Attributes.h"
#include "mlir/Support/LLVM.h"

#include <nlohmann/json_fwd.hpp>

#include <string>

namespace mlir {
class MLIRContext;
}

namespace pipec::passes {

/// `document` as a resource attribute whose blob is named after `key`.
mlir::Attribute jsonResource(mlir::MLIRContext *context, llvm::StringRef key, const nlohmann::json &document);

/// The document a jsonResource attribute holds; failure with `problem` set
/// when the attribute is of another kind, its blob is missing (elided when
/// the IR was printed) or its text is not JSON.
mlir::FailureOr<nlohmann::json> jsonFromResource(mlir::Attribute attribute, std::string &problem);

} // namespace pipec::passes

#endif
