// Binds the settings of an options struct (analysis/Settings/Settings.h) to
// llvm::cl options: a tool's command line (global options of some
// subcommands), a pass's options or a pass pipeline's (docs/settings.md).
// The options are created from the settings' declarations, so a setting's
// name, help and range are written once for `pipec`, its subcommands and
// `pipec-opt`; apply() copies what was given into the struct's fields,
// checked and typed.
#ifndef PIPEC_PASSES_OPTIONSBINDER_H
#define PIPEC_PASSES_OPTIONSBINDER_H

#include "analysis/Settings/Settings.h"

#include "mlir/Pass/Pass.h"
#include "mlir/Pass/PassOptions.h"
#include "llvm/Support/CommandLine.h"

#include <deque>
#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace pipec::passes {

class OptionsBinder final : public settings::Binder {
public:
  /// Global options of `subcommands` (listed under `category` by --help):
  /// a tool's command line. Usage errors read "--name value: reason".
  OptionsBinder(std::vector<llvm::cl::SubCommand *> subcommands, llvm::cl::OptionCategory &category);
  /// The options of a pass (`--pipec-partition="stages=2"`), or of a pass
  /// pipeline's options struct. Errors read "name=value: reason".
  explicit OptionsBinder(mlir::Pass &pass);
  explicit OptionsBinder(mlir::detail::PassOptions &options);
  ~OptionsBinder() override;

  /// Options created from now on belong to these subcommands and are listed
  /// under this category (command lines only).
  void setSubcommands(std::vector<llvm::cl::SubCommand *> subcommands) { subs = std::move(subcommands); }
  void setCategory(llvm::cl::OptionCategory &listedUnder) { category = &listedUnder; }

  /// Copies every given value into the fields bound to it, in binding order.
  /// Throws settings::SettingError naming the option as its user wrote it.
  void apply() const;

  void onFlag(const settings::Setting &setting, std::function<void(bool)> apply) override;
  void onInteger(const settings::IntSetting &setting, std::function<void(int64_t)> apply) override;
  void onReal(const settings::RealSetting &setting, std::function<void(double)> apply) override;
  void onText(const settings::Setting &setting, std::function<void(const std::string &)> apply) override;
  void onChoice(const settings::Setting &setting, const char *bare, const std::string &spellings,
                std::function<void(const std::string &)> apply) override;
private:
  enum class Mode { CommandLine, Pass, PassOptions };
  struct Bound;

  template <class T> Bound &option(const settings::Setting &setting, const std::string &help, bool valueOptional);
  /// The option bound to `setting` (created the first time), as its cl::opt<T>.
  template <class T> llvm::cl::opt<T> &reuseOrCreate(const settings::Setting &setting, const std::string &help,
                                                      bool valueOptional, Bound *&bound);
  Bound *find(const settings::Setting &setting);
  /// How the user wrote the option, for messages: "--name" or "name=".
  std::string spelled(const settings::Setting &setting, const std::string &value) const;

  Mode mode;
  std::vector<llvm::cl::SubCommand *> subs;
  llvm::cl::OptionCategory *category = nullptr;
  mlir::Pass *pass = nullptr;
  mlir::detail::PassOptions *passOptions = nullptr;
  std::vector<std::unique_ptr<Bound>> bound;
  std::deque<std::string> texts; // cl::desc keeps pointers
};

/// A pass (its TableGen base `PassBase`) whose options are one settings
/// struct `Options` (Options::bind), bound as the pass's textual options when
/// the pass is built (from typed options, createX(options), or defaults) or
/// copied (a pass manager copies its passes; MLIR then copies the options'
/// values in order). runOnOperation reads them with options().
template <class PassBase, class Options> class PassWithOptions : public PassBase {
public:
  explicit PassWithOptions(const Options &initial = {}) : bound(initial), binder(*this) { bound.bind(binder); }
  PassWithOptions(const PassWithOptions &other) : PassBase(other), bound(other.bound), binder(*this) {
    bound.bind(binder);
  }

protected:
  /// The options with the given textual ones applied, or failure after an
  /// error on the operation naming the option.
  mlir::FailureOr<Options> options() {
    try {
      binder.apply();
    } catch (const settings::SettingError &error) {
      this->getOperation()->emitError() << error.what();
      return mlir::failure();
    }
    return bound;
  }

private:
  Options bound; // the binder's fields: a pass is never moved, so their addresses hold
  OptionsBinder binder;
};

} // namespace pipec::passes

#endif
