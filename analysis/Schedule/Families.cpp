#include "analysis/Schedule/Families.h"
#include "analysis/Settings/Declared.h"

#include "analysis/Schedule/Schedule.h"

#include <algorithm>
#include <cassert>

namespace pipec::schedule {

const std::vector<ScheduleFamily> &scheduleFamilies() {
  constexpr Placement I = Placement::Interleaved, V = Placement::VShape;
  using K = ScheduleKind;
  // In enum order, so that scheduleFamily(kind) is an index.
  static const std::vector<ScheduleFamily> families = {
    // kind (its name from vocabulary.h), summary,
    //   chunks, any chunks, placement, async, split B/W, per-stage replicas,
    //   m multiple of p, m at least this times p, list-scheduled, search order, chooses among the families
    {K::GPipe, choiceName(K::GPipe), "all forwards, then all backwards (GPipe)",
       1, false, I, false, false, true, false, 0, false, 5, false},
    {K::OneFOneB, choiceName(K::OneFOneB), "p-s-1 warm-up forwards, then one forward, one backward",
       1, false, I, false, false, true, false, 0, false, 1, false},
    {K::OneFOneBRR, choiceName(K::OneFOneBRR), "asynchronous 1F1B: weight stashing, no flush, replicas round-robin (PipeDream)",
       1, false, I, true, false, true, false, 0, false, 0, false},
    {K::Interleaved, choiceName(K::Interleaved), ("1F1B over " + settings::flag(settings::kChunks) + " model chunks per rank (Megatron)"),
       2, true, I, false, false, false, true, 0, false, 6, false},
    {K::ZbH1, choiceName(K::ZbH1), "zero bubble H1: W's fill the drain at 1F1B's memory",
       1, false, I, false, true, true, false, 0, false, 2, false},
    {K::ZbH2, choiceName(K::ZbH2), "zero bubble H2: memory 2p-1, speculative optimizer step",
       1, false, I, false, true, true, false, 0, true, 3, false},
    {K::ZbV, choiceName(K::ZbV), "zero bubble V: 2 chunks per rank, down the ranks and back",
       2, false, V, false, true, false, false, 0, true, 7, false},
    {K::ZbInterleaved, choiceName(K::ZbInterleaved), ("zero bubble over " + settings::flag(settings::kChunks) + " model chunks per rank, placed as interleaved's (B and W split, list-scheduled)"),
       2, true, I, false, true, false, false, 0, true, 8, false},
    {K::DualPipeV, choiceName(K::DualPipeV), "DualPipeV (DeepSeek): the V's 2 chunks per rank, a forward and another micro-batch's backward run as one paired compute (F&B); m >= 2 x ranks",
       2, false, V, false, true, false, false, 2, false, 9, false},
    {K::Csv, choiceName(K::Csv), ("the order of a schedule file in PyTorch's CSV format (" + settings::flag(settings::kScheduleFile) + " FILE): its ranks, chunks, placement and micro-batches"),
       1, true, I, false, true, false, false, 0, false, 0, false},
    {K::Auto, choiceName(K::Auto), "the fastest searched family under the memory limit, its own list-scheduled order among them",
       1, false, I, false, true, true, false, 0, true, 4, true},
  };
  return families;
}

const ScheduleFamily &scheduleFamily(ScheduleKind kind) {
  const ScheduleFamily &f = scheduleFamilies()[size_t(kind)];
  assert(f.kind == kind && "the families are in enum order");
  return f;
}

std::vector<const ScheduleFamily *> searchedScheduleFamilies() {
  std::vector<const ScheduleFamily *> searched;
  for (const ScheduleFamily &f : scheduleFamilies())
    if (f.searchOrder > 0)
      searched.push_back(&f);
  std::stable_sort(searched.begin(), searched.end(),
                   [](const ScheduleFamily *a, const ScheduleFamily *b) { return a->searchOrder < b->searchOrder; });
  return searched;
}

const ScheduleFamily *findScheduleFamily(std::string_view name) {
  for (const ScheduleFamily &f : scheduleFamilies())
    if (f.name == name)
      return &f;
  return nullptr;
}

const ScheduleFamily &requireScheduleFamily(std::string_view name) {
  if (const ScheduleFamily *f = findScheduleFamily(name))
    return *f;
  throw ScheduleError("unknown schedule '" + std::string(name) + "' (known: " + scheduleFamilyNames() + ")");
}

std::string scheduleFamilyNames(bool (*keep)(const ScheduleFamily &), std::string_view last) {
  std::vector<std::string_view> names;
  for (const ScheduleFamily &f : scheduleFamilies())
    if (!keep || keep(f))
      names.push_back(f.name);
  std::string out;
  for (size_t i = 0; i < names.size(); ++i)
    out += std::string(i == 0 ? "" : i + 1 == names.size() ? last : ", ") + std::string(names[i]);
  return out;
}

void checkChunks(const ScheduleFamily &family, int chunks) {
  if (family.anyChunks || chunks == family.chunks)
    return;
  const std::string name(family.name);
  if (family.chunks == 1)
    throw ScheduleError(name + (" has one chunk per rank; " + settings::flag(settings::kChunks) + " ") + std::to_string(chunks) + " applies to " +
                        scheduleFamilyNames([](const ScheduleFamily &f) { return f.anyChunks; }, " or "));
  throw ScheduleError(name + " places exactly " + std::to_string(family.chunks) + " chunks per rank");
}

} // namespace pipec::schedule
