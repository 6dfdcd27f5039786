// pipeseq: the single-process reference for piperun (design.md section 5,
// "a single-process run of the same generated code"). It loads every stage
// library of a plan into one process and trains without MPI:
//  * synchronous plans: plain single-device training. Each iteration runs the
//    m micro-batches one after the other through all stages (forward, then
//    backward in reverse), sums their gradients, averages them and steps.
//    The schedule files are not read at all, so this is an oracle for every
//    synchronous schedule (GPipe, 1F1B, interleaved, ZB-*, replicated stages).
//  * asynchronous plans (1F1B-RR): PipeDream's semantics. Only the order of
//    FWD/BWD/ALLREDUCE/STEP on each rank is taken from the streams; the weight
//    version of every compute is derived from the semantics (the backward of a
//    micro-batch uses the weights its forward used; with vertical sync every
//    stage uses the version current when the micro-batch entered stage 0),
//    never from the STASH/RESTORE instructions piperun executes.
// Usage: pipeseq PLAN_DIR --iters N [--data FILE] [--export-weights DIR] [--resume DIR] [--seed S]
//          [--lr X] [--weight-decay X] [--momentum X] [--max-grad-norm X] [--allow-nonfinite]
// Options and hyper-parameters are read and checked by the same code as
// piperun's (CommandLine.h, JobCheck.h).
#include "CommandLine.h"
#include "JobCheck.h"
#include "Plan.h"
#include "DataSource.h"
#include "SafetensorsExport.h"
#include "StageModel.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>

using namespace pipec;
using namespace pipec::rt;
namespace fs = std::filesystem;

namespace {
// One micro-batch's buffers on one stage.
struct MbState {
  Buffer data, inputs, outputs, gradOutputs, gradInputs, workspace;
  int64_t step = 0;
  std::shared_ptr<Buffer> weights; // the version its forward used (asynchronous)
};

struct Runner {
  const Plan &plan;
  RunOptions opt;
  uint64_t seed;
  OptimizerConfig optimizer; // plan.json's with the overrides, checked
  std::unique_ptr<io::DataSource> data;
  Validation validation; // --eval-data
  int V;

  Runner(const Plan &p, const RunOptions &o) : plan(p), opt(o), V(p.stages * p.chunks) {
    optimizer = resolveOptimizer(p, o.optimizer);
    seed = o.seedSet ? o.seed : p.seed;
    data = openDataSource(p, o.dataFile, o.dataDtype, seed);
    validation = openValidation(p, o.evalDataFile, o.evalEvery, o.evalIters, o.dataDtype, seed);
  }

  std::unique_ptr<StageModel> makeModel(int vs) {
    auto m = std::make_unique<StageModel>(plan, plan.vstages[vs]);
    m->loadWeights(plan.vstages[vs].weights);
    return m;
  }

  void alloc(StageModel &m, MbState &s) {
    s.data.resize(m.dataLayout().total);
    s.inputs.resize(m.inputLayout().total);
    s.gradInputs.resize(m.inputLayout().total);
    s.outputs.resize(m.outputLayout().total);
    s.gradOutputs.resize(m.outputLayout().total);
    s.workspace.resize((size_t)m.desc().workspace_bytes);
  }

  void load(StageModel &m, MbState &s, int64_t globalMb, io::DataSource *source = nullptr) {
    io::DataSource *from = source ? source : data.get();
    const pipec_stage_desc &d = m.desc();
    for (int i = 0; i < d.num_data; ++i) {
      if (!from) throw Error("no data: pass --data or give runtime.data.fields");
      const int f = from->fieldIndex(d.data[i].name);
      if (f < 0) throw Error(from->describe() + ": no field named " + d.data[i].name);
      from->read(f, (uint64_t)globalMb * plan.microbatchSize, plan.microbatchSize, s.data.data() + m.dataLayout().offsets[i]);
    }
  }

