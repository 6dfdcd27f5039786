// Unit tests of the runtime pieces that need neither MPI nor a GPU:
//  * plan.json's version, pipeline and stages[].ranks, runtime.target /
//    precision / cuda_arch / gpu (defaults,
//    values, errors);
//  * the transfer-order check NCCL needs (checkTransferOrder): hand-made
//    streams whose orders differ are refused with a message naming the pair
//    and the micro-batches, and every schedule the schedule library generates
//    passes;
//  * the host Device and Buffer (what the CPU target's numbers rest on);
//  * the file readers on hostile input (issue 11): tensor files and data sets
//    (lengths checked before allocating, overflow, FIFOs), the ELF check
//    before dlopen, plan.json against the schedule files (every generated
//    schedule passes), checkpoint manifests;
//  * the synthetic data set's values, pinned.
// Plain asserts with messages: runs in the standalone runtime build too.
#include "Device.h"
#include "Plan.h"
#include "analysis/Schedule/Schedule.h"
#include "StageModel.h"
#include "pipec/dataset.h"

#include <nlohmann/json.hpp>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <limits>

#include <sys/stat.h>
#include <unistd.h>

using namespace pipec::rt;
namespace fs = std::filesystem;
namespace sch = pipec::schedule;
using pipec::Precision;
using pipec::Target;
using pipec::choiceName;
using nlohmann::json;

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

fs::path scratch() {
  const fs::path d = fs::temp_directory_path() / ("pipec_runtime_unit_" + std::to_string(::getpid()));
  fs::create_directories(d);
  return d;
}

// A two-stage plan.json (version 2, docs/plan-json.md) with `extra` merged
// into its runtime member and `top` into the file.
std::string writePlan(const fs::path &dir, const json &extra, const json &top = json::object()) {
  fs::create_directories(dir);
  json rt{{"microbatch_size", 4},
          {"stages", {{{"id", 0}, {"library", "a.so"}, {"weights", "a.bin"}}, {{"id", 1}, {"library", "b.so"}, {"weights", "b.bin"}}}},
          {"optimizer", {{"name", "sgd"}, {"lr", 0.1}}}};
  for (auto it = extra.begin(); it != extra.end(); ++it) rt[it.key()] = it.value();
  json plan{{"format", "pipec-plan"},
            {"version", 2},
            {"pipeline", {{"schedule", "1f1b"}, {"microbatches", 4}}},
            {"stages", {{{"id", 0}, {"ranks", {0}}}, {{"id", 1}, {"ranks", {1}}}}},
            {"runtime", rt}};
  for (auto it = top.begin(); it != top.end(); ++it) plan[it.key()] = it.value();
  std::ofstream(dir / "plan.json") << plan.dump(1);
  return dir.string();
}

std::string loadError(const std::string &dir) {
  try {
    loadPlan(dir);
  } catch (const Error &e) {
    return e.what();
  }
  return "";
}

