// Every setting of pipec declared once: its name, help, value name and range
// (docs/settings.md). An options struct (the partition's, the planner's, the
// schedule command's, the cost model's, the code generator's) binds its fields
// to these declarations in one `bind(Binder &)`; a Binder attaches them to a
// command line (tools/) or to a pass's or pipeline's options (passes/), so
// that the same declaration, with the same checks, serves `pipec`, its
// subcommands, `pipec-opt` and every pass. Values reach the structs typed: a
// choice is its enum (pipec/vocabulary.h), a size is bytes.
//
// Plain C++17 (analysis layer): no llvm::cl here.
#ifndef PIPEC_ANALYSIS_SETTINGS_SETTINGS_H
#define PIPEC_ANALYSIS_SETTINGS_SETTINGS_H

#include "runtime/include/pipec/decimal.h"
#include "runtime/include/pipec/vocabulary.h"

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <functional>
#include <sstream>
#include <stdexcept>
#include <string>

namespace pipec::settings {

/// A value outside its setting's syntax or range. The binder that met it
/// names the setting the way its user wrote it (`--chunks`, `chunks=`).
struct SettingError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

/// What every setting declares.
struct Setting {
  const char *name;            ///< `--name` on a command line, `name=` in a pass option
  const char *help;
  const char *valueName = "";  ///< `<N>` in --help
  /// The values a table accepts (the device presets), appended to the help.
  std::string (*acceptedValues)() = nullptr;

  /// The help with the accepted values, as binders show it.
  std::string fullHelp() const { return acceptedValues ? std::string(help) + ": " + acceptedValues() : help; }
};
/// How a command line spells the setting ("--stages"): messages that name
/// an option build it from its declaration, so that the flag is spelled once.
inline std::string flag(const Setting &setting) { return std::string("--") + setting.name; }

/// A whole number in [min, max].
struct IntSetting : Setting {
  int64_t min, max;
};
/// A finite real number between min and max, each bound included unless open.
struct RealSetting : Setting {
  double min, max;
  bool minOpen = false, maxOpen = false;
};
/// One of an enum's spellings (Choices<E>, pipec/vocabulary.h). `bare` is the
/// value of the setting given without one (`--recompute`); nullptr: a value
/// is required.
template <class E> struct ChoiceSetting : Setting {
  const E *bare = nullptr;
};

/// Attaches settings to fields. Command lines and pass options implement it
/// (passes/OptionsBinder.h): each `on...` receives a setting and what to do
/// with its value, called only when the setting is given, after the value's
/// syntax and range are checked; a field keeps its struct's default
/// otherwise. Binding the same setting twice (the device of the cost model
/// and of the partition) sets both from one option.
class Binder {
public:
  virtual ~Binder() = default;

  virtual void onFlag(const Setting &setting, std::function<void(bool)> apply) = 0;
  virtual void onInteger(const IntSetting &setting, std::function<void(int64_t)> apply) = 0;
  virtual void onReal(const RealSetting &setting, std::function<void(double)> apply) = 0;
  /// Text: a file, a directory, or a value with a syntax of its own (`2x8`,
  /// `16GiB`) that `apply` checks and converts, throwing SettingError.
  virtual void onText(const Setting &setting, std::function<void(const std::string &)> apply) = 0;
  /// A choice reaches the binder as text; `apply` converts it (choice()).
  virtual void onChoice(const Setting &setting, const char *bare, const std::string &spellings,
                        std::function<void(const std::string &)> apply) = 0;