  // Validation after iteration `it` (docs/runtime.md, "Validation"): every
  // held-out micro-batch through the stages in inference mode with the
  // current weights (models: one per virtual stage, in order).
  void validate(const std::vector<StageModel *> &models, int64_t it) {
    if (!validation.source || !((opt.evalEvery > 0 && (it + 1) % opt.evalEvery == 0) || it + 1 == opt.iters)) return;
    std::vector<MbState> st(models.size());
    for (size_t vs = 0; vs < models.size(); ++vs) alloc(*models[vs], st[vs]);
    double lossSum = 0;
    const int64_t count = validation.rounds * plan.microbatches;
    for (int64_t g = 0; g < count; ++g)
      for (size_t vs = 0; vs < models.size(); ++vs) {
        StageModel &m = *models[vs];
        st[vs].step = m.steps;
        load(m, st[vs], g, validation.source.get());
        if (vs > 0) copyPayload(st[vs].inputs, st[vs - 1].outputs);
        const float loss = call(m, st[vs], 0, g, m.params().data(), /*inference=*/true);
        if (vs + 1 == models.size()) lossSum += loss;
      }
    std::printf("pipeseq: validation after iter %lld/%d  loss %.6f  (%lld micro-batches of %lld, %s)\n",
                (long long)(it + 1), opt.iters, lossSum / (double)count, (long long)count,
                (long long)plan.microbatchSize, opt.evalDataFile.c_str());
  }

  // op: 0 forward, 1 backward (B then W). Returns the loss of a forward on the last stage.
  float call(StageModel &m, MbState &s, int op, int64_t globalMb, void *weights, bool inference = false) {
    std::vector<void *> params = m.paramLayout().pointers((char *)weights);
    std::vector<void *> dataP = m.dataLayout().pointers(s.data.data());
    std::vector<void *> in = m.inputLayout().pointers(s.inputs.data());
    std::vector<void *> out = m.outputLayout().pointers(s.outputs.data());
    std::vector<void *> gout = m.outputLayout().pointers(s.gradOutputs.data());
    std::vector<void *> gin = m.inputLayout().pointers(s.gradInputs.data());
    std::vector<void *> gp = m.gradPtrs();
    float loss = 0;
    pipec_call c{};
    c.step = s.step;
    c.microbatch = globalMb;
    c.seed = seed;
    c.params = params.data();
    c.data = (const void *const *)dataP.data();
    c.inputs = (const void *const *)in.data();
    c.outputs = out.data();
    c.grad_outputs = m.desc().num_outputs ? (const void *const *)gout.data() : nullptr;
    c.grad_inputs = gin.data();
    c.grad_params = gp.data();
    c.workspace = s.workspace.data();
    c.loss = &loss;
    c.loss_scale = 1.0f;
    c.inference = inference ? 1 : 0;
    if (op == 0) {
      m.lib().forward(c);
    } else {
      m.lib().backwardInput(c);
      m.lib().backwardWeight(c);
    }
    return loss;
  }

  static void copyPayload(Buffer &dst, const Buffer &src) {
    std::memcpy(dst.data() + 64, src.data() + 64, src.size() - 64);
  }

  // Tied parameters (runtime.tied): the single model's gradient is the sum
  // of every holder's partial gradient; each holder then steps its copy.
  // Returns, per model, the tied copies the global norm must not count again.
  std::vector<std::vector<bool>> sumTied(const std::vector<StageModel *> &models) {
    std::vector<std::vector<bool>> skip;
    for (StageModel *m : models) skip.emplace_back(m->desc().num_params, false);
    for (const TiedParam &tp : plan.tied) {
      std::vector<std::pair<StageModel *, int>> holders;
      for (size_t k = 0; k < models.size(); ++k)
        if (std::find(tp.stages.begin(), tp.stages.end(), models[k]->vstage().id) != tp.stages.end()) {
          const int i = models[k]->paramIndex(tp.name);
          if (i < 0) throw Error(models[k]->vstage().library + ": runtime.tied lists stage " +
                                 std::to_string(models[k]->vstage().id) + " as a holder of " + tp.name +
                                 ", but the stage library has no parameter of that name");
          const pipec_tensor_desc &td = models[k]->desc().params[i].tensor;
          if (td.dtype != PIPEC_F32) throw Error("pipeseq: tied parameter " + tp.name + " must be f32");
          if (!holders.empty()) {
            const pipec_tensor_desc &t0 = holders[0].first->desc().params[holders[0].second].tensor;
            if (shapeOf(td) != shapeOf(t0)) throw Error("pipeseq: runtime.tied: " + tp.name + " has different shapes");
            skip[k][i] = true;
          }
          holders.push_back({models[k], i});
        }
      auto ptr = [](std::pair<StageModel *, int> h) {
        return (float *)(h.first->grads().data() + h.first->paramLayout().offsets[h.second]);
      };
      const size_t n = holders[0].first->paramLayout().bytes[holders[0].second] / 4;
      float *g0 = ptr(holders[0]);
      for (size_t j = 1; j < holders.size(); ++j)
        for (size_t e = 0; e < n; ++e) g0[e] += ptr(holders[j])[e];
      for (size_t j = 1; j < holders.size(); ++j) std::memcpy(ptr(holders[j]), g0, n * 4);
    }
    return skip;
  }