void testPlanKeys(const fs::path &root) {
  // Absent: the CPU target.
  Plan p = loadPlan(writePlan(root / "defaults", json::object()));
  CHECK(p.target == Target::Cpu && p.precision == Precision::F32 && p.cudaArch.empty() && p.gpu.empty(),
        "defaults: " << choiceName(p.target) << " " << choiceName(p.precision) << " " << p.cudaArch.size() << " "
                     << p.gpu);
  // What pipec --target cuda writes.
  p = loadPlan(writePlan(root / "cuda",
                         {{"target", "cuda"}, {"precision", "bf16"}, {"cuda_arch", {"sm_80", "sm_90a"}}, {"gpu", "H100"}}));
  CHECK(p.target == Target::Cuda && p.precision == Precision::BF16 &&
            p.cudaArch == std::vector<std::string>({"sm_80", "sm_90a"}) && p.gpu == "H100",
        "cuda keys: " << choiceName(p.target) << " " << choiceName(p.precision) << " " << p.gpu);
  // The CPU plan pipec writes today (target and precision present).
  p = loadPlan(writePlan(root / "cpu", {{"target", "cpu"}, {"precision", "fp32"}}));
  CHECK(p.target == Target::Cpu, "explicit cpu");
  // Errors name the file and the member.
  std::string e = loadError(writePlan(root / "bad-target", {{"target", "rocm"}}));
  CHECK(contains(e, "plan.json") && contains(e, "runtime.target must be cpu or cuda") && contains(e, "rocm"),
        "bad target: " << e);
  e = loadError(writePlan(root / "bad-arch", {{"target", "cuda"}, {"cuda_arch", {"compute_80"}}}));
  CHECK(contains(e, "runtime.cuda_arch") && contains(e, "compute_80"), "bad arch: " << e);
  // pipec's --cuda-arch grammar (pipec/vocabulary.h): two or three digits, one letter at most.
  for (const char *bad : {"sm_9", "sm_1000", "sm_90ab", "sm_90A", "sm_"}) {
    e = loadError(writePlan(root / "bad-arch-grammar", {{"target", "cuda"}, {"cuda_arch", {bad}}}));
    CHECK(contains(e, "runtime.cuda_arch") && contains(e, bad), "bad arch " << bad << ": " << e);
  }
  CHECK(pipec::isCudaArchitecture("sm_100f") && pipec::isCudaArchitecture("sm_90a") && pipec::isCudaArchitecture("sm_80"),
        "sm_80, sm_90a and sm_100f are architectures");
  e = loadError(writePlan(root / "bad-arch-type", {{"cuda_arch", "sm_80"}}));
  CHECK(contains(e, "runtime.cuda_arch") && contains(e, "wrong type"), "arch not a list: " << e);
  e = loadError(writePlan(root / "bad-precision", {{"precision", 16}}));
  CHECK(contains(e, "runtime.precision") && contains(e, "wrong type"), "precision not a string: " << e);
  e = loadError(writePlan(root / "unknown-precision", {{"precision", "fp8"}}));
  CHECK(contains(e, "runtime.precision must be fp32, tf32 or bf16") && contains(e, "fp8"),
        "unknown precision: " << e);
  // An older plan.json (version 1: the facts under "runtime") is refused, naming the version.
  e = loadError(writePlan(root / "version-1", json::object(), {{"version", 1}}));
  CHECK(contains(e, "plan.json: plan.json version 1, this piperun reads version 2; re-run pipec"), "v1: " << e);
  e = loadError(writePlan(root / "no-version", json::object(), {{"version", nullptr}}));
  CHECK(contains(e, "plan.json version (none)") && contains(e, "re-run pipec"), "no version: " << e);
  // Chunked: one stages[] entry per virtual stage; a position's virtual stages share its ranks.
  const json chunked{{"schedule", "interleaved"}, {"microbatches", 4}, {"chunks", 2}};
  const json vstages = {{{"id", 0}, {"library", "a.so"}, {"weights", "a.bin"}}, {{"id", 1}, {"library", "b.so"}, {"weights", "b.bin"}},
                        {{"id", 2}, {"library", "c.so"}, {"weights", "c.bin"}}, {{"id", 3}, {"library", "d.so"}, {"weights", "d.bin"}}};
  const json four = {{{"id", 0}, {"ranks", {0}}}, {{"id", 1}, {"ranks", {1}}}, {{"id", 2}, {"ranks", {0}}}, {{"id", 3}, {"ranks", {1}}}};
  p = loadPlan(writePlan(root / "chunked", {{"stages", vstages}}, {{"pipeline", chunked}, {"stages", four}}));
  CHECK(p.stages == 2 && p.chunks == 2 && p.ranks == std::vector<std::vector<int>>({{0}, {1}}) && p.vstages[3].stage == 1 &&
            p.vstages[3].chunk == 1,
        "chunked: " << p.stages << " positions");
  json crossed = four;
  crossed[3]["ranks"] = {0};
  e = loadError(writePlan(root / "chunked-ranks", {{"stages", vstages}}, {{"pipeline", chunked}, {"stages", crossed}}));
  CHECK(contains(e, "stages[3].ranks differ from stages[1].ranks") && contains(e, "pipeline position 1"), "chunked ranks: " << e);
}

Plan twoStagePlan() {
  Plan p;
  p.stages = 2;
  p.ranks = {{0}, {1}};
  return p;
}

Transfer t(Op op, int mb, int peer, int index) { return {op, mb, 0, peer, index}; }

