// `pipec schedule`: explore schedules without a model.
#include "analysis/Schedule/Schedule.h"
#include "runtime/include/pipec/input_file.h"
#include "analysis/Settings/Declared.h"
#include "analysis/Settings/TextBinder.h"

#include <nlohmann/json.hpp>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <new>
#include <ostream>
#include <fstream>
#include <sstream>

namespace pipec::schedule {

namespace {
double parseNumber(const std::string &opt, const std::string &text) {
  char *end = nullptr;
  const double x = std::strtod(text.c_str(), &end);
  if (text.empty() || *end != '\0')
    throw ScheduleError(opt + ": '" + text + "' is not a number");
  if (!std::isfinite(x))
    throw ScheduleError(opt + ": '" + text + "' is not a finite number");
  return x;
}

// A decimal integer in [lo, hi]: digits only, an optional '-' where lo < 0.
int parseInt(const std::string &opt, const std::string &text, long lo, long hi) {
  size_t first = !text.empty() && text[0] == '-' ? 1 : 0;
  bool digits = text.size() > first && text.size() - first <= 12;
  for (size_t i = first; i < text.size(); ++i)
    digits = digits && text[i] >= '0' && text[i] <= '9';
  if (!digits)
    throw ScheduleError(opt + ": '" + text + "' is not an integer");
  const long long x = std::stoll(text);
  if (x < lo || x > hi)
    throw ScheduleError(opt + " " + text + ": must be between " + std::to_string(lo) + " and " +
                        std::to_string(hi));
  return (int)x;
}

std::vector<double> parseList(const std::string &opt, const std::string &text) {
  std::vector<double> v;
  std::stringstream ss(text);
  for (std::string item; std::getline(ss, item, ',');)
    v.push_back(parseNumber(opt, item));
  if (v.empty())
    throw ScheduleError(opt + ": empty list");
  return v;
}

} // namespace

void ScheduleCliOptions::bind(settings::Binder &b) {
  using namespace settings;
  b.integer(kScheduleStages, problem.stages);
  b.integer(kMicrobatches, problem.microbatches);
  b.choiceThen(kSchedule, std::function<void(ScheduleKind)>(
                              [this](ScheduleKind kind) { schedule = std::string(scheduleFamily(kind).name); }));
  b.onInteger(kChunks, [this](int64_t value) { chunks = static_cast<int>(value); });
  b.onText(kReplicas, [this](const std::string &value) {
    problem.replicas.clear();
    std::stringstream ss(value);
    for (std::string item; std::getline(ss, item, ',');)
      problem.replicas.push_back(parseInt(settings::flag(settings::kReplicas), item, 1, kMaxRanks));
    if (problem.replicas.empty())
      throw ScheduleError((settings::flag(settings::kReplicas) + ": empty list"));
  });
  b.integer(kInFlight, problem.inFlight);
  b.onText(kCostF, [this](const std::string &value) { problem.costF = parseList(settings::flag(settings::kCostF), value); });
  b.onText(kCostB, [this](const std::string &value) { problem.costB = parseList(settings::flag(settings::kCostB), value); });
  b.onText(kCostW, [this](const std::string &value) { problem.costW = parseList(settings::flag(settings::kCostW), value); });
  b.real(kComm, problem.comm);
  b.real(kAllreduceCost, problem.allreduceCost);
  b.onText(kActivationMemoryLimit, [this](const std::string &value) {
    // K, or Kp: K times the stage count (resolved when run, as --stages may follow)
    std::string t = value;
    if (!t.empty() && (t.back() == 'p' || t.back() == 'P'))
      t.pop_back();
    const double k = t.empty() ? 1.0 : parseNumber(settings::flag(settings::kActivationMemoryLimit), t);
    if (!(k > 0))
      throw ScheduleError((settings::flag(settings::kActivationMemoryLimit) + " must be positive and finite"));
    activationLimit = value;
  });
  b.onText(kRenamedActivationMemoryLimit, [](const std::string &) {
    throw SettingError("is now " + settings::flag(settings::kActivationMemoryLimit) +
                       " (activation memory per rank in units of one micro-batch on one stage); " +
                       settings::flag(settings::kMemoryLimit) + " is pipec MODEL's per-device memory in bytes");
  });
  b.real(kWMemFrac, problem.wMemFrac);
  b.real(kFbOverlap, problem.fbOverlap);
  // Every stage, or none; which stages need it is the planner's question
  // (auto), which has no model here.
  b.choiceThen(kRecompute, std::function<void(RecomputeMode)>([this](RecomputeMode mode) {
                 if (mode == RecomputeMode::Auto)
                   throw SettingError("auto needs a model's memory; pipec schedule takes all or none");
                 problem.recompute = mode == RecomputeMode::All ? std::vector<int>{1} : std::vector<int>{};
               }));
  b.onText(kRecomputeStages, [this](const std::string &value) {
    recomputeStages.clear();
    std::stringstream ss(value);
    for (std::string item; std::getline(ss, item, ',');)
      recomputeStages.push_back(parseInt(settings::flag(settings::kRecomputeStages), item, 0, kMaxStages - 1));
    if (recomputeStages.empty())
      throw ScheduleError((settings::flag(settings::kRecomputeStages) + ": empty list"));
  });
  b.onText(kBoundaryActivation,
           [this](const std::string &value) { problem.boundaryActivation = parseList(settings::flag(settings::kBoundaryActivation), value); });
  b.flag(kVerticalSync, problem.verticalSync);
  b.flag(kCompare, compare);
  b.flag(kJson, json);
  b.flag(kPrint, print);
  b.text(kOut, out);
  b.flag(kOptimal, optimal);
  b.real(kOptimalSeconds, optimalSeconds);
  b.text(kFromCsv, fromCsv);
  b.text(kToCsv, toCsv);
  b.choice(kCsvFormat, csvFormat);
}

void applyScheduleFlag(ScheduleCliOptions &a, const std::string &opt, const std::string &value) {
  settings::applyArguments<ScheduleError>(a, {{opt, value}});
}

void applyScheduleTokens(ScheduleCliOptions &a, const std::vector<std::string> &tokens) {
  settings::applyTokens<ScheduleError>(a, tokens);
}

namespace {
// What depends on several flags: the memory limit's 'p' suffix, the recompute
// stages and a single replica count against --stages; then the problem's bounds.
ScheduleCliOptions resolve(ScheduleCliOptions a) {
  if (a.chunks)
    a.problem.chunks = *a.chunks;
  if (!a.activationLimit.empty()) {
    std::string t = a.activationLimit;
    const bool perStage = !t.empty() && (t.back() == 'p' || t.back() == 'P');
    if (perStage)
      t.pop_back();
    const double k = t.empty() ? 1.0 : parseNumber(settings::flag(settings::kActivationMemoryLimit), t);
    a.problem.memoryLimit = perStage ? k * a.problem.stages : k;
    if (!(a.problem.memoryLimit > 0) || !std::isfinite(a.problem.memoryLimit))
      throw ScheduleError((settings::flag(settings::kActivationMemoryLimit) + " must be positive and finite"));
  }
  if (!a.recomputeStages.empty()) {
    a.problem.recompute.assign(a.problem.stages, 0);
    for (int st : a.recomputeStages) {
      if (st < 0 || st >= a.problem.stages)
        throw ScheduleError((settings::flag(settings::kRecomputeStages) + ": stage ") + std::to_string(st) + " out of range");
      a.problem.recompute[st] = 1;
    }
  }
  // A single replica count applies to every stage.
  if (a.problem.replicas.size() == 1)
    a.problem.replicas.assign(a.problem.stages, a.problem.replicas[0]);
  if (!a.fromCsv.empty()) {
    // The file gives stages, chunks and micro-batches; the options the costs.
    if (!a.schedule.empty() || a.compare || a.optimal)
      throw ScheduleError(settings::flag(settings::kFromCsv) + " is the schedule: it takes no " +
                          settings::flag(settings::kSchedule) + ", " + settings::flag(settings::kCompare) + " or " +
                          settings::flag(settings::kOptimal));
    return a;
  }
  if (!a.toCsv.empty() && (a.compare || a.schedule.empty()))
    throw ScheduleError(settings::flag(settings::kToCsv) + " writes one schedule: give " +
                        settings::flag(settings::kSchedule) + " NAME (or " + settings::flag(settings::kFromCsv) + ")");
  if (!a.compare && a.schedule.empty() && !a.optimal)
    throw ScheduleError((settings::flag(settings::kSchedule) + " NAME, " + settings::flag(settings::kCompare) + ", " + settings::flag(settings::kOptimal) + " or " + settings::flag(settings::kFromCsv) + " FILE is required (see --help)"));
  // --compare and a family that chooses among the others (auto) run several
  // families side by side.
  const ScheduleFamily *family = findScheduleFamily(a.schedule);
  const bool sideBySide = a.compare || (family && family->choosesFamily);
  // A schedule defined for a fixed chunk count (zb-v: 2) has it whether or
  // not --chunks says so, also when the cost lists are checked.
  if (!sideBySide && !a.chunks && family && !family->anyChunks)
    a.problem.chunks = family->chunks;
  // Side by side, the lists are checked once for the two-chunk families
  // (interleaved, zb-v, unless --chunks says otherwise); a list of stages x 2
  // entries then fails only the one-chunk families, each with its own message.
  if (sideBySide && !a.chunks)
    a.problem.chunks = 2;
  a.problem.check();
  return a;
}

struct Row {
  std::string name;
  std::string chosen; // the family that auto's row chose (generateFastest)
  bool ok = false;
  std::string error;
  Schedule schedule;
  SimResult sim;
};

Row run(const std::string &name, Problem problem, const ScheduleCliOptions &args) {
  Row row;
  row.name = name;
  const ScheduleFamily &family = requireScheduleFamily(name);
  if (args.compare && !family.asynchronous) {
    problem.replicas.clear(); // replication only where it is round-robin
    problem.verticalSync = false;
  }
  try {
    if (family.choosesFamily) {
      FastestSchedule fastest = generateFastest(problem, args.chunks);
      row.chosen = fastest.family;
      row.schedule = std::move(fastest.schedule);
      row.sim = std::move(fastest.sim);
    } else {
      // Side by side, each schedule gets the chunk count it is defined for.
      if (args.compare)
        problem.chunks = comparedChunks(family, args.chunks);
      row.schedule = generate(name, problem);
      row.sim = simulate(row.schedule);
    }
    row.ok = true;
  } catch (const ScheduleError &e) {
    row.error = e.what();
  }
  return row;
}

std::string pct(double x) {
  char b[32];
  std::snprintf(b, sizeof b, "%6.2f%%", 100 * x);
  return b;
}

void printTable(const std::vector<Row> &rows, const Problem &P, std::ostream &out) {
  char line[256];
  out << "p=" << P.stages << " m=" << P.microbatches << " F=" << P.costF[0] << " B=" << P.costB[0]
      << " W=" << P.costW[0] << " C=" << P.comm << " memory limit="
      << (P.memoryLimit > 0 ? std::to_string(P.memoryLimit) : std::string("none")) << " w-mem-frac=" << P.wMemFrac;
  if (!P.recompute.empty()) {
    out << " recompute=";
    if (P.recompute.size() == 1)
      out << "all";
    else
      for (int st = 0, first = 1; st < P.stages; ++st)
        if (P.recompute[st])
          out << (first ? "" : ",") << st, first = 0;
    out << " boundary=" << P.boundaryActivation[0] << (P.boundaryActivation.size() > 1 ? ",..." : "");
  }
  if (P.verticalSync)
    out << " vertical-sync";
  out << "\n";
  std::snprintf(line, sizeof line, "%-12s %3s %10s %13s %13s %12s %9s\n", "schedule", "v", "makespan",
                "bubble:flush", "bubble:steady", "over-ideal", "peak-mem");
  out << line;
  for (const Row &r : rows) {
    if (!r.ok) {
      std::string e = r.error.substr(0, r.error.find('\n'));
      out << r.name << std::string(r.name.size() < 13 ? 13 - r.name.size() : 1, ' ') << "-- " << e << "\n";
      continue;
    }
    std::snprintf(line, sizeof line, "%-12s %3d %10.2f %13s %13s %12s %9.2f\n", r.name.c_str(),
                  r.schedule.problem.chunks, r.sim.makespan, pct(r.sim.bubbleFlush).c_str(),
                  pct(r.sim.bubbleSteady).c_str(), pct(r.sim.bubbleOverIdeal).c_str(), r.sim.maxPeakMemory);
    out << line;
  }
  for (const Row &r : rows)
    if (r.ok && !r.chosen.empty())
      out << r.name << ": the fastest family under the memory limit is " << r.chosen << "\n";
}

void printJson(const Row &r, const Problem &P, std::ostream &out) {
  nlohmann::json j{{"schedule", r.name}, {"stages", P.stages}, {"microbatches", P.microbatches}, {"valid", r.ok}};
  if (!r.ok) {
    j["error"] = r.error;
  } else {
    if (!r.chosen.empty())
      j["chosen"] = r.chosen;
    j["chunks"] = r.schedule.problem.chunks;
    j["ranks"] = r.schedule.ranks.size();
    j["makespan"] = r.sim.makespan;
    j["bubble_flush"] = r.sim.bubbleFlush;
    j["bubble_steady"] = r.sim.bubbleSteady;
    j["bubble_over_ideal"] = r.sim.bubbleOverIdeal;
    j["peak_memory"] = r.sim.maxPeakMemory;
    j["peak_memory_per_rank"] = r.sim.peakMemory;
    if (r.schedule.asynchronous)
      j["peak_stashed_versions"] = r.sim.peakStashed;
    j["recompute"] = r.schedule.problem.recompute;
    j["vertical_sync"] = r.schedule.problem.verticalSync;
  }
  j["memory_limit"] = P.memoryLimit;
  out << j.dump() << "\n";
}
} // namespace

static int runResolved(const ScheduleCliOptions &args, std::ostream &out, std::ostream &err) {
  std::vector<std::string> names;
  if (!args.schedule.empty())
    names.push_back(args.schedule);
  if (args.compare) {
    names = scheduleNames();
  }
  std::vector<Row> rows;
  for (const std::string &n : names)
    rows.push_back(run(n, args.problem, args));
  if (!args.fromCsv.empty()) {
    Row row;
    row.name = "csv";
    try {
      row.schedule = scheduleFromCsv(io::readInputFile(args.fromCsv, "a CSV schedule"), args.fromCsv, args.problem);
      row.sim = simulate(row.schedule);
      row.ok = true;
    } catch (const ScheduleError &e) {
      row.error = e.what();
    }
    rows.push_back(std::move(row));
  }
  std::string certificate;
  if (args.optimal) {
    // The exact mode's row, and the bound it proved (the certificate).
    Row row;
    row.name = "optimal";
    try {
      // One model chunk per rank, also beside the two-chunk families that
      // --compare and auto run (they set two unless --chunks says otherwise).
      Problem exact = args.problem;
      if (!args.chunks)
        exact.chunks = 1;
      OptimalResult best = optimalSchedule(exact, args.optimalSeconds);
      row.schedule = best.schedule;
      row.sim = best.sim;
      row.ok = true;
      char text[320];
      const double gap = best.makespan > 0 ? (best.makespan - best.lowerBound) / best.makespan : 0;
      const std::string found = best.proven ? std::string("proven optimum")
                                            : "best found (not proven within " +
                                                  settings::flag(settings::kOptimalSeconds) + ")";
      std::snprintf(text, sizeof text,
                    "optimal: %s %.4f, proved lower bound %.4f (gap %.2f%%), %ld branch-and-bound nodes in %.2f s\n",
                    found.c_str(), best.makespan, best.lowerBound, 100 * gap, best.nodes, best.seconds);
      certificate = text;
      if (args.json) {
        nlohmann::json j{{"schedule", "optimal"}, {"proven", best.proven}, {"makespan", best.makespan},
                         {"lower_bound", best.lowerBound}, {"nodes", best.nodes}, {"solver_seconds", best.seconds}};
        certificate = "certificate " + j.dump() + "\n";
      }
    } catch (const ScheduleError &e) {
      row.error = e.what();
    }
    rows.push_back(std::move(row));
  }
  int status = 0;
  for (const Row &r : rows) {
    if (!r.ok && !args.compare) {
      err << "pipec schedule: " << r.error << "\n";
      return 1;
    }
    if (args.json)
      printJson(r, args.problem, out);
    if (r.ok && args.print)
      out << toText(r.schedule);
    if (r.ok && !args.toCsv.empty()) {
      std::ofstream csv(args.toCsv, std::ios::binary);
      csv << toCsv(r.schedule, args.csvFormat);
      if (!csv) {
        err << "pipec schedule: cannot write " << args.toCsv << "\n";
        status = 1;
      }
    }
    if (r.ok && !args.out.empty()) {
      try {
        writeScheduleDir(r.schedule, r.sim, args.compare ? args.out + "/" + r.name : args.out);
      } catch (const ScheduleError &e) {
        err << "pipec schedule: " << e.what() << "\n";
        status = 1;
      }
    }
  }
  if (!args.json)
    printTable(rows, args.problem, out);
  out << certificate;
  return status;
}

int runScheduleCommand(const ScheduleCliOptions &options, std::ostream &out, std::ostream &err) {
  ScheduleCliOptions args;
  try {
    args = resolve(options);
  } catch (const ScheduleError &e) {
    err << "pipec schedule: " << e.what() << "\n";
    return 2;
  }
  // Whatever escapes (out of memory, a file system error) is an error, never an abort.
  try {
    return runResolved(args, out, err);
  } catch (const std::bad_alloc &) {
    err << "pipec schedule: error: out of memory\n";
  } catch (const std::exception &e) {
    err << "pipec schedule: error: " << e.what() << "\n";
  }
  return 1;
}

} // namespace pipec::schedule