  // A NaN/inf loss or gradient stops the reference too, unless allowed.
  void checkLoss(float loss, int64_t it, int mb) const {
    if (!std::isfinite(loss) && !opt.allowNonFinite)
      throw Error("the loss of micro-batch " + std::to_string(mb) + " is not finite in iteration " +
                  std::to_string(it) + "; training stopped (--allow-nonfinite continues)");
  }

  void step(std::vector<StageModel *> models, double count, int64_t it) {
    bool skip = false;
    for (StageModel *m : models) m->scaleGrads(1.0 / count);
    const auto noNorm = sumTied(models);
    if (!opt.allowNonFinite) {
      double sumSq = 0, bad = 0;
      for (size_t k = 0; k < models.size(); ++k) models[k]->gradStats(sumSq, bad);
      if (bad > 0)
        throw Error("non-finite gradients at the optimizer step of iteration " + std::to_string(it) +
                    "; training stopped (--allow-nonfinite continues)");
    }
    if (optimizer.maxGradNorm > 0) {
      double sumSq = 0, nonFinite = 0;
      for (size_t k = 0; k < models.size(); ++k) models[k]->gradStats(sumSq, nonFinite, &noNorm[k]);
      const double norm = std::sqrt(sumSq);
      if (nonFinite > 0)
        skip = true;
      else if (norm > optimizer.maxGradNorm)
        for (StageModel *m : models) m->scaleGrads(optimizer.maxGradNorm / norm);
    }
    for (StageModel *m : models) {
      if (!skip) m->applyStep(optimizer);
      m->grads().zero();
    }
  }

  int64_t resume(std::vector<StageModel *> models) {
    if (opt.resumeDir.empty()) return 0;
    const CheckpointManifest m = readCheckpointManifest(opt.resumeDir, plan, opt.iters, seed);
    const CheckpointTensors tensors(m, [&](const std::string &name) {
      return std::any_of(models.begin(), models.end(),
                         [&](const StageModel *s) { return s->holdsCheckpointTensor(name); });
    });
    for (StageModel *s : models) s->loadCheckpoint(tensors);
    return m.iteration;
  }

  void exportWeights(const std::vector<StageModel *> &models) {
    if (opt.exportDir.empty()) return;
    if (isSafetensorsPath(opt.exportDir)) {
      std::vector<std::vector<io::Tensor>> stages;
      for (StageModel *m : models) stages.push_back(m->weightTensors());
      writeSafetensors(opt.exportDir, stages);
      return;
    }
    fs::create_directories(opt.exportDir);
    for (StageModel *m : models)
      io::writeTensorFile((fs::path(opt.exportDir) / ("stage_" + std::to_string(m->vstage().id) + ".bin")).string(),
                          m->weightTensors());
  }