void testTransferOrder() {
  const Plan plan = twoStagePlan();
  const std::vector<std::string> paths{"schedule/rank_0.json", "schedule/rank_1.json"};
  // GPipe-like: two activations down, two gradients up.
  std::vector<std::vector<Transfer>> ok{
      {t(Op::SendAct, 0, 1, 1), t(Op::SendAct, 1, 1, 3), t(Op::RecvGrad, 1, 1, 4), t(Op::RecvGrad, 0, 1, 6)},
      {t(Op::RecvAct, 0, 0, 0), t(Op::RecvAct, 1, 0, 2), t(Op::SendGrad, 1, 0, 5), t(Op::SendGrad, 0, 0, 7)}};
  CHECK(checkTransferOrder(plan, ok, paths).empty(), "matching orders refused: " << checkTransferOrder(plan, ok, paths));

  // The receiver takes micro-batch 1 before 0.
  auto swapped = ok;
  std::swap(swapped[1][0].mb, swapped[1][1].mb);
  std::string e = checkTransferOrder(plan, swapped, paths);
  CHECK(contains(e, "transfers from rank 0 to rank 1") && contains(e, "rank_0.json -> schedule/rank_1.json") &&
            contains(e, "out of order") && contains(e, "transfer 1 is the activation of micro-batch 0") &&
            contains(e, "the activation of micro-batch 1 for virtual stage 1 (#0 RECV_ACT mb=1 chunk=0 peer=0)") &&
            contains(e, "NCCL"),
        "swapped receives: " << e);
  // Checked by the receiver only.
  CHECK(checkTransferOrder(plan, swapped, paths, 0).empty(), "the sender reported a pair it does not receive on");
  CHECK(!checkTransferOrder(plan, swapped, paths, 1).empty(), "the receiver did not report its pair");

  // Gradients: the sender sends micro-batch 0 first, the receiver expects 1.
  auto grads = ok;
  std::swap(grads[1][2].mb, grads[1][3].mb);
  e = checkTransferOrder(plan, grads, paths);
  CHECK(contains(e, "transfers from rank 1 to rank 0") && contains(e, "the gradient of micro-batch 0 for virtual stage 0") &&
            contains(e, "the gradient of micro-batch 1 for virtual stage 0"),
        "swapped gradient sends: " << e);

  // A send without its receive.
  auto missing = ok;
  missing[1].erase(missing[1].begin() + 1);
  e = checkTransferOrder(plan, missing, paths);
  CHECK(contains(e, "do not match") && contains(e, "sends 2 bundles per iteration, the receiver receives 1") &&
            contains(e, "micro-batch 1"),
        "missing receive: " << e);

  // Gradient vs activation at the same position.
  auto kinds = ok;
  kinds[0][0].op = Op::SendGrad; // to virtual stage -1: a different bundle
  e = checkTransferOrder(plan, kinds, paths);
  CHECK(contains(e, "out of order") && contains(e, "the gradient of micro-batch 0"), "kind mismatch: " << e);

  // MPI ranks named when they differ from schedule ranks.
  Plan reversed = plan;
  reversed.ranks = {{1}, {0}};
  e = checkTransferOrder(reversed, swapped, paths);
  CHECK(contains(e, "rank 0 (MPI rank 1) to rank 1 (MPI rank 0)"), "MPI ranks: " << e);
}

// Every generated schedule satisfies the order NCCL needs, so the start-up
// check never refuses a plan the compiler writes.
void testGeneratedSchedules(const fs::path &root) {
  struct Case {
    std::string name;
    int stages, microbatches, chunks;
    std::vector<int> replicas;
    bool recompute, vsync;
  };
  std::vector<Case> cases;
  for (const std::string &n : sch::scheduleNames())
    for (int p : {2, 3, 4})
      for (int m : {4, 8}) {
        cases.push_back({n, p, m, n == "interleaved" ? 2 : 1, {}, false, false});
        cases.push_back({n, p, m, n == "interleaved" ? 2 : 1, {}, true, false});
      }
  cases.push_back({"1f1b", 2, 4, 1, {2, 2}, false, false});
  cases.push_back({"1f1b-rr", 3, 4, 1, {2, 1, 1}, false, false});
  cases.push_back({"1f1b-rr", 3, 6, 1, {}, false, true});
  cases.push_back({"zb-h2", 2, 4, 1, {2, 2}, false, false});
  int checked = 0;
  for (const Case &c : cases) {
    sch::Problem prob;
    prob.stages = c.stages, prob.microbatches = c.microbatches, prob.chunks = c.chunks, prob.replicas = c.replicas;
    prob.verticalSync = c.vsync;
    if (c.recompute) prob.recompute = {1};
    sch::Schedule s;
    try {
      s = sch::generate(c.name, prob);
    } catch (const std::exception &) {
      continue; // a combination the generator does not support
    }
    Plan plan;
    plan.stages = s.problem.stages, plan.chunks = s.problem.chunks;
    plan.placement = s.placement;
    plan.ranks.assign(plan.stages, {});
    for (int st = 0; st < plan.stages; ++st)
      for (int q = 0; q < s.problem.replicasOf(st); ++q) plan.ranks[st].push_back(s.problem.rankOf(st, q));
    plan.microbatches = s.problem.microbatches, plan.schedule = sch::requireScheduleFamily(s.name).kind, plan.asynchronous = s.asynchronous;
    plan.planPath = "plan.json";
    const int R = s.problem.numRanks();
    std::vector<std::vector<Transfer>> transfers;
    std::vector<std::string> paths;
    for (int r = 0; r < R; ++r) {
      const fs::path f = root / ("rank_" + std::to_string(r) + ".json");
      std::ofstream(f) << sch::rankToJson(s, r);
      const RankStream stream = loadRankStream(f.string());
      transfers.push_back(transfersOf(stream));
      paths.push_back(f.string());
      // Every generated stream agrees with the plan made from its problem
      // (micro-batch mb on replica mb mod R).
      try {
        checkRankStream(plan, stream, r);
      } catch (const Error &e) {
        CHECK(false, c.name << " p=" << c.stages << " m=" << c.microbatches << " rank " << r << ": " << e.what());
      }
    }
    const std::string e = checkTransferOrder(plan, transfers, paths);
    CHECK(e.empty(), c.name << " p=" << c.stages << " m=" << c.microbatches << (c.recompute ? " recompute" : "") << ": " << e);
    ++checked;
  }
  CHECK(checked >= 30, "only " << checked << " generated schedules checked");
  std::cout << "runtime_unit: transfer order of " << checked << " generated schedules OK\n";
}

