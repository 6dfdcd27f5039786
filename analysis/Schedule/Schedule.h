// Pipeline-parallel training schedules: instruction model, generators,
// validator, simulator and timeline pictures (design.md section 3).
//
// Plain C++17, no MLIR: the compiler feeds plan-derived costs in through
// Problem, and `pipec schedule` explores schedules without a model.
#pragma once

#include "analysis/Schedule/Families.h"
#include "analysis/Settings/Settings.h"
#include "runtime/include/pipec/vocabulary.h"

#include <iosfwd>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

namespace pipec {
namespace schedule {
// The two variants of PyTorch's CSV schedules (`_dump_csv(format=...)`).
enum class CsvFormat : unsigned char { ComputeOnly, ComputeComms };
} // namespace schedule
template <> struct Choices<schedule::CsvFormat> {
  static constexpr const char *spellings[] = {"compute_only", "compute_comms"};
};
} // namespace pipec

namespace pipec::schedule {

class ScheduleError : public std::runtime_error {
public:
  using std::runtime_error::runtime_error;
};

// ---------------------------------------------------------------- instructions
// The instruction set and placements are shared with the runtime
// (runtime/include/pipec/vocabulary.h).
using ::pipec::Instr;
using ::pipec::isCollective;
using ::pipec::isCompute;
using ::pipec::isP2P;
using ::pipec::Op;
using ::pipec::Placement;
using ::pipec::choiceName;
using ::pipec::toString;

// ---------------------------------------------------------------- limits
// Bounds on a problem (Problem::check), so that no option value makes the
// generators run for minutes or allocate without bound: every schedule holds
// O(stages * chunks * microbatches) instructions and the searches (auto, zb-v)
// simulate that many a few dozen times. Costs are bounded so that no sum of
// them can overflow to infinity.
inline constexpr int kMaxStages = 4096;
inline constexpr int kMaxChunks = 64;
inline constexpr int kMaxMicrobatches = 65536;
inline constexpr int kMaxRanks = 65536;             // sum of the replicas
inline constexpr long kMaxComputeSlots = 1L << 20;  // stages * chunks * microbatches
inline constexpr double kMaxCost = 1e12;            // any one time (F, B, W, comm, ...)

// ---------------------------------------------------------------- problem
// Costs are per pipeline stage (all chunks of that stage together) or per
// (stage, chunk) when the vector has stages*chunks entries; one entry means
// uniform. Memory is counted in units of one micro-batch's activations on
// one stage (the zero-bubble paper's M_B): 1F1B peaks at p units on stage 0.
struct Problem {
  int stages = 4;                  // p: pipeline positions
  int microbatches = 8;            // m: micro-batches per step (all replicas)
  int chunks = 1;                  // v: model chunks per rank
  std::vector<int> replicas;       // per stage; empty = 1 each
  std::vector<double> costF{1.0}, costB{1.0}, costW{1.0};
  double comm = 0.0;               // C: time of one point-to-point transfer
  double allreduceCost = 0.0;      // time of one ALLREDUCE / VALIDATE
  double stepCost = 0.0;           // time of one optimizer step
  std::vector<double> activation{1.0}; // per stage, per micro-batch (units)
  double memoryLimit = 0.0;        // units per rank; <= 0: unlimited
  double wMemFrac = 1.0;           // share of activations W still holds after B
  int inFlight = 0;                // 1F1B-RR: admitted per stage-0 replica; 0 = PipeDream's NOAM
  // Activation recompute: per stage (one entry = every stage; empty = none).
  // A recomputed micro-batch keeps only `boundaryActivation` (share of its
  // full activation, per stage or one value) between its F and the
  // RECOMPUTE(mb, chunk) placed right before its backward, which costs F and
  // re-materializes the rest.
  std::vector<int> recompute;
  std::vector<double> boundaryActivation{0.1};
  bool verticalSync = false;       // 1F1B-RR: every stage uses the stage-0 entry version
  // A paired F&B (DualPipeV, Instr::paired) takes F + B - fbOverlap * min(F, B):
  // the share of the shorter compute that runs hidden behind the longer one
  // (0, the default: one after the other; 1: the longer alone).
  double fbOverlap = 0.0;

