#include "ScheduleOptions.h"
#include "GivenFlags.h"

#include "analysis/Schedule/Schedule.h"

#include <cassert>
#include <iostream>
#include <string>
#include <vector>

namespace cl = llvm::cl;

namespace pipec::tools {

cl::SubCommand &scheduleSubcommand() {
  static cl::SubCommand sub("schedule",
                            "generate, validate and simulate a pipeline schedule without a model "
                            "(docs/schedules.md)");
  return sub;
}

namespace {
using schedule::ScheduleFamily;

// The usage lines, then one line per family from its row (Families.cpp): the
// category's description, printed above the options by --help.
std::string scheduleHelp() {
  std::string text = "  pipec schedule --stages P --microbatches M --schedule NAME [options]\n"
                     "  pipec schedule --stages P --microbatches M --compare [options]\n\n"
                     "Schedules:\n";
  for (const ScheduleFamily &f : schedule::scheduleFamilies()) {
    const std::string name(f.name);
    text += "  " + name + std::string(name.size() < 20 ? 22 - name.size() : 2, ' ') + std::string(f.summary) + "\n";
  }
  text.pop_back();
  return text;
}

struct ScheduleFlags {
  // cl::desc and the category keep pointers: the generated texts live as long as the options.
  const std::string help = scheduleHelp();
  const std::string scheduleDesc = "One of the schedules above: " + schedule::scheduleFamilyNames();
  const std::string stagesDesc = "Pipeline stages (ranks per pipeline; at most " +
                                 std::to_string(schedule::kMaxStages) + ")";
  const std::string chunksDesc = "Model chunks per rank (interleaved; default 1, 2 in --compare; at most " +
                                 std::to_string(schedule::kMaxChunks) + ")";
  cl::OptionCategory category{"Schedule options", help};

#define PIPEC_SCHEDULE cl::sub(scheduleSubcommand()), cl::cat(category)
  cl::opt<std::string> stages{"stages", cl::desc(stagesDesc), cl::value_desc("P"), PIPEC_SCHEDULE};
  cl::opt<std::string> microbatches{
      "microbatches",
      cl::desc("Micro-batches per optimizer step (over all replicas; at most 65536, and P x V x M at most "
               "1048576)"),
      cl::value_desc("M"), PIPEC_SCHEDULE};
  cl::opt<std::string> scheduleName{"schedule", cl::desc(scheduleDesc), cl::value_desc("name"), PIPEC_SCHEDULE};
  cl::opt<std::string> chunks{"chunks", cl::desc(chunksDesc), cl::value_desc("V"), PIPEC_SCHEDULE};
  cl::opt<std::string> replicas{"replicas",
                                cl::desc("Replicas per stage: one number or a comma list per stage"),
                                cl::value_desc("R"), PIPEC_SCHEDULE};
  cl::opt<std::string> inFlight{"in-flight", cl::desc("1f1b-rr: micro-batches admitted per stage-0 replica"),
                                cl::value_desc("N"), PIPEC_SCHEDULE};
  cl::opt<std::string> costF{
      "cost-f",
      cl::desc("Time of the forward of one micro-batch on one stage: one number or a comma list per stage "
               "(default 1); every time (also --cost-b, --cost-w, --comm, --allreduce-cost) finite, at "
               "most 1e12"),
      cl::value_desc("F"), PIPEC_SCHEDULE};
  cl::opt<std::string> costB{"cost-b",
                             cl::desc("Time of the input-gradient backward (like --cost-f; default 1)"),
                             cl::value_desc("B"), PIPEC_SCHEDULE};
  cl::opt<std::string> costW{"cost-w",
                             cl::desc("Time of the weight-gradient backward (like --cost-f; default 1; 0: a "
                                      "fused backward, B computes the weight gradients too)"),
                             cl::value_desc("W"), PIPEC_SCHEDULE};
  cl::opt<std::string> comm{"comm", cl::desc("Time of one point-to-point transfer (default 0)"),
                            cl::value_desc("C"), PIPEC_SCHEDULE};
  cl::opt<std::string> allreduceCost{"allreduce-cost",
                                     cl::desc("Time of one ALLREDUCE / VALIDATE (default 0)"),
                                     cl::value_desc("A"), PIPEC_SCHEDULE};
  cl::opt<std::string> memoryLimit{
      "memory-limit",
      cl::desc("Activation memory per rank in units of one micro-batch on one stage (1F1B peaks at p); a "
               "'p' suffix multiplies by P: 2p = twice 1F1B. Default: unlimited (auto and zb-v: 1p)"),
      cl::value_desc("K"), PIPEC_SCHEDULE};
  cl::opt<std::string> wMemFrac{
      "w-mem-frac",
      cl::desc("Share of a micro-batch's activations still held after B until its W completes (default 1)"),
      cl::value_desc("X"), PIPEC_SCHEDULE};
  cl::opt<bool> recompute{
      "recompute",
      cl::desc("Activation recompute on every stage: a micro-batch keeps only its boundary activation "
               "after F; RECOMPUTE (cost F) runs right before its backward"),
      cl::ValueDisallowed, PIPEC_SCHEDULE};
  cl::opt<std::string> recomputeStages{"recompute-stages",
                                       cl::desc("Recompute on the listed stages only (comma list)"),
                                       cl::value_desc("L"), PIPEC_SCHEDULE};
  cl::opt<std::string> boundaryActivation{
      "boundary-activation",
      cl::desc("Share of a stage's activation a recomputed micro-batch keeps (one number or one per "
               "stage; default 0.1)"),
      cl::value_desc("X"), PIPEC_SCHEDULE};
  cl::opt<bool> verticalSync{"vertical-sync",
                             cl::desc("1f1b-rr: every stage computes a micro-batch with the weight version "
                                      "current when it entered stage 0"),
                             cl::ValueDisallowed, PIPEC_SCHEDULE};
  cl::opt<bool> compare{"compare", cl::desc("All schedules side by side"), cl::ValueDisallowed, PIPEC_SCHEDULE};
  cl::opt<bool> json{"json", cl::desc("One JSON object per schedule instead of the table"), cl::ValueDisallowed,
                     PIPEC_SCHEDULE};
  cl::opt<std::string> out{"out",
                           cl::desc("Write rank_<r>.json, schedule.json, schedule.txt, timeline.json "
                                    "(Perfetto) and timeline.svg (DIR/<name>/ with --compare)"),
                           cl::value_desc("dir"), PIPEC_SCHEDULE};
  cl::opt<bool> print{"print", cl::desc("Print the instruction streams"), cl::ValueDisallowed, PIPEC_SCHEDULE};
  cl::opt<bool> optimal{"optimal",
                        cl::desc("Also the makespan-optimal schedule of one chunk per rank (split backward) under "
                                 "the memory limit, from an integer program (COIN-OR CBC), and the lower bound it "
                                 "proved; at most 8 stages and 16 micro-batches"),
                        cl::ValueDisallowed, PIPEC_SCHEDULE};
  cl::opt<std::string> optimalSeconds{"optimal-seconds",
                                      cl::desc("Time the --optimal solver may take (default 60); its best "
                                               "schedule and bound are printed either way"),
                                      cl::value_desc("S"), PIPEC_SCHEDULE};
#undef PIPEC_SCHEDULE

