// A schema for JSON files as C++ structs (docs/plan-json.md): each struct's
// members are listed once, in a specialization of Schema<T>, and the one
// writer (encode) and the one reader (Reader::decode) both walk that list, so
// each key is spelled once and a file reads back into the struct that wrote
// it. plan.json (pipec/job_plan.h), checkpoint manifests
// (pipec/checkpoint_manifest.h), schedule.json (analysis/Schedule) and rank
// streams (pipec/rank_stream.h) are described this way.
//
// A list says of each member whether the file must have it (required) or
// the struct's value stands in for it (optional: a std::optional member is
// then left out, or written as null with Absent::Null; an empty string is
// left out). Values are strings, numbers, booleans, enums (their Choices<E>
// spellings, pipec/vocabulary.h), vectors and string-keyed maps of them,
// other schema structs and vectors of those. Header-only, in the runtime
// layer, so that every layer can describe its files with it.
#pragma once

#include "json_reader.h"
#include "vocabulary.h"

#include <nlohmann/json.hpp>

#include <map>
#include <optional>
#include <string>
#include <type_traits>
#include <vector>

namespace pipec::schema {

enum class Absent { Omit, Null };

/// Specialized once per struct of a file: `template <class V, class T>
/// static void members(V &v, T &value)` calling v.required / v.optional /
/// v.optionalWrittenIf / v.object for each member.
template <class T> struct Schema;

template <class T> struct IsOptional : std::false_type {};
template <class T> struct IsOptional<std::optional<T>> : std::true_type {};
template <class T> struct IsMap : std::false_type {};
template <class V> struct IsMap<std::map<std::string, V>> : std::true_type {};

/// A struct of the schema: one with a Schema<T> specialization.
template <class T, class = void> struct HasSchema : std::false_type {};
template <class T> struct HasSchema<T, std::void_t<decltype(sizeof(Schema<T>))>> : std::true_type {};
template <class T> constexpr bool kIsStruct = HasSchema<T>::value;
/// A list of schema structs (written as an array of objects).
template <class T> struct IsStructList : std::false_type {};
template <class E> struct IsStructList<std::vector<E>> : std::bool_constant<kIsStruct<E>> {};

/// Calls the member list of a struct of the schema with visitor v.
template <class V, class T> void visitMembers(V &v, T &x) { Schema<std::remove_const_t<T>>::members(v, x); }

template <class T> nlohmann::json encode(const T &value);

/// Writes each member into `out`.
struct Writer {
  nlohmann::json &out;
  template <class T> void required(const char *key, const T &value) { out[key] = encode(value); }
  template <class T> void optional(const char *key, const T &value, Absent absent = Absent::Omit) {
    if constexpr (IsOptional<T>::value) {
      if (value)
        out[key] = encode(*value);
      else if (absent == Absent::Null)
        out[key] = nullptr;
    } else if constexpr (std::is_same_v<T, std::string>) {
      if (!value.empty())
        out[key] = value;
    } else {
      out[key] = encode(value);
    }
  }
  template <class T> void optionalWrittenIf(bool written, const char *key, const T &value) {
    if (written)
      out[key] = encode(value);
  }
  template <class Members> void object(const char *key, Members &&inner) {
    nlohmann::json j = nlohmann::json::object();
    Writer w{j};
    inner(w);
    out[key] = std::move(j);
  }
};

template <class T> nlohmann::json encode(const T &value) {
  if constexpr (std::is_enum_v<T>) {
    return choiceName(value);
  } else if constexpr (kIsStruct<T>) {
    nlohmann::json j = nlohmann::json::object();
    Writer w{j};
    visitMembers(w, value);
    return j;
  } else if constexpr (IsStructList<T>::value) {
    nlohmann::json j = nlohmann::json::array();
    for (const auto &e : value)
      j.push_back(encode(e));
    return j;
  } else {
    return nlohmann::json(value);
  }
}

/// Reads each member from `in` (at JSON path `path`), with errors naming the
/// file and the path.
template <class Error> struct Reader {
  const json_io::Reader<Error> &file;
  const nlohmann::json &in;
  std::string path;

  std::string pathOf(const char *key) const { return path.empty() ? std::string(key) : path + "." + key; }
  bool has(const char *key) const { return in.is_object() && in.contains(key) && !in.at(key).is_null(); }

  template <class T> void required(const char *key, T &field) {
    if (!in.is_object() || !in.contains(key))
      throw Error(file.file + ": missing member " + pathOf(key));
    field = decode<T>(in.at(key), pathOf(key));
  }
  template <class T> void optional(const char *key, T &field, Absent = Absent::Omit) {
    if (!has(key))
      return;
    if constexpr (IsOptional<T>::value)
      field = decode<typename T::value_type>(in.at(key), pathOf(key));
    else
      field = decode<T>(in.at(key), pathOf(key));
  }
  template <class T> void optionalWrittenIf(bool, const char *key, T &field) { optional(key, field); }
  template <class Members> void object(const char *key, Members &&inner) {
    static const nlohmann::json empty = nlohmann::json::object();
    if (has(key) && !in.at(key).is_object())
      throw Error(file.file + ": member " + pathOf(key) + " has the wrong type (" + json_io::brief(in.at(key)) + ")");
    Reader sub{file, has(key) ? in.at(key) : empty, pathOf(key)};
    inner(sub);
  }

  template <class T> T decode(const nlohmann::json &v, const std::string &name) const {
    if constexpr (std::is_enum_v<T>) {
      const std::string text = file.template convert<std::string>(v, name);
      T value{};
      if (!parseChoice(text, value))
        throw Error(file.file + ": " + name + " must be " + choiceNames<T>(" or ") + ", is \"" + text + "\"");
      return value;
    } else if constexpr (kIsStruct<T>) {
      if (!v.is_object())
        throw Error(file.file + ": member " + name + " has the wrong type (" + json_io::brief(v) + ")");
      T value{};
      Reader sub{file, v, name};
      visitMembers(sub, value);
      return value;
    } else if constexpr (IsStructList<T>::value) {
      if (!v.is_array())
        throw Error(file.file + ": member " + name + " has the wrong type (" + json_io::brief(v) + ")");
      T out;
      for (size_t i = 0; i < v.size(); ++i)
        out.push_back(decode<typename T::value_type>(v[i], name + "[" + std::to_string(i) + "]"));
      return out;
    } else if constexpr (IsMap<T>::value) {
      if (!v.is_object())
        throw Error(file.file + ": member " + name + " has the wrong type (" + json_io::brief(v) + ")");
      T out;
      for (const auto &[key, item] : v.items())
        out[key] = file.template convert<typename T::mapped_type>(item, name + "." + key);
      return out;
    } else {
      return file.template convert<T>(v, name);
    }
  }
};

/// A value of a file (a schema struct, or a list of them) read by the schema
/// that wrote it; `name` is its path in the document (empty for the document
/// itself), which errors give after the file's name.
template <class T, class Error>
T fromJson(const json_io::Reader<Error> &file, const nlohmann::json &j, const std::string &name = "") {
  return Reader<Error>{file, j, ""}.template decode<T>(j, name);
}

} // namespace pipec::schema
