// Reading the small user files the partition library and the cost pass parse
// (cost tables, cluster files, partition/plan files, profiles): regular files
// only, size-bounded before reading (pipec/input_file.h), JSON nesting bounded,
// every failure an Error naming the file and the reason (docs/security.md).
#ifndef PIPEC_PARTITION_INPUTFILES_H
#define PIPEC_PARTITION_INPUTFILES_H

#include <nlohmann/json.hpp>

#include <cstdint>
#include <string>

namespace pipec::partition {

/// Size limits of these files: far above any real one (a cost table of a
/// million ops is about 100 MiB), far below what would exhaust memory.
inline constexpr uint64_t kMaxCostTableFileBytes = 256ull << 20;
inline constexpr uint64_t kMaxJsonFileBytes = 16ull << 20;
/// JSON nesting deeper than this is refused (the formats need at most 4).
inline constexpr int kMaxJsonDepth = 32;

/// The whole content of `path`; `what` names the file's role ("cluster file").
/// Throws Error("PATH: <what> is a directory, not a regular file", ...).
std::string readUserFile(const std::string &path, const char *what, uint64_t maxBytes);

/// Parses JSON text read from `file`; throws Error("FILE: malformed JSON: ...")
/// or Error("FILE: JSON nested deeper than 32 levels").
nlohmann::json parseUserJson(const std::string &text, const std::string &file);

/// readUserFile + parseUserJson with kMaxJsonFileBytes.
nlohmann::json readUserJsonFile(const std::string &path, const char *what);

} // namespace pipec::partition

#endif
