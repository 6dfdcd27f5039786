// The settings' binders (docs/settings.md): the plain-C++ TextBinder and the
// llvm::cl OptionsBinder read the same declarations with the same checks, and
// a pass's options survive the pass manager's copies and print back to text
// that parses to the same pass.
#include "analysis/Planner/Planner.h"
#include "analysis/Settings/Declared.h"
#include "analysis/Settings/TextBinder.h"
#include "compiler/Driver/Registration.h"
#include "passes/Passes.h"

#include "mlir/IR/DialectRegistry.h"
#include "mlir/IR/MLIRContext.h"
#include "mlir/Pass/PassManager.h"
#include "mlir/Pass/PassRegistry.h"
#include "llvm/Support/raw_ostream.h"

#include <gtest/gtest.h>

#include <random>

namespace {

using pipec::settings::Arguments;
using pipec::settings::SettingError;

std::string errorOf(const std::vector<std::string> &tokens) {
  pipec::planner::Request request;
  try {
    pipec::settings::applyTokens(request, tokens);
  } catch (const SettingError &error) {
    return error.what();
  }
  return "";
}

TEST(TextBinder, FillsTheTypedRequest) {
  pipec::planner::Request request;
  pipec::settings::applyTokens(request, {"--gpus", "2x4", "--stages=3", "--microbatches", "8", "--schedule", "zb-v", "--chunks",
                                "2", "--async", "--recompute", "--vertical-sync", "--plan-rank", "2"});
  EXPECT_EQ(request.partition.gpus, "2x4");
  EXPECT_EQ(request.partition.options.forcedStages, 3);
  EXPECT_EQ(request.partition.microbatches, std::optional(8));
  EXPECT_EQ(request.schedule, pipec::ScheduleKind::ZbV);
  EXPECT_EQ(request.chunks, std::optional(2));
  EXPECT_TRUE(request.partition.options.asynchronous);
  EXPECT_EQ(request.partition.recomputeMode, std::optional(pipec::RecomputeMode::All)); // bare: the declared bare value
  EXPECT_TRUE(request.verticalSync);
  EXPECT_EQ(request.rank, std::optional(2));
  // Left alone, a field keeps its struct's default.
  EXPECT_EQ(request.candidates, pipec::planner::Request().candidates);
}

TEST(TextBinder, RefusesEachBadValueNamingTheFlag) {
  EXPECT_EQ(errorOf({"--chunks", "99"}), "--chunks 99: must be between 1 and 64");
  EXPECT_EQ(errorOf({"--chunks", "2.0"}), "--chunks 2.0: expected an integer between 1 and 64");
  EXPECT_EQ(errorOf({"--schedule", "zb-h9"}),
            "--schedule zb-h9: expected gpipe, 1f1b, 1f1b-rr, interleaved, zb-h1, zb-h2, zb-v, zb-interleaved, dualpipev, csv or auto");
  EXPECT_EQ(errorOf({"--recompute=sometimes"}), "--recompute sometimes: expected none, all or auto");
  EXPECT_EQ(errorOf({"--stages"}), "--stages: missing value");
  EXPECT_EQ(errorOf({"--frobnicate", "1"}), "unknown option '--frobnicate'");
  EXPECT_NE(errorOf({"--gpus", "2x"}).find("--gpus '2x'"), std::string::npos);
  EXPECT_NE(errorOf({"--device", "Z80"}).find("Z80"), std::string::npos);
}

// Property: an integer setting accepts exactly the decimal integers in its
// declared range, and every number it accepts is the one written.
TEST(TextBinder, IntegersAreExactlyTheDeclaredRange) {
  std::mt19937 random(7);
  const pipec::settings::IntSetting &chunks = pipec::settings::kChunks;
  for (int trial = 0; trial < 2000; ++trial) {
    const int64_t value = std::uniform_int_distribution<int64_t>(-100, 200)(random);
    std::string text = std::to_string(value);
    if (trial % 7 == 0)
      text += "x"; // not a number at all
    pipec::planner::Request request;
    bool accepted = true;
    try {
      pipec::settings::applyArguments(request, Arguments{{"--chunks", text}});
    } catch (const SettingError &) {
      accepted = false;
    }
    const bool inRange = trial % 7 != 0 && value >= chunks.min && value <= chunks.max;
    EXPECT_EQ(accepted, inRange) << text;
    if (accepted)
      EXPECT_EQ(request.chunks, value);
  }
}

// Property: a seed (Binder::unsigned64) accepts exactly the decimal numbers
// from 0 to 2^64 - 1, each as written; signs, exponents, spaces and one past
// the maximum are refused.
TEST(TextBinder, SeedsAreExactlyTheUnsigned64BitNumbers) {
  struct Seeded {
    uint64_t seed = 0;
    void bind(pipec::settings::Binder &b) { b.unsigned64(pipec::settings::kSeed, seed); }
  };
  std::mt19937_64 random(11);
  std::vector<std::string> texts = {"0", "18446744073709551615", "18446744073709551616", "99999999999999999999",
                                    "-1", "+1", "1e3", "0x10", " 1", "", "007", "184467440737095516150"};
  for (int trial = 0; trial < 2000; ++trial) {
    std::string text = std::to_string(random() >> (trial % 64));
    if (trial % 5 == 0)
      text += std::to_string(trial % 10); // sometimes past 2^64 - 1
    texts.push_back(text);
  }
  for (const std::string &text : texts) {
    // The brute force: digits only, and the value (in 128 bits) fits.
    bool expected = !text.empty() && text.find_first_not_of("0123456789") == std::string::npos;
    unsigned __int128 wide = 0;
    for (char digit : text)
      if (expected && (wide = wide * 10 + (digit - '0')) > UINT64_MAX)
        expected = false;
    Seeded seeded;
    bool accepted = true;
    try {
      pipec::settings::applyArguments(seeded, Arguments{{"--seed", text}});
    } catch (const SettingError &error) {
      accepted = false;
      if (!text.empty()) // an empty value is a missing one
        EXPECT_EQ(std::string(error.what()), "--seed " + text + ": is not a whole number from 0 to 18446744073709551615");
    }
    EXPECT_EQ(accepted, expected) << "'" << text << "'";
    if (accepted)
      EXPECT_EQ(seeded.seed, static_cast<uint64_t>(wide)) << text;
  }
}

class PassOptions : public ::testing::Test {
protected:
  void SetUp() override {
    static bool registered = [] {
      pipec::registerPipecPasses();
      return true;
    }();
    (void)registered;
    mlir::DialectRegistry registry;
    pipec::registerPipecDialects(registry);
    context.appendDialectRegistry(registry);
  }
  /// The pipeline parsed from `text`, printed back.
  std::string roundTrip(const std::string &text, std::string *error = nullptr) {
    mlir::PassManager pm(&context);
    std::string errors;
    llvm::raw_string_ostream errorStream(errors);
    if (mlir::failed(mlir::parsePassPipeline(text, pm, errorStream))) {
      if (error)
        *error = errors;
      return "";
    }
    const mlir::OpPassManager &parsed = pm;
    mlir::OpPassManager copy(parsed); // the copy clones every pass
    std::string printed;
    llvm::raw_string_ostream os(printed);
    copy.printAsTextualPipeline(os);
    // The copy is anchored on any op: "any(builtin.module(...))".
    const size_t start = printed.find("builtin.module(");
    return start == std::string::npos ? printed : printed.substr(start, printed.size() - start - 1);
  }
  mlir::MLIRContext context;
};

TEST_F(PassOptions, SurviveCopiesAndPrintAsTheyParse) {
  const std::string first =
      roundTrip("builtin.module(pipec-estimate-costs{precision=bf16 optimizer=sgd-momentum device=A100},"
                "pipec-partition{gpus=1x4 stages=2 schedule=zb-h1 microbatches=8},pipec-plan-memory{target=cuda})");
  ASSERT_FALSE(first.empty());
  EXPECT_NE(first.find("precision=bf16"), std::string::npos) << first;
  EXPECT_NE(first.find("optimizer=sgd-momentum"), std::string::npos) << first;
  EXPECT_NE(first.find("schedule=zb-h1"), std::string::npos) << first;
  EXPECT_NE(first.find("stages=2"), std::string::npos) << first;
  EXPECT_NE(first.find("target=cuda"), std::string::npos) << first;
  // What printed parses to the same passes, the settings never given
  // (`chunks=`) left unset, so that the pipeline also runs.
  EXPECT_EQ(roundTrip(first), first);
  EXPECT_NE(first.find("chunks= "), std::string::npos) << first;
}

TEST_F(PassOptions, MalformedTextIsAParseError) {
  std::string error;
  EXPECT_EQ(roundTrip("builtin.module(pipec-partition{stagez=2})", &error), "");
  EXPECT_NE(error.find("stagez"), std::string::npos) << error;
  error.clear();
  EXPECT_EQ(roundTrip("builtin.module(pipec-pipeline{chunks=99})", &error), "");
  EXPECT_NE(error.find("chunks=99: must be between 1 and 64"), std::string::npos) << error;
}

} // namespace
