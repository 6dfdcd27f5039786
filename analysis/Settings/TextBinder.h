// Settings from (flag, value) text pairs, as a command line gives them, in
// plain C++: the binder of the analysis layer's tests and fuzzers, which speak
// in arguments. It checks values with the same functions as the llvm::cl
// binder (passes/OptionsBinder.h): parseInteger, parseReal, Binder::parse.
#ifndef PIPEC_ANALYSIS_SETTINGS_TEXTBINDER_H
#define PIPEC_ANALYSIS_SETTINGS_TEXTBINDER_H

#include "analysis/Settings/Settings.h"

#include <utility>
#include <vector>

namespace pipec::settings {

using Arguments = std::vector<std::pair<std::string, std::string>>; // ("--stages", "2"); "" for a bare flag

class TextBinder final : public Binder {
public:
  void onFlag(const Setting &setting, std::function<void(bool)> apply) override {
    add(setting, /*valueAttachedOnly=*/true, [apply = std::move(apply)](const std::string &text) {
      if (text.empty() || text == "true")
        apply(true);
      else if (text == "false")
        apply(false);
      else
        throw SettingError("expected true or false");
    });
  }
  void onInteger(const IntSetting &setting, std::function<void(int64_t)> apply) override {
    add(setting, false, [&setting, apply = std::move(apply)](const std::string &text) {
      apply(parseInteger(setting, text));
    });
  }
  void onReal(const RealSetting &setting, std::function<void(double)> apply) override {
    add(setting, false, [&setting, apply = std::move(apply)](const std::string &text) {
      apply(parseReal(setting, text));
    });
  }
  void onText(const Setting &setting, std::function<void(const std::string &)> apply) override {
    add(setting, false, std::move(apply));
  }
  void onChoice(const Setting &setting, const char *bare, const std::string &,
                std::function<void(const std::string &)> apply) override {
    add(setting, bare != nullptr, [bare, apply = std::move(apply)](const std::string &text) {
      apply(text.empty() && bare ? std::string(bare) : text);
    });
  }

  /// Applies each argument in order. Throws SettingError("--name value: reason").
  void apply(const Arguments &arguments) const {
    for (const auto &argument : arguments) {
      // Named, not structured bindings: a lambda may not capture those in C++17.
      const std::string &flag = argument.first, &value = argument.second;
      const Bound *bound = find(flag);
      if (!bound)
        throw SettingError("unknown option '" + flag + "'");
      applyNamed(flag + (value.empty() ? "" : " " + value), [&] {
        for (const auto &applier : bound->appliers)
          applier(value);
      });
    }
  }

  /// Splits command-line tokens into arguments as llvm::cl does: "--name=value",
  /// "--name value", or a bare "--name" for a flag or a choice with a bare
  /// value (whose value, if any, must be attached with '='). Throws
  /// SettingError for an unknown option or a missing value.
  Arguments split(const std::vector<std::string> &tokens) const {
    Arguments arguments;
    for (size_t i = 0; i < tokens.size(); ++i) {
      const std::string &token = tokens[i];
      const size_t equals = token.find('=');
      if (equals != std::string::npos) {
        arguments.emplace_back(token.substr(0, equals), token.substr(equals + 1));
        continue;
      }
      const Bound *b = find(token);
      if (!b)
        throw SettingError("unknown option '" + token + "'");
      if (b->valueAttachedOnly)
        arguments.emplace_back(token, "");
      else if (i + 1 < tokens.size())
        arguments.emplace_back(token, tokens[++i]);
      else
        throw SettingError(token + ": missing value");
    }
    return arguments;
  }

private:
  struct Bound {
    const Setting *setting;
    bool valueAttachedOnly; // a flag, or a choice with a bare value
    std::vector<std::function<void(const std::string &)>> appliers;
  };
  const Bound *find(const std::string &flag) const {
    for (const Bound &b : bound)
      if (flag == "--" + std::string(b.setting->name))
        return &b;
    return nullptr;
  }
  void add(const Setting &setting, bool valueAttachedOnly, std::function<void(const std::string &)> applier) {
    for (Bound &b : bound)
      if (std::string(b.setting->name) == setting.name) {
        b.appliers.push_back(std::move(applier));
        return;
      }
    bound.push_back({&setting, valueAttachedOnly, {std::move(applier)}});
  }
  std::vector<Bound> bound;
};

/// Binds `options` (its bind()), then applies `arguments`. A bad value or
/// an unknown flag throws `Error` (the library's own exception type, by
/// default SettingError) with the message naming the flag.
template <class Error = SettingError, class Options>
void applyArguments(Options &options, const Arguments &arguments) {
  TextBinder binder;
  try {
    options.bind(binder);
    binder.apply(arguments);
  } catch (const SettingError &error) {
    throw Error(error.what());
  }
}
/// The same from command-line tokens ("--stages", "2", "--async", "--recompute=auto").
template <class Error = SettingError, class Options>
void applyTokens(Options &options, const std::vector<std::string> &tokens) {
  TextBinder binder;
  try {
    options.bind(binder);
    binder.apply(binder.split(tokens));
  } catch (const SettingError &error) {
    throw Error(error.what());
  }
}

} // namespace pipec::settings

#endif
