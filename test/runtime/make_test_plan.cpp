// Writes a plan directory for the tiny MLP stage libraries: plan.json (the
// pipeline, stages[].ranks and runtime members of docs/plan-json.md, through
// pipec's writer, pipec/job_plan.h),
// schedule/rank_<r>.json from the schedule library, and initial weights.
//   make_test_plan --out DIR --libs DIR/libtiny_<cfg>_stage_ --schedule NAME
//     --stages P --microbatches M --dims 6,8,4 --batch 4 [--chunks V]
//     [--replicas 2,1] [--vertical-sync] [--recompute] [--in-flight N]
//     [--optimizer sgd|adamw] [--lr X] [--momentum X] [--max-grad-norm X]
//     [--reverse-ranks] [--seed S] [--no-data-fields]
//     [--tied [--tied-plan-name NAME]]
// --tied: the tiny libraries built with TINY_TIED share "tied.weight"
// between the first and last virtual stage: both weights files get the same
// initial value and runtime.tied lists it (under NAME if given, to test the
// error for a parameter the libraries lack).
#include "analysis/Schedule/Schedule.h"
#include "pipec/dataset.h"
#include "pipec/job_plan.h"

#include <cstdio>
#include <nlohmann/json.hpp>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <sstream>

namespace fs = std::filesystem;
using nlohmann::json;
namespace sch = pipec::schedule;

static std::vector<int> ints(const std::string &s) {
  std::vector<int> v;
  std::stringstream ss(s);
  for (std::string t; std::getline(ss, t, ',');) v.push_back(std::stoi(t));
  return v;
}

static uint64_t mix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