  // ------------------------------------------------------------ synchronous
  void runSync() {
    std::vector<std::unique_ptr<StageModel>> owned;
    std::vector<StageModel *> models;
    for (int vs = 0; vs < V; ++vs) owned.push_back(makeModel(vs)), models.push_back(owned.back().get());
    const int64_t start = resume(models);
    std::vector<MbState> st(V);
    for (int vs = 0; vs < V; ++vs) alloc(*models[vs], st[vs]);
    for (int64_t it = start; it < opt.iters; ++it) {
      double lossSum = 0;
      for (int mb = 0; mb < plan.microbatches; ++mb) {
        const int64_t g = it * plan.microbatches + mb;
        for (int vs = 0; vs < V; ++vs) {
          StageModel &m = *models[vs];
          st[vs].step = m.steps;
          load(m, st[vs], g);
          if (vs > 0) copyPayload(st[vs].inputs, st[vs - 1].outputs);
          const float loss = call(m, st[vs], 0, g, m.params().data());
          if (vs == V - 1) checkLoss(loss, it, mb), lossSum += loss;
        }
        for (int vs = V - 1; vs >= 0; --vs) {
          if (vs < V - 1) copyPayload(st[vs].gradOutputs, st[vs + 1].gradInputs);
          call(*models[vs], st[vs], 1, g, models[vs]->params().data());
        }
      }
      step(models, plan.microbatches, it);
      std::printf("pipeseq: iter %lld/%d  loss %.6f\n", (long long)(it + 1), opt.iters, lossSum / plan.microbatches);
      validate(models, it);
    }
    exportWeights(models);
  }

  // ------------------------------------------------------------ asynchronous
  void runAsync() {
    if (plan.chunks != 1) throw Error("pipeseq: asynchronous plans have one chunk per rank");
    if (!plan.tied.empty()) throw Error("pipeseq: tied parameters (runtime.tied) are not supported with asynchronous schedules");
    const int R = plan.numRanks();
    std::vector<RankStream> streams;
    std::vector<std::unique_ptr<StageModel>> models;
    for (int r = 0; r < R; ++r) {
      streams.push_back(loadPlanStream(plan, r));
      models.push_back(makeModel(plan.stageOfScheduleRank(r)));
    }
    std::vector<StageModel *> replica0;
    for (int s = 0; s < plan.stages; ++s) replica0.push_back(models[plan.scheduleRank(s, 0)].get());
    const int64_t start = resume(replica0);
    for (int r = 0; r < R; ++r) // replicas start from replica 0's checkpoint
      if (plan.replicaOfScheduleRank(r) != 0 && !opt.resumeDir.empty()) {
        StageModel *src = replica0[plan.stageOfScheduleRank(r)];
        models[r]->restore(src->snapshot());
      }
    bool vsync = false;
    for (const RankStream &s : streams)
      for (const Instr &in : s.instrs) vsync |= in.version >= 0;

    for (int64_t it = start; it < opt.iters; ++it) {
      // Shared "wires": the bundle each (mb, vs) produced.
      std::map<std::pair<int, int>, Buffer> act, grad;
      std::map<int, int> entry;                     // vertical sync: entry version per micro-batch
      std::vector<std::map<int, MbState>> mbs(R);   // per rank
      std::vector<std::map<int, std::shared_ptr<Buffer>>> versions(R); // vertical sync history
      std::vector<double> count(R, 0), reduced(R, -1);
      std::vector<size_t> pc(R, 0);
      double lossSum = 0;
      auto current = [&](int r) {
        auto b = std::make_shared<Buffer>();
        b->copyFrom(models[r]->params());
        return b;
      };
      for (int r = 0; r < R; ++r) versions[r][(int)(plan.replicasOf(plan.stageOfScheduleRank(r)) * models[r]->steps)] = current(r);
      for (bool progress = true; progress;) {
        progress = false;
        for (int r = 0; r < R; ++r) {
          const int st = plan.stageOfScheduleRank(r), Rs = plan.replicasOf(st);
          StageModel &m = *models[r];
          while (pc[r] < streams[r].instrs.size()) {
            const Instr &in = streams[r].instrs[pc[r]];
            const int64_t g = it * plan.microbatches + in.mb;
            if (in.op == Op::Fwd) {
              if (st > 0 && !act.count({in.mb, st - 1})) break;
              MbState &s = mbs[r][in.mb];
              alloc(m, s);
              s.step = m.steps;
              if (vsync) {
                if (st == 0) entry[in.mb] = (int)(Rs * m.steps);
                const int w = Rs * (entry.at(in.mb) / Rs);
                if (!versions[r].count(w)) throw Error("rank " + std::to_string(r) + " lacks version " + std::to_string(w));
                s.weights = versions[r][w];
              } else {
                s.weights = current(r);
              }
              load(m, s, g);
              if (st > 0) copyPayload(s.inputs, act.at({in.mb, st - 1}));
              const float loss = call(m, s, 0, g, s.weights->data());
              if (st == plan.stages - 1) checkLoss(loss, it, in.mb), lossSum += loss;
              act[{in.mb, st}].copyFrom(s.outputs);
            } else if (in.op == Op::Bwd) {
              if (st < plan.stages - 1 && !grad.count({in.mb, st + 1})) break;
              MbState &s = mbs[r].at(in.mb);
              if (st < plan.stages - 1) copyPayload(s.gradOutputs, grad.at({in.mb, st + 1}));
              call(m, s, 1, g, s.weights->data());
              grad[{in.mb, st}].copyFrom(s.gradInputs);
              mbs[r].erase(in.mb);
              count[r] += 1;
            } else if (in.op == Op::AllReduce) {
              // Ready when every replica of the stage is at an ALLREDUCE.
              bool all = true;
              for (int q = 0; q < Rs; ++q) {
                const int rq = plan.scheduleRank(st, q);
                all &= pc[rq] < streams[rq].instrs.size() && streams[rq].instrs[pc[rq]].op == Op::AllReduce;
              }
              if (!all) break;
              StageModel &m0 = *models[plan.scheduleRank(st, 0)];
              Buffer sum;
              sum.copyFrom(m0.grads());
              double total = count[plan.scheduleRank(st, 0)];
              for (int q = 1; q < Rs; ++q) {
                const int rq = plan.scheduleRank(st, q);
                Buffer &gq = models[rq]->grads();
                for (size_t k = 0; k < sum.size() / 4; ++k) ((float *)sum.data())[k] += ((float *)gq.data())[k];
                total += count[rq];
              }
              for (int q = 0; q < Rs; ++q) {
                const int rq = plan.scheduleRank(st, q);
                models[rq]->grads().copyFrom(sum);
                reduced[rq] = total;
                ++pc[rq];
              }
              progress = true;
              continue;
            } else if (in.op == Op::Step) {
              step({&m}, reduced[r] >= 0 ? reduced[r] : count[r], it);
              count[r] = 0, reduced[r] = -1;
              if (vsync) versions[r][(int)(Rs * m.steps)] = current(r);
            }
            ++pc[r];
            progress = true;
          }
        }
      }
      for (int r = 0; r < R; ++r)
        if (pc[r] != streams[r].instrs.size())
          throw Error("pipeseq: the streams deadlock (rank " + std::to_string(r) + " at #" + std::to_string(pc[r]) + ")");
      std::printf("pipeseq: iter %lld/%d  loss %.6f\n", (long long)(it + 1), opt.iters, lossSum / plan.microbatches);
      validate(replica0, it);
    }
    exportWeights(replica0);
  }
};
} // namespace