// ---------------------------------------------------------------- file readers (issue 11)
template <class F> std::string errorOf(F &&f) {
  try {
    f();
  } catch (const std::exception &e) {
    return e.what();
  }
  return "";
}
template <class T> void put(std::string &out, T v) { out.append((const char *)&v, sizeof v); }
void writeBytes(const fs::path &p, const std::string &bytes) { std::ofstream(p, std::ios::binary) << bytes; }

void testTensorAndDataReaders(const fs::path &root) {
  namespace io = pipec::io;
  const fs::path dir = root / "readers";
  fs::create_directories(dir);
  // A valid file round-trips.
  io::Tensor t;
  t.name = "w", t.dtype = PIPEC_F32, t.shape = {2, 3}, t.data.assign(24, 1);
  io::writeTensorFile((dir / "ok.bin").string(), {t});
  CHECK(io::readTensorFile((dir / "ok.bin").string()).at(0).shape == t.shape, "tensor round trip");
  // A name length of 2^32-1 is refused before allocating 4 GiB.
  std::string b = "PIPECTS1";
  put<uint64_t>(b, 1), put<uint32_t>(b, 0xFFFFFFFFu), b += std::string(40, 'a');
  writeBytes(dir / "name.bin", b);
  std::string e = errorOf([&] { io::readTensorFile((dir / "name.bin").string(), "weights file"); });
  CHECK(contains(e, "name.bin: truncated file: the name of tensor #0 is 4294967295 bytes long"), "name length: " << e);
  // A tensor count the file cannot hold.
  b = "PIPECTS1", put<uint64_t>(b, ~0ull), b += std::string(30, '\0');
  writeBytes(dir / "count.bin", b);
  e = errorOf([&] { io::readTensorFile((dir / "count.bin").string()); });
  CHECK(contains(e, "truncated file: the tensor count 18446744073709551615"), "tensor count: " << e);
  // Dimensions whose product wraps to 0 bytes.
  b = "PIPECTS1", put<uint64_t>(b, 1), put<uint32_t>(b, 1), b += "w";
  put<uint32_t>(b, PIPEC_F32), put<uint32_t>(b, 2), put<int64_t>(b, 1ll << 32), put<int64_t>(b, 1ll << 32), put<uint64_t>(b, 0);
  writeBytes(dir / "dims.bin", b);
  e = errorOf([&] { io::readTensorFile((dir / "dims.bin").string()); });
  CHECK(contains(e, "shape [4294967296x4294967296] f32 has more than 2^63 elements"), "dims overflow: " << e);
  // Duplicate names.
  io::writeTensorFile((dir / "dup.bin").string(), {t, t});
  e = errorOf([&] { io::readTensorFile((dir / "dup.bin").string()); });
  CHECK(contains(e, "tensor w appears twice"), "duplicate: " << e);
  // Not a regular file: refused without blocking.
  ::mkfifo((dir / "fifo").c_str(), 0600);
  e = errorOf([&] { io::readTensorFile((dir / "fifo").string(), "weights file"); });
  CHECK(contains(e, "fifo: weights file is a FIFO, not a regular file"), "fifo: " << e);
  e = errorOf([&] { io::DatasetFile((dir / "fifo").string()); });
  CHECK(contains(e, "fifo: data set is a FIFO"), "data fifo: " << e);
  e = errorOf([&] { io::readTensorFile(dir.string()); });
  CHECK(contains(e, "is a directory"), "directory: " << e);

  // Data sets: a valid one, then hostile headers.
  io::FieldSpec f;
  f.name = "x", f.dtype = PIPEC_F32, f.shape = {4};
  io::writeDataset((dir / "data.bin").string(), {f}, 3, {std::vector<char>(48, 2)});
  io::DatasetFile ds((dir / "data.bin").string());
  std::vector<float> got(8);
  ds.read(0, 2, 2, got.data()); // wraps: samples 2, 0
  CHECK(ds.numSamples() == 3 && got[0] == got[7], "data set read");
  b = "PIPECDS1", put<uint32_t>(b, 1), put<uint64_t>(b, 1), put<uint32_t>(b, 0xFFFFFFFFu), b += std::string(40, 'x');
  writeBytes(dir / "dname.bin", b);
  e = errorOf([&] { io::DatasetFile((dir / "dname.bin").string()); });
  CHECK(contains(e, "truncated file: the name of field #0 is 4294967295 bytes long"), "field name length: " << e);
  // 16 bytes a sample x (2^60 + 1) samples wraps to the 16 bytes present.
  b = "PIPECDS1", put<uint32_t>(b, 1), put<uint64_t>(b, (1ull << 60) + 1), put<uint32_t>(b, 1), b += "x";
  put<uint32_t>(b, PIPEC_F32), put<uint32_t>(b, 1), put<int64_t>(b, 4), b += std::string(16, '\0');
  writeBytes(dir / "wrap.bin", b);
  e = errorOf([&] { io::DatasetFile((dir / "wrap.bin").string()); });
  CHECK(contains(e, "field x: 1152921504606846977 samples of f32[4] need over 2^64 bytes"), "sample overflow: " << e);
  b = "PIPECDS1", put<uint32_t>(b, 4096), put<uint64_t>(b, 1), b += std::string(20, '\0');
  writeBytes(dir / "fields.bin", b);
  e = errorOf([&] { io::DatasetFile((dir / "fields.bin").string()); });
  CHECK(contains(e, "truncated file: 4096 field headers need"), "field count: " << e);
}

