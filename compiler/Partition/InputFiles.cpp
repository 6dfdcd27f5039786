#include "compiler/Partition/InputFiles.h"

#include "compiler/Partition/Error.h"
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

namespace {
struct TooDeep {};
} // namespace

nlohmann::json parseUserJson(const std::string &text, const std::string &file) {
  nlohmann::json::parser_callback_t limitDepth = [](int depth, nlohmann::json::parse_event_t,
                                                     nlohmann::json &) -> bool {
    if (depth > kMaxJsonDepth)
      throw TooDeep{};
    return true;
  };
  try {
    return nlohmann::json::parse(text, limitDepth);
  } catch (const TooDeep &) {
    throw Error(file + ": JSON nested deeper than " + std::to_string(kMaxJsonDepth) + " levels");
  } catch (const nlohmann::json::exception &e) {
    throw Error(file + ": malformed JSON: " + e.what());
  }
}

nlohmann::json readUserJsonFile(const std::string &path, const char *what) {
  return parseUserJson(readUserFile(path, what, kMaxJsonFileBytes), path);
}

} // namespace pipec::partition
