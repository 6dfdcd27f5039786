// Unit tests of the runtime's job checks (runtime/src/JobCheck.h), no MPI:
//  * the deadlock simulation: hand-made streams that wait on each other are
//    refused naming both ranks and their RECV instructions, and every
//    schedule the schedule library generates passes;
//  * job identities: equal ones pass, a differing option or file is named
//    with the ranks on each side;
//  * the command-line number parsers and the file digest.
#include "JobCheck.h"
#include "Plan.h"
#include "analysis/Schedule/Schedule.h"

#include <cmath>
#include <filesystem>
#include <fstream>
#include <iostream>

#include <unistd.h>

using namespace pipec::rt;
namespace fs = std::filesystem;
namespace sch = pipec::schedule;

namespace {
int failures = 0;
#define CHECK(cond, msg)                                                                                                 \
  do {                                                                                                                   \
    if (!(cond)) {                                                                                                       \
      std::cerr << "FAIL " << __LINE__ << ": " << msg << "\n";                                                           \
      ++failures;                                                                                                        \
    }                                                                                                                    \
  } while (0)

bool contains(const std::string &s, const std::string &part) { return s.find(part) != std::string::npos; }

template <class F> std::string errorOf(F f) {
  try {
    f();
  } catch (const std::exception &e) {
    return e.what();
  }
  return "";
}

Plan twoStages() {
  Plan p;
  p.stages = 2;
  p.ranks = {{0}, {1}};
  return p;
}

void testHandMadeDeadlock() {
  const Plan plan = twoStages();
  const std::vector<std::string> paths = {"s/rank_0.json", "s/rank_1.json"};
  // 1F1B-like, fine: rank 0 sends act 0, receives grad 0; rank 1 the reverse.
  std::vector<std::vector<Transfer>> ok = {
      {{Op::SendAct, 0, 0, 1, 2}, {Op::RecvGrad, 0, 0, 1, 5}},
      {{Op::RecvAct, 0, 0, 0, 0}, {Op::SendGrad, 0, 0, 0, 3}}};
  CHECK(findTransferDeadlock(plan, ok, paths).empty(), "a valid order refused: " << findTransferDeadlock(plan, ok, paths));
  // Rank 0 waits for the gradient before sending the activation.
  std::vector<std::vector<Transfer>> bad = {
      {{Op::RecvGrad, 0, 0, 1, 2}, {Op::SendAct, 0, 0, 1, 3}},
      {{Op::RecvAct, 0, 0, 0, 0}, {Op::SendGrad, 0, 0, 0, 3}}};
  const std::string e = findTransferDeadlock(plan, bad, paths);
  CHECK(contains(e, "the schedule deadlocks"), e);
  CHECK(contains(e, "rank 0 (stage 0, replica 0) waits in s/rank_0.json #2 RECV_GRAD mb=0"), e);
  CHECK(contains(e, "rank 1 (stage 1, replica 0) waits in s/rank_1.json #0 RECV_ACT mb=0"), e);
  // MPI ranks named through stages[].ranks.
  Plan reversed = plan;
  reversed.ranks = {{1}, {0}};
  CHECK(contains(findTransferDeadlock(reversed, bad, paths), "rank 1 (stage 0, replica 0) waits"),
        findTransferDeadlock(reversed, bad, paths));
}

// No generated schedule deadlocks, so the start-up check never refuses a
// plan the compiler writes.
void testGeneratedSchedules(const fs::path &root) {
  int checked = 0;
  for (const std::string &n : sch::scheduleNames())
    for (int p : {2, 3, 4})
      for (int m : {4, 8})
        for (int variant = 0; variant < 4; ++variant) {
          sch::Problem prob;
          prob.stages = p, prob.microbatches = m, prob.chunks = n == "interleaved" ? 2 : 1;
          if (variant == 1) prob.recompute = {1};
          if (variant == 2) prob.replicas = std::vector<int>(p, 1), prob.replicas[0] = 2;
          if (variant == 3) prob.verticalSync = true;
          sch::Schedule s;
          try {
            s = sch::generate(n, prob);
          } catch (const std::exception &) {
            continue; // a combination the generator does not support
          }
          Plan plan;
          plan.stages = s.problem.stages, plan.chunks = s.problem.chunks;
          plan.ranks.assign(plan.stages, {});
          for (int st = 0; st < plan.stages; ++st)
            for (int q = 0; q < s.problem.replicasOf(st); ++q) plan.ranks[st].push_back(s.problem.rankOf(st, q));
          std::vector<std::vector<Transfer>> transfers;
          std::vector<std::string> paths;
          for (int r = 0; r < s.problem.numRanks(); ++r) {
            const fs::path f = root / ("rank_" + std::to_string(r) + ".json");
            std::ofstream(f) << sch::rankToJson(s, r);
            transfers.push_back(transfersOf(loadRankStream(f.string())));
            paths.push_back(f.string());
          }
          const std::string e = findTransferDeadlock(plan, transfers, paths);
          CHECK(e.empty(), n << " p=" << p << " m=" << m << " variant " << variant << ": " << e);
          ++checked;
        }
  CHECK(checked >= 40, "only " << checked << " generated schedules checked");
  std::cout << "job_check_unit: no deadlock in " << checked << " generated schedules\n";
}

void testIdentities() {
  JobIdentity a, b;
  a["--iters"] = {"3", "was started with --iters 3"};
  b["--iters"] = {"5", "was started with --iters 5"};
  a["plan.json"] = b["plan.json"] = {"x/1", "has plan.json"};
  a["stage 1 weights"] = {"", "cannot read"}; // left out: empty value
  b["stage 1 weights"] = {"y/2", "has w"};
  CHECK(compareIdentities({encodeIdentity(a), encodeIdentity(a)}).empty(), "equal identities refused");
  const std::string e = compareIdentities({encodeIdentity(a), encodeIdentity(b), encodeIdentity(a)});
  CHECK(contains(e, "ranks disagree on --iters: rank 1 was started with --iters 5, ranks 0,2 was started with --iters 3"), e);
  CHECK(!contains(e, "plan.json") && !contains(e, "stage 1 weights"), e);
  CHECK(contains(compareIdentities({"{", encodeIdentity(a)}), "rank 0 sent an unreadable job identity"), "bad encoding");
}

void testParsers() {
  CHECK(parseCount("--iters", "3", 1, kMaxIterations) == 3, "3");
  CHECK(parseCount("--iters", "1e3", 1, kMaxIterations) == 1000, "1e3");
  CHECK(contains(errorOf([] { parseCount("--iters", "0", 1, 10); }), "--iters: \"0\" is out of range"), "0");
  CHECK(contains(errorOf([] { parseCount("--iters", "nan", 1, 10); }), "out of range"), "nan");
  CHECK(contains(errorOf([] { parseCount("--iters", "3x", 1, 10); }), "is not a number"), "3x");
  CHECK(contains(errorOf([] { parseCount("--iters", " 3", 1, 10); }), "is not a number"), "leading space");
  CHECK(parseSeed("--seed", "18446744073709551615") == UINT64_MAX, "max seed");
  CHECK(contains(errorOf([] { parseSeed("--seed", "18446744073709551616"); }), "is not a seed"), "2^64");
  CHECK(contains(errorOf([] { parseSeed("--seed", "-1"); }), "is not a seed"), "-1");
  CHECK(contains(errorOf([] { parseSeed("--seed", "1e3"); }), "is not a seed"), "1e3");
  CHECK(std::isnan(parseReal("--lr", "nan")), "nan parses (refused by resolveOptimizer)");
  CHECK(contains(errorOf([] { parseReal("--lr", ""); }), "is not a number"), "empty");
}

void testOptimizer(const fs::path &root) {
  Plan plan;
  plan.planPath = (root / "plan.json").string();
  // What loadPlan keeps of runtime.optimizer as written (doubles).
  auto written = [&](double lr, double momentum) {
    plan.optimizerAsWritten = {};
    plan.optimizerAsWritten.lr = lr;
    plan.optimizerAsWritten.momentum = momentum;
  };
  written(0.1, 0.9);
  plan.optimizer.lr = 0.1f, plan.optimizer.momentum = 0.9f;
  OptimizerOverrides none, lr;
  CHECK(errorOf([&] { resolveOptimizer(plan, none); }).empty(), errorOf([&] { resolveOptimizer(plan, none); }));
  lr.lr = 0.5;
  CHECK(resolveOptimizer(plan, lr).lr == 0.5f, "override");
  lr.lr = -1;
  CHECK(contains(errorOf([&] { resolveOptimizer(plan, lr); }), "--lr is -1; it must be a finite learning rate >= 0"),
        errorOf([&] { resolveOptimizer(plan, lr); }));
  written(1e39, 0);
  CHECK(contains(errorOf([&] { resolveOptimizer(plan, none); }), "plan.json: runtime.optimizer.lr is 1e+39, beyond "
                                                                  "the range of a float"),
        errorOf([&] { resolveOptimizer(plan, none); }));
  written(0.1, 1);
  CHECK(contains(errorOf([&] { resolveOptimizer(plan, none); }), "runtime.optimizer.momentum is 1; it must be a momentum in [0, 1)"),
        errorOf([&] { resolveOptimizer(plan, none); }));
}

void testDigest(const fs::path &root) {
  const fs::path f = root / "blob.bin";
  std::ofstream(f, std::ios::binary) << std::string(100000, 'a');
  const FileDigest d1 = digestFile(f.string(), "file");
  std::ofstream(f, std::ios::binary) << std::string(99999, 'a') << 'b';
  const FileDigest d2 = digestFile(f.string(), "file");
  CHECK(d1.bytes == 100000 && !d1.sampled, "size");
  CHECK(d1.hash != d2.hash, "a changed last byte keeps the digest");
  CHECK(contains(errorOf([&] { digestFile(root.string(), "file"); }), "is a directory"), "directory accepted");
  CHECK(hashBytes("abc", 3) != hashBytes("abd", 3) && hashBytes("abc", 3) == hashBytes("abc", 3), "hash");
}
} // namespace

int main() {
  const fs::path root = fs::temp_directory_path() / ("job_check_unit." + std::to_string(getpid()));
  fs::create_directories(root);
  testHandMadeDeadlock();
  testGeneratedSchedules(root);
  testIdentities();
  testParsers();
  testOptimizer(root);
  testDigest(root);
  fs::remove_all(root);
  if (failures) {
    std::cerr << "job_check_unit: " << failures << " failure(s)\n";
    return 1;
  }
  std::cout << "job_check_unit: OK\n";
  return 0;
}