void testStageLibraryCheck(const fs::path &root) {
  // This test binary is a PIE (ET_DYN) of this machine: accepted. Copies
  // truncated or with a patched header are refused with the reason.
  const fs::path dir = root / "elf";
  fs::create_directories(dir);
  const fs::path self = fs::read_symlink("/proc/self/exe");
  std::ifstream in(self, std::ios::binary);
  const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (bytes.size() < 64 || bytes[16] != 3 /* ET_DYN */) {
    std::cout << "runtime_unit: not a PIE, ELF checks skipped\n";
    return;
  }
  writeBytes(dir / "ok.so", bytes);
  std::string e = checkStageLibraryFile((dir / "ok.so").string());
  CHECK(e.empty(), "a good ELF refused: " << e);
  writeBytes(dir / "half.so", bytes.substr(0, bytes.size() / 2));
  e = checkStageLibraryFile((dir / "half.so").string());
  CHECK(contains(e, "lies outside the file") && contains(e, "truncated?"), "half: " << e);
  writeBytes(dir / "header.so", bytes.substr(0, 40));
  e = checkStageLibraryFile((dir / "header.so").string());
  CHECK(contains(e, "shorter than an ELF header"), "header only: " << e);
  std::string patched = bytes;
  const uint64_t far = ~0ull - 8;
  std::memcpy(&patched[32], &far, 8); // e_phoff: offset + size overflows
  writeBytes(dir / "phoff.so", patched);
  e = checkStageLibraryFile((dir / "phoff.so").string());
  CHECK(contains(e, "program header table"), "phoff: " << e);
  patched = bytes, patched[18] = (char)(patched[18] ^ 0x40); // e_machine
  writeBytes(dir / "machine.so", patched);
  e = checkStageLibraryFile((dir / "machine.so").string());
  CHECK(contains(e, "is not this machine's"), "machine: " << e);
  patched = bytes, patched[4] = 1; // ELFCLASS32
  writeBytes(dir / "class.so", patched);
  e = checkStageLibraryFile((dir / "class.so").string());
  CHECK(contains(e, "ELF class 1"), "class: " << e);
  writeBytes(dir / "text.so", "not an ELF file at all, but long enough for an ELF header: 64 bytes or more .....");
  e = checkStageLibraryFile((dir / "text.so").string());
  CHECK(contains(e, "bad magic"), "text: " << e);
  ::mkfifo((dir / "fifo.so").c_str(), 0600);
  e = checkStageLibraryFile((dir / "fifo.so").string());
  CHECK(contains(e, "stage library is a FIFO"), "fifo: " << e);
  e = errorOf([&] { StageLibrary((dir / "half.so").string(), 0, 1); });
  CHECK(contains(e, "half.so: cannot load stage library: ") && contains(e, "lies outside the file"), "StageLibrary: " << e);
}

