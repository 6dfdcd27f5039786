#ifndef PIPEC_PARTITION_ERROR_H
#define PIPEC_PARTITION_ERROR_H

#include <stdexcept>
#include <string>

namespace pipec::partition {

/// Every user-facing failure of the partition library (bad CSV, bad topology,
/// infeasible memory, bad partition file). The message is complete: it names
/// the file or flag, the line where one applies, and the reason.
class Error : public std::runtime_error {
public:
  explicit Error(const std::string &message) : std::runtime_error(message) {}
};

/// No partition fits the memory limit: the one failure a larger micro-batch
/// cannot cure (memory per device does not fall as the micro-batch grows).
class MemoryShortfall : public Error {
public:
  using Error::Error;
};

} // namespace pipec::partition

#endif
