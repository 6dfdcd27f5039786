// Registers pipec's dialects and passes, for pipec and pipec-opt alike.
#ifndef PIPEC_COMPILER_DRIVER_REGISTRATION_H
#define PIPEC_COMPILER_DRIVER_REGISTRATION_H

namespace mlir {
class DialectRegistry;
}

namespace pipec {
void registerPipecDialects(mlir::DialectRegistry &registry);
void registerPipecPasses();
} // namespace pipec

#endif // PIPEC_COMPILER_DRIVER_REGISTRATION_H