void testPlanAgainstSchedule(const fs::path &root) {
  // gpipe, 2 stages, 4 micro-batches; the plan claims 4, 2 or 8.
  sch::Problem prob;
  prob.stages = 2, prob.microbatches = 4;
  const sch::Schedule s = sch::generate("gpipe", prob);
  auto planFor = [&](int m) {
    Plan p = twoStagePlan();
    p.microbatches = m, p.schedule = pipec::ScheduleKind::GPipe, p.planPath = "plan.json";
    return p;
  };
  const fs::path f = root / "rank_0.json";
  std::ofstream(f) << sch::rankToJson(s, 0);
  const RankStream stream = loadRankStream(f.string());
  CHECK(errorOf([&] { checkRankStream(planFor(4), stream, 0); }).empty(), "matching plan refused");
  std::string e = errorOf([&] { checkRankStream(planFor(8), stream, 0); });
  CHECK(contains(e, "rank_0.json: chunk 0 runs the forward of micro-batches 0, 1, 2, 3, but plan.json says "
                    "pipeline.microbatches = 8"), "m=8: " << e);
  e = errorOf([&] { checkRankStream(planFor(2), stream, 0); });
  CHECK(contains(e, "micro-batch 2 is out of range: plan.json says pipeline.microbatches = 2"), "m=2: " << e);
  e = errorOf([&] { checkRankStream(planFor(4), stream, 1); });
  CHECK(contains(e, "rank_0.json: stream is for rank 0 (stage 0, replica 0), plan.json maps schedule rank 1"),
        "other rank: " << e);
  RankStream stepless = stream;
  stepless.instrs.erase(std::remove_if(stepless.instrs.begin(), stepless.instrs.end(),
                                       [](const Instr &in) { return in.op == Op::Step; }),
                        stepless.instrs.end());
  e = errorOf([&] { checkRankStream(planFor(4), stepless, 0); });
  CHECK(contains(e, "rank_0.json: the stream has 0 optimizer steps (STEP or SPEC_STEP) per iteration, but plan.json "
                    "says pipeline.asynchronous = false, which needs exactly one"), "no STEP: " << e);
  // A stream file of the first format (which repeated the pipeline's facts) is
  // refused with what to do, not half read.
  std::string text = sch::rankToJson(s, 0);
  text.replace(text.find("pipec.schedule.rank/2"), 21, "pipec.schedule.rank/1");
  std::ofstream(root / "old_rank.json") << text;
  e = errorOf([&] { loadRankStream((root / "old_rank.json").string()); });
  CHECK(contains(e, "old_rank.json: format \"pipec.schedule.rank/1\", this program reads \"pipec.schedule.rank/2\"; "
                    "re-run pipec"), "old format: " << e);
}

void testCheckpointManifest(const fs::path &root) {
  const fs::path dir = root / "ckpt";
  fs::create_directories(dir / "iter_2");
  Plan p = twoStagePlan();
  p.microbatches = 4, p.microbatchSize = 3, p.planPath = "plan.json";
  auto manifest = [&](const json &change) {
    json m{{"format", "pipec.checkpoint/1"}, {"iteration", 2}, {"virtual_stages", 2}, {"microbatches", 4},
           {"microbatch_size", 3}, {"seed", 7}};
    for (auto it = change.begin(); it != change.end(); ++it) m[it.key()] = it.value();
    std::ofstream(dir / "iter_2" / "manifest.json") << m.dump();
  };
  std::ofstream(dir / "latest") << "iter_2\n";
  manifest(json::object());
  const CheckpointManifest m = readCheckpointManifest(dir.string(), p, 4, 7);
  CHECK(m.iteration == 2 && contains(m.stageFile(1), "iter_2/stage_1.bin"), "manifest via latest");
  std::string e;
  manifest({{"iteration", -5}});
  e = errorOf([&] { readCheckpointManifest(dir.string(), p, 4, 7); });
  CHECK(contains(e, "iter_2/manifest.json: iteration -5 is negative"), "negative: " << e);
  manifest({{"iteration", 9}});
  e = errorOf([&] { readCheckpointManifest(dir.string(), p, 4, 7); });
  CHECK(contains(e, "at iteration 9, beyond --iters 4"), "beyond: " << e);
  manifest({{"iteration", "2"}});
  e = errorOf([&] { readCheckpointManifest(dir.string(), p, 4, 7); });
  CHECK(contains(e, "member iteration has the wrong type"), "string: " << e);
  manifest({{"microbatch_size", 5}});
  e = errorOf([&] { readCheckpointManifest(dir.string(), p, 4, 7); });
  CHECK(contains(e, "trained with 20 samples per optimizer step (4 micro-batches of 5)") &&
            contains(e, "takes 12 (4 of 3)"),
        "other mini-batch: " << e);
  // Another plan of the same mini-batch resumes: other virtual stages, and
  // m x B = 12 as 6 x 2.
  manifest({{"virtual_stages", 5}, {"microbatches", 6}, {"microbatch_size", 2}});
  CHECK(readCheckpointManifest(dir.string(), p, 4, 7).virtualStages == 5, "another plan, same mini-batch");
  manifest({{"virtual_stages", 0}});
  e = errorOf([&] { readCheckpointManifest(dir.string(), p, 4, 7); });
  CHECK(contains(e, "virtual_stages 0 is not between 1 and"), "no stage files: " << e);
  manifest({{"microbatches", 4611686018427387904LL}, {"microbatch_size", 4}});
  e = errorOf([&] { readCheckpointManifest(dir.string(), p, 4, 7); });
  CHECK(contains(e, "is not a mini-batch"), "overflowing mini-batch: " << e);
  manifest(json::object());
  e = errorOf([&] { readCheckpointManifest(dir.string(), p, 4, 8); });
  CHECK(contains(e, "trained with seed 7, this run uses seed 8 (pass --seed 7"), "seed: " << e);
  std::ofstream(dir / "latest") << "../elsewhere\n";
  e = errorOf([&] { readCheckpointManifest(dir.string(), p, 4, 7); });
  CHECK(contains(e, "latest: does not name a checkpoint directory beside it"), "latest escape: " << e);
}