  void flag(const Setting &setting, bool &field) {
    onFlag(setting, [&field](bool value) { field = value; });
  }
  template <class Int> void integer(const IntSetting &setting, Int &field) {
    onInteger(setting, [&field](int64_t value) { field = static_cast<Int>(value); });
  }
  void real(const RealSetting &setting, double &field) {
    onReal(setting, [&field](double value) { field = value; });
  }
  void text(const Setting &setting, std::string &field) {
    onText(setting, [&field](const std::string &value) { field = value; });
  }
  /// A whole number from 0 to 2^64 - 1 (a seed), written in decimal.
  void unsigned64(const Setting &setting, uint64_t &field) {
    onText(setting, [&field](const std::string &text) {
      const std::optional<uint64_t> value = parseDecimalUint64(text);
      if (!value)
        throw SettingError("is not a whole number from 0 to 18446744073709551615");
      field = *value;
    });
  }
  template <class E, class Field> void choice(const ChoiceSetting<E> &setting, Field &field) {
    choiceThen(setting, std::function<void(E)>([&field](E value) { field = value; }));
  }
  template <class E> void choiceThen(const ChoiceSetting<E> &setting, std::function<void(E)> apply) {
    onChoice(setting, setting.bare ? choiceName(*setting.bare) : nullptr, choiceNames<E>(),
             [apply = std::move(apply)](const std::string &text) { apply(parse<E>(text)); });
  }

  /// The spelling's enumerator, or SettingError listing the spellings.
  template <class E> static E parse(const std::string &text) {
    E value{};
    if (!parseChoice(text, value))
      throw SettingError("expected " + choiceNames<E>(" or "));
    return value;
  }
};

/// Runs a given setting's appliers. A SettingError (a value's syntax or
/// range) gets `spelled` in front, how the user wrote it ("--chunks 99",
/// "pipec-partition: chunks=99"); the analysis layer's own parsers (`2x8`,
/// `16GiB`) already name the flag and keep their message. The one place every
/// binder reports a bad value.
template <class Apply> void applyNamed(const std::string &spelled, Apply &&apply) {
  try {
    apply();
  } catch (const SettingError &error) {
    throw SettingError(spelled + ": " + error.what());
  } catch (const std::runtime_error &error) {
    throw SettingError(error.what());
  }
}

/// Throws SettingError unless `value` is within the setting's range: the one
/// range check of every binder.
inline void checkRange(const IntSetting &setting, int64_t value) {
  if (value < setting.min || value > setting.max)
    throw SettingError("must be between " + std::to_string(setting.min) + " and " + std::to_string(setting.max));
}
inline void checkRange(const RealSetting &setting, double value) {
  const bool aboveMin = setting.minOpen ? value > setting.min : value >= setting.min;
  const bool belowMax = setting.maxOpen ? value < setting.max : value <= setting.max;
  if (std::isfinite(value) && aboveMin && belowMax)
    return;
  std::ostringstream os;
  if (setting.minOpen && setting.min == 0) // a rate, a time: say it in words
    os << "must be positive, finite and " << (setting.maxOpen ? "under " : "at most ") << setting.max;
  else
    os << "must be finite and in " << (setting.minOpen ? "(" : "[") << setting.min << ", " << setting.max
       << (setting.maxOpen ? ")" : "]");
  throw SettingError(os.str());
}

/// A setting's text as a whole number (decimal digits, an optional '-'),
/// range-checked; the one syntax of integer settings in every binder.
inline int64_t parseInteger(const IntSetting &setting, const std::string &text) {
  const size_t first = !text.empty() && text[0] == '-' ? 1 : 0;
  bool digits = text.size() > first && text.size() - first <= 18;
  for (size_t i = first; i < text.size(); ++i)
    digits = digits && text[i] >= '0' && text[i] <= '9';
  if (!digits)
    throw SettingError("expected an integer between " + std::to_string(setting.min) + " and " +
                       std::to_string(setting.max));
  const int64_t value = std::stoll(text);
  checkRange(setting, value);
  return value;
}
/// A setting's text as a real number (all of it), range-checked.
inline double parseReal(const RealSetting &setting, const std::string &text) {
  char *end = nullptr;
  const double value = std::strtod(text.c_str(), &end);
  if (text.empty() || *end != '\0')
    throw SettingError("expected a number");
  checkRange(setting, value);
  return value;
}

} // namespace pipec::settings

#endif
