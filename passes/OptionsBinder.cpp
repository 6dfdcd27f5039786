#include "passes/OptionsBinder.h"

#include <cassert>
#include <typeinfo>

namespace cl = llvm::cl;

namespace pipec::passes {

struct OptionsBinder::Bound {
  const settings::Setting *setting;
  std::shared_ptr<void> owner; // the option, whatever its type
  void *typed = nullptr;       // the option as its cl::opt<T> base
  const std::type_info *type = nullptr; // T
  std::function<bool()> given;
  std::function<std::string()> text; // the given value, for messages
  std::vector<std::function<void()>> appliers;
};

namespace {
/// cl modifier: registers the option in several subcommands (cl::sub takes one).
struct InSubcommands {
  const std::vector<cl::SubCommand *> &subs;
  template <class Opt> void apply(Opt &option) const {
    for (cl::SubCommand *sub : subs)
      option.addSubCommand(*sub);
  }
};

/// An option's value as messages show it (options are strings or flags).
std::string valueText(const std::string &value) { return value; }
std::string valueText(bool value) { return value ? "true" : "false"; }

/// A pass pipeline prints every option, the ones never given as `name=`:
/// read back, that text leaves the setting unset, so that a printed pipeline
/// (a reproducer, --dump-pass-pipeline) parses to the same passes.
bool isUnsetText(const std::string &value) { return value.empty(); }
bool isUnsetText(bool) { return false; }
} // namespace

OptionsBinder::OptionsBinder(std::vector<cl::SubCommand *> subcommands, cl::OptionCategory &category)
    : mode(Mode::CommandLine), subs(std::move(subcommands)), category(&category) {}
OptionsBinder::OptionsBinder(mlir::Pass &pass) : mode(Mode::Pass), pass(&pass) {}
OptionsBinder::OptionsBinder(mlir::detail::PassOptions &options)
    : mode(Mode::PassOptions), passOptions(&options) {}
OptionsBinder::~OptionsBinder() = default;

std::string OptionsBinder::spelled(const settings::Setting &setting, const std::string &value) const {
  if (mode == Mode::CommandLine)
    return "--" + std::string(setting.name) + (value.empty() ? "" : " " + value);
  const std::string option = std::string(setting.name) + "=" + value;
  return mode == Mode::Pass ? pass->getArgument().str() + ": " + option : option;
}

OptionsBinder::Bound *OptionsBinder::find(const settings::Setting &setting) {
  for (auto &b : bound)
    if (llvm::StringRef(b->setting->name) == setting.name)
      return b.get();
  return nullptr;
}

template <class T>
OptionsBinder::Bound &OptionsBinder::option(const settings::Setting &setting, const std::string &help,
                                            bool valueOptional) {
  texts.push_back(help);
  cl::desc desc(texts.back());
  auto b = std::make_unique<Bound>();
  b->setting = &setting;
  auto finish = [&](auto option, std::function<bool()> given) {
    if (valueOptional)
      option->setValueExpectedFlag(cl::ValueOptional);
    if (*setting.valueName && !std::is_same_v<T, bool>)
      option->setValueStr(setting.valueName);
    auto *raw = option.get();
    b->owner = option;
    b->typed = static_cast<cl::opt<T> *>(raw);
    b->type = &typeid(T);
    b->given = std::move(given);
    b->text = [raw] { return valueText(raw->getValue()); };
  };
  switch (mode) {
  case Mode::CommandLine: {
    auto option = std::make_shared<cl::opt<T>>(llvm::StringRef(setting.name), desc, cl::cat(*category), InSubcommands{subs});
    auto *raw = option.get();
    finish(option, [raw] { return raw->getNumOccurrences() > 0; });
    break;
  }
  case Mode::Pass: {
    auto option = std::make_shared<mlir::Pass::Option<T>>(*pass, setting.name, desc);
    auto *raw = option.get();
    finish(option, [raw] { return raw->hasValue() && !isUnsetText(raw->getValue()); });
    break;
  }
  case Mode::PassOptions: {
    auto option = std::make_shared<mlir::detail::PassOptions::Option<T>>(*passOptions, setting.name, desc);
    auto *raw = option.get();
    finish(option, [raw] { return raw->hasValue() && !isUnsetText(raw->getValue()); });
    break;
  }
  }
  bound.push_back(std::move(b));
  return *bound.back();
}

void OptionsBinder::apply() const {
  for (const auto &b : bound) {
    if (!b->given())
      continue;
    settings::applyNamed(spelled(*b->setting, b->text()), [&] {
      for (const auto &applier : b->appliers)
        applier();
    });
  }
}

// A setting bound a second time (the device of the cost model and of the
// partition) gets another applier on the same option; the declaration is the
// same object, so the option's type is too.
template <class T>
cl::opt<T> &OptionsBinder::reuseOrCreate(const settings::Setting &setting, const std::string &help,
                                         bool valueOptional, Bound *&b) {
  b = find(setting);
  if (!b)
    b = &option<T>(setting, help, valueOptional);
  assert(b->type == &typeid(T) && "a setting is bound as one kind of value everywhere");
  return *static_cast<cl::opt<T> *>(b->typed);
}

void OptionsBinder::onFlag(const settings::Setting &setting, std::function<void(bool)> apply) {
  Bound *b;
  auto &opt = reuseOrCreate<bool>(setting, setting.fullHelp(), false, b);
  b->appliers.push_back([&opt, apply = std::move(apply)] { apply(opt.getValue()); });
}

// Numbers are read as text and parsed by the settings' own functions, so
// that every binder accepts the same syntax and says the same thing.
void OptionsBinder::onInteger(const settings::IntSetting &setting, std::function<void(int64_t)> apply) {
  Bound *b;
  auto &opt = reuseOrCreate<std::string>(setting, setting.fullHelp(), false, b);
  b->appliers.push_back(
      [&opt, &setting, apply = std::move(apply)] { apply(settings::parseInteger(setting, opt.getValue())); });
}

void OptionsBinder::onReal(const settings::RealSetting &setting, std::function<void(double)> apply) {
  Bound *b;
  auto &opt = reuseOrCreate<std::string>(setting, setting.fullHelp(), false, b);
  b->appliers.push_back(
      [&opt, &setting, apply = std::move(apply)] { apply(settings::parseReal(setting, opt.getValue())); });
}

void OptionsBinder::onText(const settings::Setting &setting, std::function<void(const std::string &)> apply) {
  Bound *b;
  auto &opt = reuseOrCreate<std::string>(setting, setting.fullHelp(), false, b);
  b->appliers.push_back([&opt, apply = std::move(apply)] { apply(opt.getValue()); });
}

void OptionsBinder::onChoice(const settings::Setting &setting, const char *bare, const std::string &spellings,
                             std::function<void(const std::string &)> apply) {
  // The spellings come from the enum's one table (pipec/vocabulary.h).
  Bound *b;
  auto &opt = reuseOrCreate<std::string>(setting, std::string(setting.help) + " (" + spellings + ")", bare, b);
  b->appliers.push_back([&opt, bare, apply = std::move(apply)] {
    const std::string &text = opt.getValue();
    apply(text.empty() && bare ? std::string(bare) : text);
  });
}

} // namespace pipec::passes