void testHostDevice() {
  Device &d = hostDevice();
  CHECK(d.host() && std::string(d.name()) == "cpu" && d.computeStream() == nullptr, "host device identity");
  Buffer b(d, 100);
  CHECK(b.size() == 100 && (uintptr_t)b.data() % 64 == 0, "alignment");
  bool zero = true;
  for (size_t k = 0; k < 100; ++k) zero &= b.data()[k] == 0;
  CHECK(zero, "allocate zeroes");
  Buffer empty(d, 0);
  CHECK(empty.data() == nullptr && empty.size() == 0, "empty buffer");

  // scale / add / sumSquares: the same operations, in the same order, as the
  // loops the CPU path always ran (bitwise).
  std::vector<float> f{1.5f, -2.25f, 3.0f, 1e-3f};
  std::vector<double> g{0.1, -0.2, 0.3};
  std::vector<float> fr = f;
  const double factor = 1.0 / 3.0;
  for (float &x : fr) x = (float)(x * factor);
  d.scale(f.data(), f.size(), PIPEC_F32, factor);
  CHECK(std::memcmp(f.data(), fr.data(), f.size() * 4) == 0, "scale f32");
  std::vector<float> longF(37), longFr(37);
  for (size_t k = 0; k < longF.size(); ++k) longF[k] = longFr[k] = 0.37f * (float)k - 5.0f;
  for (float &x : longFr) x = (float)(x * factor);
  d.scale(longF.data(), longF.size(), PIPEC_F32, factor);
  CHECK(std::memcmp(longF.data(), longFr.data(), longF.size() * 4) == 0, "scale of a long f32 span");
  std::vector<double> gr = g;
  for (double &x : gr) x *= 0.5;
  d.scale(g.data(), g.size(), PIPEC_F64, 0.5);
  CHECK(g == gr, "scale f64");
  std::vector<float> y{1, 2, 3, 4};
  d.add(f.data(), y.data(), 4, PIPEC_F32);
  for (int k = 0; k < 4; ++k) fr[k] += y[k];
  CHECK(std::memcmp(f.data(), fr.data(), 16) == 0, "add f32");
  std::vector<float> bad{1.0f, std::numeric_limits<float>::infinity(), 2.0f, std::nanf("")};
  double sumSq = 0.5, nonFinite = 1;
  d.sumSquares({{bad.data(), 4, PIPEC_F32}, {g.data(), 3, PIPEC_F64}}, sumSq, nonFinite);
  double want = 0.5 + 1.0 + 4.0;
  for (double x : g) want += x * x;
  CHECK(sumSq == want && nonFinite == 3, "sumSquares " << sumSq << " " << nonFinite);
  // Spans longer than the eight lanes, finite and not (integer squares:
  // exact in any order).
  std::vector<float> longSpan(37);
  for (size_t k = 0; k < longSpan.size(); ++k) longSpan[k] = (float)((int)(k % 7) - 3);
  double longWant = 0;
  for (float x : longSpan) longWant += (double)x * x;
  sumSq = 0, nonFinite = 0;
  d.sumSquares({{longSpan.data(), longSpan.size(), PIPEC_F32}}, sumSq, nonFinite);
  CHECK(sumSq == longWant && nonFinite == 0, "sumSquares of a long span " << sumSq << " " << nonFinite);
  longWant -= (double)longSpan[13] * longSpan[13] + (double)longSpan[35] * longSpan[35];
  longSpan[13] = -std::numeric_limits<float>::infinity();
  longSpan[35] = std::nanf("");
  sumSq = 0, nonFinite = 0;
  d.sumSquares({{longSpan.data(), longSpan.size(), PIPEC_F32}}, sumSq, nonFinite);
  CHECK(sumSq == longWant && nonFinite == 2, "sumSquares of a long non-finite span " << sumSq << " " << nonFinite);
  std::vector<double> huge(16, 1e200); // finite, squares overflow: not counted as non-finite
  sumSq = 0, nonFinite = 0;
  d.sumSquares({{huge.data(), huge.size(), PIPEC_F64}}, sumSq, nonFinite);
  CHECK(std::isinf(sumSq) && nonFinite == 0, "sumSquares overflowing " << sumSq << " " << nonFinite);
  bool threw = false;
  try {
    int32_t i[2] = {1, 2};
    d.scale(i, 2, PIPEC_I32, 2.0);
  } catch (const Error &) {
    threw = true;
  }
  CHECK(threw, "scale of an i32 tensor accepted");

  // writeSmall, copy, zero, copyFrom.
  Buffer c(d, 128);
  const char header[64] = "PBUNDLE1 header";
  d.writeSmall(c.data(), header, 64);
  CHECK(std::memcmp(c.data(), header, 64) == 0, "writeSmall");
  Buffer e(d);
  e.copyFrom(c);
  CHECK(e.size() == 128 && std::memcmp(e.data(), c.data(), 128) == 0, "copyFrom");
  c.zero();
  CHECK(c.data()[0] == 0 && e.data()[0] == 'P', "zero");
  Buffer moved = std::move(e);
  CHECK(moved.size() == 128 && e.size() == 0 && e.data() == nullptr, "move");
}
} // namespace

