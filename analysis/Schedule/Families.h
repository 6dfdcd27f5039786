// The schedule families: one row per name --schedule accepts, with the facts
// the generators, the planner, `pipec schedule` and pipec's --help need, so
// that none of them tests a family by its name (docs/schedules.md). Adding a
// family is one row in Families.cpp plus its branch in generate().
#pragma once

#include "runtime/include/pipec/vocabulary.h"

#include <string>
#include <string_view>
#include <vector>

namespace pipec::schedule {

struct ScheduleFamily {
  ScheduleKind kind;        // its enumerator; its name is choiceName(kind) (pipec/vocabulary.h)
  std::string_view name;
  std::string summary;      // one line for --help (owned: some are built from flag names)
  int chunks;               // model chunks per rank it runs by default
  bool anyChunks;           // --chunks may ask for another count (interleaved)
  Placement placement;      // of the virtual stages over the ranks
  bool asynchronous;        // per-micro-batch updates with weight stashing (PipeDream)
  bool splitBackward;       // BWD_INPUT / BWD_WEIGHT instead of BWD
  bool perStageReplicas;    // runs different replica counts per stage
  bool microbatchesPerStage; // micro-batches per pipeline a multiple of the stages
  int microbatchesPerRank;   // micro-batches per pipeline at least this many times the ranks (0: any)
  bool listScheduled;       // its order comes from the list scheduler: costly to generate
  // The planner's search without --schedule: 0 leaves the family out (the
  // asynchronous one changes the training); otherwise the order it is tried
  // in, which breaks ties between equally fast plans (docs/planner.md).
  int searchOrder;
  // `pipec schedule --schedule NAME` (and its --compare row) runs every
  // family with a search order and keeps the fastest (generateFastest);
  // generate(NAME), which the planner calls, is the family's own order.
  bool choosesFamily;
};

// Whether generate() builds the family from a problem alone: not csv, whose
// order is a file's (scheduleFromCsv).
inline bool generatedFromProblem(const ScheduleFamily &family) { return family.kind != ScheduleKind::Csv; }

// Every family, in the order of --help and `pipec schedule --compare`.
const std::vector<ScheduleFamily> &scheduleFamilies();
// The families the planner searches without --schedule (a search order > 0),
// in that order; generateFastest tries the same ones.
std::vector<const ScheduleFamily *> searchedScheduleFamilies();
// The family of an enumerator.
const ScheduleFamily &scheduleFamily(ScheduleKind kind);
// nullptr when `name` is no family (names are case-sensitive).
const ScheduleFamily *findScheduleFamily(std::string_view name);
// Like findScheduleFamily but throws ScheduleError listing the families.
const ScheduleFamily &requireScheduleFamily(std::string_view name);
// The names of the families `keep` accepts (all without one), in table order:
// "a, b, c", or "a, b or c" with last = " or ".
std::string scheduleFamilyNames(bool (*keep)(const ScheduleFamily &) = nullptr,
                                std::string_view last = ", ");
// Throws ScheduleError unless `family` runs `chunks` model chunks per rank.
void checkChunks(const ScheduleFamily &family, int chunks);

} // namespace pipec::schedule
