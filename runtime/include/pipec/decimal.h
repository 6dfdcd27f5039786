// Whole decimal numbers as pipec's command lines take them (a seed): digits
// only (no sign, space, exponent or base prefix), at most 20 of them, and at
// most 2^64 - 1. One parser for piperun's and pipec's seeds; each caller says
// in its own words what was wrong.
#pragma once

#include <cstdint>
#include <optional>
#include <string_view>

namespace pipec {

inline std::optional<uint64_t> parseDecimalUint64(std::string_view text) {
  if (text.empty() || text.size() > 20)
    return std::nullopt;
  uint64_t value = 0;
  for (char digit : text) {
    if (digit < '0' || digit > '9' || value > (UINT64_MAX - uint64_t(digit - '0')) / 10)
      return std::nullopt;
    value = value * 10 + uint64_t(digit - '0');
  }
  return value;
}

} // namespace pipec