// The progress lines' tokens per sample: the first field of integer ids with
// one dimension per sample; none for images with class labels.
void testTokensPerSample() {
  auto field = [](int dtype, std::vector<int64_t> shape) {
    pipec::io::FieldSpec f;
    f.dtype = static_cast<pipec_dtype>(dtype);
    f.shape = std::move(shape);
    return f;
  };
  Plan p;
  p.dataFields = {field(PIPEC_I64, {16}), field(PIPEC_I64, {16})};
  CHECK(p.tokensPerSample() == 16, "token ids [16]: " << p.tokensPerSample());
  p.dataFields = {field(PIPEC_F32, {3, 16, 16}), field(PIPEC_I64, {})};
  CHECK(p.tokensPerSample() == 0, "image and class label: " << p.tokensPerSample());
  p.dataFields = {field(PIPEC_F32, {32}), field(PIPEC_I32, {128})};
  CHECK(p.tokensPerSample() == 128, "features then ids [128]: " << p.tokensPerSample());
}

// The synthetic data set's bytes, pinned (docs/dataset-format.md, "Synthetic
// default"): a run on synthetic data reads what runs before it read, and a
// CUDA rank, which generates them on the device from the same definition
// (pipec/synthetic_data.h; cuda-synthetic-data-emulated compares the two),
// reads the same. The host device generates nothing (it reads them).
void testSyntheticDataPinned() {
  auto field = [](const char *name, int dtype, std::vector<int64_t> shape, double low, double high) {
    pipec::io::FieldSpec f;
    f.name = name, f.dtype = dtype, f.shape = std::move(shape), f.low = low, f.high = high;
    return f;
  };
  const std::vector<pipec::io::FieldSpec> fields{field("x", PIPEC_F32, {3, 5}, -2.5, 7.0),
                                                 field("d", PIPEC_F64, {4}, -1.0, 1.0),
                                                 field("l", PIPEC_I64, {2}, 0, 10), field("m", PIPEC_I32, {3}, -5, 5),
                                                 field("b", PIPEC_BOOL, {7}, 0, 2)};
  pipec::io::SyntheticData data(fields, 11, 1234);
  uint64_t hash = 1469598103934665603ULL; // FNV-1a of samples 5..21 (wrapping at 11) of every field
  for (size_t f = 0; f < fields.size(); ++f) {
    std::vector<unsigned char> bytes(fields[f].sampleBytes() * 17);
    data.read(f, 5, 17, bytes.data());
    for (unsigned char c : bytes) hash = (hash ^ c) * 1099511628211ULL;
  }
  CHECK(hash == 0x4920ad1c501673aaULL, "synthetic data changed: FNV-1a " << std::hex << hash);
  std::string error;
  try {
    float out[15];
    hostDevice().generateSynthetic(data.valuesOf(0), 0, 1, out);
  } catch (const Error &e) {
    error = e.what();
  }
  CHECK(contains(error, "only CUDA devices"), "the host device generated synthetic data: " << error);
}

int main() {
  const fs::path root = scratch();
  try {
    testPlanKeys(root);
    testTransferOrder();
    testGeneratedSchedules(root);
    testHostDevice();
    testTensorAndDataReaders(root);
    testStageLibraryCheck(root);
    testPlanAgainstSchedule(root);
    testCheckpointManifest(root);
    testTokensPerSample();
    testSyntheticDataPinned();
  } catch (const std::exception &e) {
    std::cerr << "FAIL: unexpected exception: " << e.what() << "\n";
    ++failures;
  }
  fs::remove_all(root);
  if (failures) {
    std::cerr << "runtime_unit: " << failures << " failure(s)\n";
    return 1;
  }
  std::cout << "runtime_unit: OK\n";
  return 0;
}