  std::vector<cl::opt<std::string> *> valued() {
    return {&stages, &microbatches, &scheduleName, &chunks, &replicas, &inFlight, &costF, &costB, &costW,
            &comm, &allreduceCost, &memoryLimit, &wMemFrac, &recomputeStages, &boundaryActivation, &out,
            &optimalSeconds};
  }
  std::vector<cl::opt<bool> *> bare() { return {&recompute, &verticalSync, &compare, &json, &print, &optimal}; }
};

ScheduleFlags &flags() {
  static ScheduleFlags f;
  return f;
}
} // namespace

void registerScheduleOptions() {
  flags();
  // Every flag applyScheduleFlag knows is declared above.
  for (const char *const *flag = schedule::kScheduleFlags; *flag; ++flag)
    assert(cl::getRegisteredOptions(scheduleSubcommand()).count(*flag + 2) &&
           "a schedule flag without its cl option");
}

int runScheduleSubcommand() {
  ScheduleFlags &f = flags();
  schedule::ScheduleCliOptions options;
  try {
    applyGivenFlags(f.valued(), f.bare(), [&](const std::string &flag, const std::string &value) {
      schedule::applyScheduleFlag(options, flag, value);
    });
  } catch (const schedule::ScheduleError &error) {
    std::cerr << "pipec schedule: " << error.what() << "\n";
    return 2;
  }
  return schedule::runScheduleCommand(options, std::cout, std::cerr);
}

} // namespace pipec::tools