  void check() const; // throws ScheduleError on an inconsistent problem
  int replicasOf(int stage) const;
  int numRanks() const;
  int rankOf(int stage, int replica) const;
  int stageOfRank(int rank) const;
  int replicaOfRank(int rank) const;
  // Replica of `stage` that processes micro-batch `mb` (round-robin).
  int replicaFor(int stage, int mb) const { return mb % replicasOf(stage); }
  double costOf(Op op, int stage, int chunk) const; // F, B, W, BW, RECOMPUTE
  // A forward of `chunkF` paired with the backward `backward` (BWD or
  // BWD_INPUT) of `chunkB` on one rank of `stage`, with fbOverlap.
  double pairCostOf(int stage, int chunkF, Op backward, int chunkB) const;
  double activationOf(int stage, int chunk) const;  // one micro-batch, one chunk
  int defaultInFlight() const;                       // PipeDream NOAM
  bool recomputes(int stage) const;
  double boundaryOf(int stage) const; // share kept by a recomputed micro-batch
  // Activation a micro-batch keeps from its F until its backward starts
  // (the boundary share when the stage recomputes).
  double restingActivationOf(int stage, int chunk) const;
};

struct Schedule {
  std::string name;
  Problem problem; // as generated (chunks possibly forced, e.g. 2 for ZB-V)
  Placement placement = Placement::Interleaved;
  bool asynchronous = false; // 1F1B-RR: per-micro-batch updates, weight stashing
  bool splitBackward = false; // BWD_INPUT/BWD_WEIGHT instead of BWD
  std::vector<std::vector<Instr>> ranks; // per rank, in execution order

