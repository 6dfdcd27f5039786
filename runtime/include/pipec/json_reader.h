// Typed reading of the job's JSON files (plan.json, rank streams, checkpoint
// manifests, schedule.json) with errors that name the file and the member's
// JSON path. One reader for every file and layer: the runtime reads with it,
// and so does the schedule library where it reads files back
// (docs/layers.md: a runtime header, included by the compiler's libraries).
//
// Integers must be JSON integers that fit the C++ type (nlohmann's get<int>
// would wrap 2^32+2 to 2 and truncate 2.5 to 2); floats must be finite in the
// C++ type. Header-only; `Error` is the including library's exception type
// (constructed from a std::string).
#pragma once

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <type_traits>
#include <vector>

namespace pipec::json_io {

/// A JSON value for a message: scalars as written (at most 80 characters),
/// arrays and objects by kind (dumping them could recurse as deep as the file
/// nests, or quote megabytes).
inline std::string brief(const nlohmann::json &v) {
  if (v.is_array()) return "an array of " + std::to_string(v.size()) + " elements";
  if (v.is_object()) return "an object";
  std::string s = v.dump();
  return s.size() > 80 ? s.substr(0, 77) + "..." : s;
}

template <class T> struct IsVector : std::false_type {};
template <class E> struct IsVector<std::vector<E>> : std::true_type {};

/// Reads members of one file (`file` names it in every message).
template <class Error> struct Reader {
  std::string file;

  /// `name`: the JSON path of v, for messages.
  template <class T> T convert(const nlohmann::json &v, const std::string &name) const {
    auto wrong = [&]() { return Error(file + ": member " + name + " has the wrong type (" + brief(v) + ")"); };
    if constexpr (std::is_integral_v<T> && !std::is_same_v<T, bool>) {
      if (!v.is_number_integer()) throw wrong();
      bool fits;
      if (v.is_number_unsigned())
        fits = v.template get<uint64_t>() <= (uint64_t)std::numeric_limits<T>::max();
      else {
        const int64_t i = v.template get<int64_t>();
        fits = std::is_signed_v<T> ? i >= (int64_t)std::numeric_limits<T>::min() &&
                                         (uint64_t)std::max<int64_t>(i, 0) <= (uint64_t)std::numeric_limits<T>::max()
                                   : i >= 0;
      }
      if (!fits) throw Error(file + ": member " + name + " is out of range (" + brief(v) + ")");
      return v.template get<T>();
    } else if constexpr (std::is_floating_point_v<T>) {
      if (!v.is_number()) throw wrong();
      const double d = v.template get<double>();
      if (!std::isfinite(d) || std::fabs(d) > (double)std::numeric_limits<T>::max())
        throw Error(file + ": member " + name + " is out of range (" + brief(v) + ")");
      return (T)d;
    } else if constexpr (IsVector<T>::value) {
      if (!v.is_array()) throw wrong();
      T out;
      for (size_t i = 0; i < v.size(); ++i)
        out.push_back(convert<typename T::value_type>(v[i], name + "[" + std::to_string(i) + "]"));
      return out;
    } else {
      try {
        return v.template get<T>();
      } catch (const nlohmann::json::exception &) {
        throw wrong();
      }
    }
  }

  /// Member `key` of object j (at JSON path `where`, "" for the top); missing is an error.
  template <class T> T get(const nlohmann::json &j, const char *key, const std::string &where) const {
    const std::string name = where.empty() ? std::string(key) : where + "." + key;
    if (!j.is_object() || !j.contains(key)) throw Error(file + ": missing member " + name);
    return convert<T>(j.at(key), name);
  }

  /// Member `key`, or `fallback` when it is absent or null.
  template <class T> T opt(const nlohmann::json &j, const char *key, const std::string &where, T fallback) const {
    if (!j.is_object() || !j.contains(key) || j.at(key).is_null()) return fallback;
    return get<T>(j, key, where);
  }
};

} // namespace pipec::json_io