int main(int argc, char **argv) {
  RunOptions o;
  const CommandLine line = parseCommandLine(Tool::Pipeseq, argc, argv, o);
  if (line.outcome == CommandLine::Help) {
    std::fputs(line.help.c_str(), stdout);
    return 0;
  }
  if (line.outcome == CommandLine::Invalid) {
    std::fprintf(stderr, "pipeseq: error: %s\n%s", line.error.c_str(), line.help.c_str());
    return 1;
  }
  try {
    const Plan plan = loadPlan(o.planDir);
    if (plan.target != Target::Cpu) // its stage libraries take device pointers and a CUDA stream
      throw Error(plan.planPath + ": runtime.target is \"" + choiceName(plan.target) +
                  "\"; pipeseq runs stage libraries on the CPU only: compile the model with --target cpu for the "
                  "reference");
    // The streams must agree with plan.json even where the sequential
    // reference does not follow them (synchronous plans).
    for (int r = 0; r < plan.numRanks(); ++r) loadPlanStream(plan, r);
    Runner run(plan, o);
    if (plan.asynchronous)
      run.runAsync();
    else
      run.runSync();
  } catch (const std::exception &e) {
    std::fprintf(stderr, "pipeseq: error: %s\n", e.what());
    return 1;
  }
  return 0;
}