int main(int argc, char **argv) {
  std::string out, libs, name = "1f1b", optimizer = "sgd";
  sch::Problem prob;
  prob.stages = 2;
  prob.microbatches = 4;
  std::vector<int> dims{6, 8, 4};
  int batch = 4;
  double lr = 0.05, momentum = 0.9, clip = 0;
  bool reverse = false, dataFields = true, tied = false;
  std::string tiedPlanName = "tied.weight";
  uint64_t seed = 7;
  std::string datasetPath;
  int datasetSamples = 0;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto v = [&] { return std::string(argv[++i]); };
    if (a == "--out") out = v();
    else if (a == "--libs") libs = v();
    else if (a == "--schedule") name = v();
    else if (a == "--stages") prob.stages = std::stoi(v());
    else if (a == "--microbatches") prob.microbatches = std::stoi(v());
    else if (a == "--chunks") prob.chunks = std::stoi(v());
    else if (a == "--replicas") prob.replicas = ints(v());
    else if (a == "--vertical-sync") prob.verticalSync = true;
    else if (a == "--recompute") prob.recompute = {1};
    else if (a == "--in-flight") prob.inFlight = std::stoi(v());
    else if (a == "--dims") dims = ints(v());
    else if (a == "--batch") batch = std::stoi(v());
    else if (a == "--optimizer") optimizer = v();
    else if (a == "--lr") lr = std::stod(v());
    else if (a == "--momentum") momentum = std::stod(v());
    else if (a == "--max-grad-norm") clip = std::stod(v());
    else if (a == "--reverse-ranks") reverse = true;
    else if (a == "--seed") seed = std::stoull(v());
    else if (a == "--no-data-fields") dataFields = false;
    else if (a == "--tied") tied = true;
    else if (a == "--tied-plan-name") tiedPlanName = v();
    else if (a == "--write-dataset") datasetPath = v(), datasetSamples = std::stoi(v());
    else {
      std::cerr << "make_test_plan: unknown option " << a << "\n";
      return 2;
    }
  }
  try {
    const sch::Schedule s = sch::generate(name, prob);
    const int p = s.problem.stages, V = s.virtualStages(), R = s.problem.numRanks();
    if ((int)dims.size() != V + 1) throw std::runtime_error("--dims needs virtual stages + 1 widths");
    fs::create_directories(fs::path(out) / "schedule");
    fs::create_directories(fs::path(out) / "weights");
    for (int r = 0; r < R; ++r) std::ofstream(fs::path(out) / "schedule" / ("rank_" + std::to_string(r) + ".json")) << sch::rankToJson(s, r);

    // plan.json through pipec's own writer (pipec/job_plan.h).
    pipec::plan::PlanFile plan;
    plan.pipeline.schedule = sch::requireScheduleFamily(s.name).kind;
    plan.pipeline.microbatches = s.problem.microbatches;
    plan.pipeline.chunks = s.problem.chunks;
    plan.pipeline.placement = s.placement;
    plan.pipeline.asynchronous = s.asynchronous;
    // MPI rank of schedule rank r: identity, or reversed to check that piperun
    // maps through stages[].ranks instead of assuming the schedule's numbering.
    // One entry per virtual stage (model order), with its position's ranks.
    plan.stages.resize(V);
    for (int st = 0; st < p; ++st) {
      std::vector<int> ranks;
      for (int q = 0; q < s.problem.replicasOf(st); ++q) {
        const int r = s.problem.rankOf(st, q);
        ranks.push_back(reverse ? R - 1 - r : r);
      }
      for (int c = 0; c < s.problem.chunks; ++c) {
        const int vs = pipec::virtualStage(plan.pipeline.placement, p, st, c);
        plan.stages[vs].id = vs;
        plan.stages[vs].replicas = s.problem.replicasOf(st);
        plan.stages[vs].ranks = ranks;
      }
    }
    pipec::plan::Runtime runtime;
    if (tied && (dims.back() != dims.front() || dims[V - 1] != dims[1]))
      throw std::runtime_error("--tied needs widths d0,d1,...,d1,d0");
    pipec::io::Tensor tiedInit;
    for (int vs = 0; vs < V; ++vs) {
      // Deterministic initial weights, uniform in +-1/sqrt(fan_in).
      const int din = dims[vs], dout = dims[vs + 1];
      const bool isTied = tied && (vs == 0 || vs == V - 1);
      pipec::io::Tensor w{isTied ? "tied.weight" : "fc" + std::to_string(vs) + ".weight", PIPEC_F32, {dout, din}, {}};
      pipec::io::Tensor b{"fc" + std::to_string(vs) + ".bias", PIPEC_F32, {dout}, {}};
      w.data.resize(w.bytes());
      b.data.resize(b.bytes());
      for (int k = 0; k < dout * din + dout; ++k) {
        const double u = (double)(mix64(seed * 1000003ULL + vs * 7919ULL + k) >> 11) / 9007199254740992.0;
        const float x = (float)((2 * u - 1) / std::sqrt((double)din));
        if (k < dout * din) ((float *)w.data.data())[k] = x;
        else ((float *)b.data.data())[k - dout * din] = x;
      }
      if (isTied && vs == 0) tiedInit = w;
      if (isTied && vs == V - 1) w = tiedInit; // the last stage holds the same [d1, d0] tensor, used transposed
      pipec::io::writeTensorFile((fs::path(out) / "weights" / ("stage_" + std::to_string(vs) + ".bin")).string(), {w, b});
      runtime.stages.push_back({vs, libs + std::to_string(vs) + ".so", "weights/stage_" + std::to_string(vs) + ".bin"});
    }
    if (dataFields) {
      runtime.dataFields.push_back({"x", "f32", {dims.front()}, -1.0, 1.0});
      runtime.dataFields.push_back({"y", "f32", {dims.back()}, -0.5, 0.5});
    }
    if (!pipec::parseChoice(optimizer, runtime.optimizer.rule)) {
      std::fprintf(stderr, "make_test_plan: --optimizer %s: expected %s\n", optimizer.c_str(),
                   pipec::choiceNames<pipec::Optimizer>(" or ").c_str());
      return 2;
    }
    runtime.optimizer.lr = lr;
    runtime.optimizer.momentum = momentum;
    runtime.optimizer.weightDecay = 0.01;
    if (clip > 0) runtime.optimizer.maxGradNorm = clip;
    runtime.microbatchSize = batch;
    runtime.seed = 11;
    runtime.syntheticSamples = 64;
    if (tied) runtime.tied.push_back({tiedPlanName, {0, V - 1}});
    plan.runtime = runtime;
    std::ofstream(fs::path(out) / "plan.json") << pipec::plan::toJson(plan).dump(1) << "\n";
    if (!datasetPath.empty()) {
      // A data set file whose values differ from the synthetic default.
      std::vector<pipec::io::FieldSpec> f(2);
      f[0].name = "x", f[0].shape = {dims.front()};
      f[1].name = "y", f[1].shape = {dims.back()};
      std::vector<std::vector<char>> d(2);
      for (int i = 0; i < 2; ++i) {
        d[i].resize(f[i].sampleBytes() * datasetSamples);
        float *v = (float *)d[i].data();
        for (size_t k = 0; k < d[i].size() / 4; ++k) v[k] = (float)std::sin(0.37 * k + i) * (i ? 0.5f : 1.0f);
      }
      pipec::io::writeDataset(datasetPath, f, datasetSamples, d);
    }
  } catch (const std::exception &e) {
    std::cerr << "make_test_plan: " << e.what() << "\n";
    return 1;
  }
  return 0;
}
