#include "analysis/Partition/InputFiles.h"

#include "analysis/Partition/Error.h"
#include "runtime/include/pipec/input_file.h"

namespace pipec::partition {

std::string readUserFile(const std::string &path, const char *what, uint64_t maxBytes) {
  if (path.empty())
    throw Error(std::string("empty path for the ") + what);
  try {
    return io::readInputFile(path, what, maxBytes);
  } catch (const io::InputError &error) {
    throw Error(error.what());
  }
}

nlohmann::json parseUserJson(const std::string &text, const std::string &file) {
  // Nesting is checked by a linear scan first: nlohmann's parse callback would
  // do it too, but its DOM builder then turns quadratic on long arrays of objects.
  int depth = 0;
  bool inString = false, escaped = false;
  for (char c : text) {
    if (inString) {
      if (escaped)
        escaped = false;
      else if (c == '\\')
        escaped = true;
      else if (c == '"')
        inString = false;
    } else if (c == '"') {
      inString = true;
    } else if (c == '[' || c == '{') {
      if (++depth > kMaxJsonDepth)
        throw Error(file + ": JSON nested deeper than " + std::to_string(kMaxJsonDepth) + " levels");
    } else if (c == ']' || c == '}') {
      --depth;
    }
  }
  try {
    return nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception &e) {
    throw Error(file + ": malformed JSON: " + e.what());
  }
}

nlohmann::json readUserJsonFile(const std::string &path, const char *what) {
  return parseUserJson(readUserFile(path, what, kMaxJsonFileBytes), path);
}

} // namespace pipec::partition