  int virtualStages() const { return problem.stages * problem.chunks; }
  int virtualStage(int stage, int chunk) const;
  void locate(int vs, int &stage, int &chunk) const;
  // Rank that runs virtual stage `vs` of micro-batch `mb`.
  int rankFor(int vs, int mb) const;
};

// ---------------------------------------------------------------- generators
// The families of Families.h that generate() builds from a problem alone
// (generatedFromProblem: all but csv), by name, in their order.
std::vector<std::string> scheduleNames();
// Generates and validates; throws ScheduleError (naming the rank and the
// instruction) when the problem is unsupported or the result is invalid,
// including a peak memory above problem.memoryLimit.
Schedule generate(ScheduleKind kind, const Problem &problem);
// The same by the family's name (`pipec schedule`, tests); throws
// ScheduleError listing the families when `name` is none.
Schedule generate(const std::string &name, const Problem &problem);

// The chunk count `family` runs beside the others (--compare, generateFastest):
// `chunks` (--chunks) where it takes any count and one is given, else its own.
int comparedChunks(const ScheduleFamily &family, std::optional<int> chunks);
// The chunk counts auto and the planner try for a family of any count when
// --chunks gives none (docs/schedules.md, "auto"): 2, 4 and 8.
std::vector<int> searchedChunkCounts();

// ---------------------------------------------------------------- validator
struct ValidationReport {
  std::vector<std::string> errors; // "rank 2 #17 RECV_GRAD mb=3 chunk=0 peer=3: ..."
  bool ok() const { return errors.empty(); }
  std::string summary(size_t maxErrors = 8) const;
};
ValidationReport validate(const Schedule &schedule);

// ---------------------------------------------------------------- simulator
struct Interval {
  int rank;
  Instr instr;
  double start, end;
};
struct Transfer {
  int src, dst, mb;
  bool grad;
  double sent, arrived;
};
struct SimResult {
  double makespan = 0;
  double totalCompute = 0;    // sum over ranks of F/B/W/recompute time
  double maxRankCompute = 0;  // the ideal time: busiest rank's compute
  double maxSpan = 0;         // largest (last end - first start) over ranks
  // Flush-to-flush: 1 - totalCompute / (ranks * makespan).
  double bubbleFlush = 0;
  // Zero-bubble paper's bubble rate (Qi et al. 2023, section 5.3):
  // (cost - m(F+B+W)) / cost, cost = the largest per-rank execution time
  // (maxSpan); m(F+B+W) generalizes to the busiest rank's compute (ideal).
  double bubbleSteady = 0;
  // Overhead against the ideal: makespan / ideal - 1; (p-1)/m for 1F1B.
  double bubbleOverIdeal = 0;
  std::vector<double> peakMemory; // per rank, units
  double maxPeakMemory = 0;
  std::vector<int> peakStashed;   // per rank: weight versions held (1F1B-RR)
  std::vector<double> rankCompute, rankFirst, rankLast;
  std::vector<Interval> intervals; // compute, collectives, steps
  std::vector<Transfer> transfers;
};
// Sends are asynchronous (a separate communication stream); a receive is
// posted without waiting, and the compute that reads its data (FWD, BWD,
// BWD_INPUT) starts no earlier than `comm` after the matching send (as
// piperun runs it). Throws on deadlock.
SimResult simulate(const Schedule &schedule);

// ---------------------------------------------------------------- choosing a family
// `pipec schedule --schedule auto` (docs/schedules.md, "auto"): every family
// the planner searches (a search order in Families.cpp: one chunk per rank,
// interleaved and the V), each at its comparedChunks, generated under the
// problem's memory limit or, without one, 1F1B's peak (auto's default); the
// lowest simulated makespan wins, ties to the earlier search order, as in the
// planner. A family the problem does not fit (m not a multiple of p for
// interleaved, a cost list of another length, per-stage replicas) is
// skipped; throws ScheduleError with the first family's error when none fits.
struct FastestSchedule {
  std::string family; // the winner's name; schedule.name is the same
  Schedule schedule;
  SimResult sim;
};
FastestSchedule generateFastest(const Problem &problem, std::optional<int> chunks);

// ---------------------------------------------------------------- exact mode
// `pipec schedule --optimal` (Optimal.cpp, docs/schedules.md): the makespan-
// optimal schedule of one model chunk per rank with a split backward (the
// space of 1F1B, ZB-H1 and auto's orders) under the memory limit, from an
// integer program solved by COIN-OR CBC, with the bound the solver proved.
struct OptimalResult {
  bool proven = false;   // the solver closed the gap within its time
  double makespan = 0;   // simulated makespan of `schedule`, the best found
  double lowerBound = 0; // no schedule of the space is faster: the certificate
  double seconds = 0;
  long nodes = 0;        // branch-and-bound nodes
  Schedule schedule;
  SimResult sim;         // of `schedule`
};
// Whether this build has the solver (CMake option PIPEC_WITH_CBC).
bool optimalAvailable();
// Throws ScheduleError without the solver, for a problem outside the space
// (several chunks, replicas, recompute, PipeDream) or one too large
// (more than 8 stages or 16 micro-batches), and when no schedule is found in
// `seconds`.
OptimalResult optimalSchedule(const Problem &problem, double seconds);

// ---------------------------------------------------------------- PyTorch's CSV schedules
// torch.distributed.pipelining's per-rank action lists (docs/schedules.md,
// "CSV schedules"): one row per rank of "<stage><action><micro-batch>".
// Compute only: F, I (backward input), W (backward weight), B (both); with
// the transfers: SEND_F, RECV_F, SEND_B, RECV_B too.
// One row per rank, in each rank's order: the compute instructions, and
// with ComputeComms the transfers; a paired forward and its backward are one
// "(F;B)OVERLAP_F_B" cell. Throws ScheduleError for replicas or an
// asynchronous schedule (the format has neither); RECOMPUTE, LOAD,
// collectives and steps have no action of PyTorch's and are left out.
std::string toCsv(const Schedule &schedule, CsvFormat format);
// A schedule from a CSV of either format, with `costs`' times and memory
// limit (its stages, chunks and micro-batches come from the file): stages,
// chunks and placement (interleaved or V) from the rows, micro-batches from
// the actions. The file's order of compute actions is kept; pipec's lowering
// places the transfers (those of a ComputeComms file are checked: each sent
// and received once, and the order free of deadlock). An OVERLAP_F_B of a
// forward and another's backward is an F&B pair (Instr::paired); any other
// runs its actions one after the other. UNSHARD, RESHARD, REDUCE_GRAD and
// WAIT_* are ignored. Throws ScheduleError naming `what`, the rank, the step (1-based
// cell of the row) and the action: a missing send or backward, a deadlock,
// a memory peak over the limit (the validator's).
Schedule scheduleFromCsv(const std::string &text, const std::string &what, const Problem &costs);

// ---------------------------------------------------------------- output
std::string toText(const Schedule &schedule);
std::string toJson(const Schedule &schedule);     // whole schedule + problem
Schedule fromJson(const std::string &text);       // inverse of toJson
std::string rankToJson(const Schedule &schedule, int rank); // rank_<r>.json
void writeChromeTrace(const Schedule &schedule, const SimResult &sim, std::ostream &os);
void writeSvg(const Schedule &schedule, const SimResult &sim, std::ostream &os);
// Writes rank_<r>.json, schedule.json, schedule.txt, timeline.json, timeline.svg.
void writeScheduleDir(const Schedule &schedule, const SimResult &sim, const std::string &dir);

// ---------------------------------------------------------------- CLI
// The options of `pipec schedule`, bound once (bind) to the declarations of
// analysis/Settings/Declared.h.
struct ScheduleCliOptions {
  Problem problem;
  std::string schedule;           // --schedule NAME (a family's name)
  bool compare = false;           // --compare
  bool json = false;              // --json
  bool print = false;             // --print
  std::string out;                // --out DIR
  std::string activationLimit;    // --activation-limit K or Kp (resolved against --stages when run)
  std::optional<int> chunks;      // --chunks; absent: the family's own count (resolved when run)
  std::vector<int> recomputeStages; // --recompute-stages L
  bool optimal = false;           // --optimal: also the exact mode's schedule and certificate
  double optimalSeconds = 60;     // --optimal-seconds S: the solver's time
  std::string fromCsv;            // --from-csv FILE: PyTorch's CSV schedule instead of a family
  std::string toCsv;              // --to-csv FILE: the schedule in PyTorch's CSV format
  CsvFormat csvFormat = CsvFormat::ComputeOnly; // --csv-format

  void bind(settings::Binder &binder);
};
// Sets the member of `options` behind `flag` ("--stages") from its text value
// as a command line would (settings::applyArguments; "" for a bare flag).
// Throws ScheduleError naming the flag. For tests and fuzzers.
void applyScheduleFlag(ScheduleCliOptions &options, const std::string &flag, const std::string &value);
// The same for command-line tokens: "--stages", "4", "--compare", "--recompute=all".
void applyScheduleTokens(ScheduleCliOptions &options, const std::vector<std::string> &tokens);
// `pipec schedule` on its filled options: generates, validates and simulates
// --schedule (or every family with --compare) and prints the table, --json or
// --print, writing --out. Returns the exit status: 0, 1 when the schedule
// fails (or a file cannot be written), 2 when the options together are not a
// valid problem (no --schedule or --compare, a list of the wrong length, a
// value over a bound). Errors go to `err` as "pipec schedule: ...".
int runScheduleCommand(const ScheduleCliOptions &options, std::ostream &out, std::ostream &err);

} // namespace pipec::schedule
