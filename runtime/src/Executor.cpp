#include "Executor.h"

#include "JobCheck.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <sstream>

namespace pipec::rt {
namespace fs = std::filesystem;
using nlohmann::json;

namespace {
constexpr uint64_t kBundleMagic = 0x31454c444e554250ULL; // "PBUNDLE1"

double now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

std::string tensorList(const pipec_tensor_desc *d, int n) {
  std::string s;
  for (int i = 0; i < n; ++i) s += (i ? ", " : "") + std::string(io::dtypeName(d[i].dtype)) + io::shapeString(shapeOf(d[i]));
  return "[" + s + "]";
}
} // namespace

struct Executor::Slot {
  int mb = -1;
  Buffer data, inputs, outputs, gradOutputs, gradInputs;
  std::unique_ptr<Buffer> workspace;
  bool dataLoaded = false, haveInputs = false, haveGradOutputs = false, fwdDone = false, bDone = false,
       wDone = false, gradHandedOff = false;
  int64_t fwdStep = 0;
  // Sends from this slot's buffers. MPI: waited for before the slot is
  // returned. CUDA: kept when it is returned, and the next micro-batch's
  // writers wait for them on the device (no host sync).
  std::vector<Transport::Request> sends;
  // CUDA target. On the compute stream: `ready` (the slot's buffers may be
  // written: after their previous readers and the pending sends),
  // `outputsDone` / `gradInputsDone` (after the FWD / BWD_INPUT that filled
  // the bundle a SEND waits for), `dataStaged` (after the upload of the
  // data fields from `dataStage`). On a receiving stream: `inputsIn` /
  // `gradOutputsIn` (after the RECV that filled the bundle a compute waits for).
  Event ready = nullptr, outputsDone = nullptr, gradInputsDone = nullptr, dataStaged = nullptr, inputsIn = nullptr,
        gradOutputsIn = nullptr;
  bool inputsReceived = false, gradOutputsReceived = false;
  HostBuffer dataStage; // pinned
};

std::string Executor::who() const {
  return "rank " + std::to_string(control_.rank()) + " (stage " + std::to_string(stage_) + ", replica " +
         std::to_string(replica_) + ")";
}

void Executor::fail(const std::string &msg) const { throw Error(msg); }

Executor::Executor(const Plan &plan, const RunOptions &opt, Control &control, Transport &transport, Device &device)
    : plan_(plan), opt_(opt), optimizer_(plan.optimizer), control_(control), transport_(transport), device_(device),
      gpu_(!device.host()) {
  const int rank = control.rank();
  if (gpu_ != transport.streamOrdered())
    fail(std::string("internal: the ") + transport.name() + " transport cannot move buffers of the " + device.name() +
         " device");
  if (plan.numRanks() != control.size())
    fail(plan.planPath + ": the plan needs " + std::to_string(plan.numRanks()) + " ranks (stages[].ranks), mpirun started " +
         std::to_string(control.size()));
  for (int s = 0; s < plan.stages; ++s)
    for (int q = 0; q < plan.replicasOf(s); ++q)
      if (plan.ranks[s][q] == rank) stage_ = s, replica_ = q;
  scheduleRank_ = plan.scheduleRank(stage_, replica_);
  V_ = plan.stages * plan.chunks;
  seed_ = opt.seedSet ? opt.seed : plan.seed;
  // The plan's optimizer with the command line's overrides, every value
  // checked (the same code as pipeseq's).
  OptimizerOverrides overrides;
  if (opt.lrSet) overrides.lr = opt.lr;
  if (opt.wdSet) overrides.weightDecay = opt.weightDecay;
  if (opt.momentumSet) overrides.momentum = opt.momentum;
  if (opt.clipSet) overrides.maxGradNorm = opt.maxGradNorm;
  optimizer_ = resolveOptimizer(plan, overrides);
  if (plan.asynchronous && optimizer_.maxGradNorm > 0)
    fail(plan.planPath + ": max_grad_norm needs a global gradient norm, which an asynchronous schedule (" +
         plan.schedule + ") never has; set it to 0");

  // The instruction stream, checked against the plan before anything runs.
  // (loadPlanStream: rank, stage, replica, chunks, placement, schedule,
  // micro-batches, chunks and peers against plan.json and schedule.json.)
  stream_ = loadPlanStream(plan, scheduleRank_);
  if ((int64_t)plan.microbatches * 2 * V_ > transport.maxTag())
    fail(plan.planPath + ": " + std::to_string(plan.microbatches) + " micro-batches x " + std::to_string(V_) +
         " virtual stages exceed the transport's tag range");

  // Stage libraries, buffers, weights.
  chunks_.resize(plan.chunks);
  for (int c = 0; c < plan.chunks; ++c) {
    ChunkState &cs = chunks_[c];
    cs.vs = plan.virtualStage(stage_, c);
    cs.model = std::make_unique<StageModel>(plan, plan.vstages[cs.vs], device_);
    cs.model->loadWeights(plan.vstages[cs.vs].weights);
    cs.recomputes.assign(plan.microbatches, false);
    const pipec_stage_desc &d = cs.model->desc();
    cs.scratchOutputs = Buffer(device_, cs.model->outputLayout().total);
    cs.scratchWorkspace = Buffer(device_);
    if ((cs.vs == V_ - 1) != (d.computes_loss != 0))
      fail(cs.model->vstage().library + ": computes_loss is " + std::to_string(d.computes_loss) +
           " but the stage is " + (cs.vs == V_ - 1 ? "the last" : "not the last"));
  }
  for (const Instr &in : stream_.instrs)
    if (in.op == Op::Recompute) chunks_[in.chunk].recomputes[in.mb] = true;

  // Tied parameters: every holder chunk on this rank must have the
  // parameter, trained and floating-point (shapes are compared across ranks
  // in checkNeighbours).
  if (!plan.tied.empty() && plan.asynchronous)
    fail(plan.planPath + ": runtime.tied: tied parameters across stages (" + plan.tied[0].name +
         ") are not supported with an asynchronous schedule (" + plan.schedule +
         "): the holders step at different times, so their copies would diverge");
  normSkip_.assign(plan.chunks, {});
  for (int c = 0; c < plan.chunks; ++c) normSkip_[c].assign(chunks_[c].model->desc().num_params, false);
  for (size_t t = 0; t < plan.tied.size(); ++t) {
    const TiedParam &tp = plan.tied[t];
    TiedHolding h;
    h.tied = (int)t;
    for (int c = 0; c < plan.chunks; ++c) {
      ChunkState &cs = chunks_[c];
      if (std::find(tp.stages.begin(), tp.stages.end(), cs.vs) == tp.stages.end()) continue;
      const int i = cs.model->paramIndex(tp.name);
      const std::string lib = cs.model->vstage().library;
      if (i < 0)
        fail(lib + ": runtime.tied lists stage " + std::to_string(cs.vs) + " as a holder of " + tp.name +
             ", but the stage library has no parameter of that name");
      const pipec_param_desc &pd = cs.model->desc().params[i];
      if (pd.role != PIPEC_TRAINED)
        fail(lib + ": tied parameter " + tp.name + " is a buffer, not a trained parameter");
      if (pd.tensor.dtype != PIPEC_F32 && pd.tensor.dtype != PIPEC_F64)
        fail(lib + ": tied parameter " + tp.name + " must be f32 or f64, is " + io::dtypeName(pd.tensor.dtype));
      h.copies.push_back({c, i});
      normSkip_[c][i] = cs.vs != tp.stages.front(); // the global norm counts the first holder's copy
    }
    if (!h.copies.empty()) tied_.push_back(h);
  }

  // Data: every field a stage reads must exist with the stage's dtype and
  // per-sample shape (the stage's shape without the micro-batch dimension).
  bool needData = false;
  for (auto &cs : chunks_) needData |= cs.model->desc().num_data > 0;
  if (needData) {
    if (!opt.dataFile.empty())
      data_ = std::make_unique<io::DatasetFile>(opt.dataFile);
    else if (!plan.dataFields.empty())
      data_ = std::make_unique<io::SyntheticData>(plan.dataFields, plan.syntheticSamples, seed_);
    else
      fail(plan.planPath + ": runtime.data.fields is empty, so there is no synthetic data; pass --data FILE");
  }
  for (auto &cs : chunks_) {
    const pipec_stage_desc &d = cs.model->desc();
    dataFieldIndex_.emplace_back();
    for (int i = 0; i < d.num_data; ++i) {
      const int f = data_->fieldIndex(d.data[i].name);
      if (f < 0) fail(data_->describe() + ": no field named " + d.data[i].name + " (stage " + std::to_string(cs.vs) + " reads it)");
      const io::FieldSpec &fs = data_->fields()[f];
      std::vector<int64_t> want = shapeOf(d.data[i]);
      if (want.empty() || want[0] != plan.microbatchSize)
        fail(cs.model->vstage().library + ": data field " + d.data[i].name + " has shape " + io::shapeString(want) +
             ", whose first dimension should be the micro-batch size " + std::to_string(plan.microbatchSize));
      want.erase(want.begin());
      if (fs.dtype != d.data[i].dtype || fs.shape != want)
        fail(data_->describe() + ": field " + fs.name + " is " + io::dtypeName(fs.dtype) + io::shapeString(fs.shape) +
             " per sample, stage " + std::to_string(cs.vs) + " needs " + io::dtypeName(d.data[i].dtype) +
             io::shapeString(want));
      dataFieldIndex_.back().push_back(f);
    }
  }
  if (!opt.resumeDir.empty()) loadCheckpoint(opt.resumeDir);
}

Executor::~Executor() {
  if (gpu_) {
    // Normally drained by run(); after a start-up error nothing is in flight.
    for (auto &cs : chunks_)
      for (auto &s : cs.slots) {
        for (Event e : {s->ready, s->outputsDone, s->gradInputsDone, s->dataStaged, s->inputsIn, s->gradOutputsIn})
          if (e) device_.deleteEvent(e);
        s->ready = s->outputsDone = s->gradInputsDone = s->dataStaged = s->inputsIn = s->gradOutputsIn = nullptr;
      }
    for (Event e : allEvents_) device_.deleteEvent(e);
  }
}

void Executor::checkNeighbours() {
  control_.splitStage(stage_);
  // One communicator per tied parameter: all ranks of all its holders.
  // Collective over every rank, in plan order.
  for (size_t t = 0, k = 0; t < plan_.tied.size(); ++t) {
    const bool member = k < tied_.size() && tied_[k].tied == (int)t;
    const int g = control_.splitGroup(member);
    if (member) tied_[k++].group = g, connections_.groups.push_back(g);
  }
  // What each virtual stage sends and expects, so that a plan whose stage
  // libraries disagree fails at start-up instead of mid-run.
  json mine = json::array();
  for (auto &cs : chunks_) {
    const pipec_stage_desc &d = cs.model->desc();
    json tiedDescs = json::object(); // tied parameter name -> "f32[4x8]"
    for (const TiedParam &tp : plan_.tied) {
      const int i = cs.model->paramIndex(tp.name);
      if (i >= 0 && std::find(tp.stages.begin(), tp.stages.end(), cs.vs) != tp.stages.end())
        tiedDescs[tp.name] = tensorList(&d.params[i].tensor, 1);
    }
    mine.push_back({cs.vs, tensorList(d.inputs, d.num_inputs), tensorList(d.outputs, d.num_outputs),
                    cs.model->vstage().library, tiedDescs});
  }
  // And the point-to-point transfers of its stream, in order.
  json transfers = json::array();
  for (const Transfer &t : transfersOf(stream_)) transfers.push_back({(int)t.op, t.mb, t.chunk, t.peer, t.index});
  const json me{{"rank", scheduleRank_}, {"path", stream_.path}, {"chunks", mine}, {"transfers", transfers}};
  std::vector<std::string> ins(V_), outs(V_), libs(V_);
  std::vector<json> tiedOf(V_);
  const int R = plan_.numRanks();
  std::vector<std::vector<Transfer>> transfersOfRank(R);
  std::vector<std::string> paths(R);
  for (const std::string &s : control_.allgatherStrings(me.dump())) {
    const json r = json::parse(s);
    for (const json &e : r["chunks"]) {
      const int vs = e[0];
      ins[vs] = e[1], outs[vs] = e[2], libs[vs] = e[3], tiedOf[vs] = e[4];
    }
    const int sr = r["rank"];
    paths[sr] = r["path"];
    for (const json &t : r["transfers"]) transfersOfRank[sr].push_back({(Op)t[0].get<int>(), t[1], t[2], t[3], t[4]});
  }
  // Who sends to whom (world ranks): the NCCL transport's communicators.
  connections_.pairs.clear();
  for (int r = 0; r < R; ++r)
    for (const Transfer &t : transfersOfRank[r])
      if (t.op == Op::SendAct || t.op == Op::SendGrad) connections_.pairs.push_back({plan_.mpiRankOf(r), plan_.mpiRankOf(t.peer)});
  std::sort(connections_.pairs.begin(), connections_.pairs.end());
  connections_.pairs.erase(std::unique(connections_.pairs.begin(), connections_.pairs.end()), connections_.pairs.end());
  for (int vs = 0; vs + 1 < V_; ++vs)
    if (outs[vs] != ins[vs + 1])
      fail(libs[vs] + " outputs " + outs[vs] + " but " + libs[vs + 1] + " expects inputs " + ins[vs + 1]);
  // Every holder of a tied parameter has it with the same dtype and shape.
  for (const TiedParam &tp : plan_.tied) {
    const int first = tp.stages.front();
    for (int vs : tp.stages)
      if (tiedOf[vs].value(tp.name, "") != tiedOf[first].value(tp.name, ""))
        fail(plan_.planPath + ": runtime.tied: " + tp.name + " is " + tiedOf[first].value(tp.name, "?") + " in " +
             libs[first] + " but " + tiedOf[vs].value(tp.name, "?") + " in " + libs[vs]);
  }
  // Every pair of ranks sends and receives the same bundles in the same order
  // (NCCL needs it; under MPI's blocking rendezvous semantics, which the
  // schedules are validated for, it is implied). Each rank checks the pairs
  // it receives on, so a mismatch is reported once, by the receiver.
  const std::string order = checkTransferOrder(plan_, transfersOfRank, paths, scheduleRank_);
  if (!order.empty()) fail(order);
  // A stream order that cannot complete is a start-up error instead of a
  // hang (every rank finds it; rank 0 reports it, and all exit).
  const std::string deadlock = findTransferDeadlock(plan_, transfersOfRank, paths);
  if (!deadlock.empty() && control_.rank() == 0) fail(deadlock);
}

void Executor::connect() { transport_.connect(connections_); }

// ---------------------------------------------------------------- buffers
Executor::Slot &Executor::slot(int chunk, int mb, bool create) {
  ChunkState &cs = chunks_[chunk];
  auto it = cs.active.find(mb);
  if (it != cs.active.end()) return *it->second;
  if (!create) fail("micro-batch " + std::to_string(mb) + " has no state on chunk " + std::to_string(chunk) + " (no FWD or RECV_ACT before)");
  Slot *s;
  if (!cs.freeSlots.empty()) {
    s = cs.freeSlots.back();
    cs.freeSlots.pop_back();
  } else {
    auto fresh = std::make_unique<Slot>();
    const StageModel &m = *cs.model;
    for (Buffer *b : {&fresh->data, &fresh->inputs, &fresh->outputs, &fresh->gradOutputs, &fresh->gradInputs})
      *b = Buffer(device_);
    fresh->data.resize(m.dataLayout().total);
    if (m.desc().num_inputs) fresh->inputs.resize(m.inputLayout().total), fresh->gradInputs.resize(m.inputLayout().total);
    if (m.desc().num_outputs) fresh->outputs.resize(m.outputLayout().total), fresh->gradOutputs.resize(m.outputLayout().total);
    if (gpu_) {
      fresh->dataStage = HostBuffer(device_, m.dataLayout().total);
      for (Event *e : {&fresh->ready, &fresh->outputsDone, &fresh->gradInputsDone, &fresh->dataStaged, &fresh->inputsIn,
                       &fresh->gradOutputsIn})
        *e = device_.newEvent();
    }
    s = fresh.get();
    cs.slots.push_back(std::move(fresh));
  }
  s->mb = mb;
  s->dataLoaded = s->haveInputs = s->haveGradOutputs = s->fwdDone = s->bDone = s->wDone = s->gradHandedOff = false;
  if (gpu_) {
    // The new micro-batch's writers (compute, receives) wait until the sends
    // of the previous one left the buffers; `ready` marks that point (and the
    // allocation of a fresh slot) on the compute stream.
    for (Transport::Request r : s->sends) {
      device_.streamWait(nullptr, transport_.event(r));
      transport_.release(r);
    }
    device_.record(s->ready);
    s->inputsReceived = s->gradOutputsReceived = false;
  }
  s->sends.clear();
  cs.active[mb] = s;
  return *s;
}

std::unique_ptr<Buffer> Executor::takeWorkspace(int chunk) {
  ChunkState &cs = chunks_[chunk];
  if (!cs.freeWorkspaces.empty()) {
    auto w = std::move(cs.freeWorkspaces.back());
    cs.freeWorkspaces.pop_back();
    return w;
  }
  return std::make_unique<Buffer>(device_, (size_t)cs.model->desc().workspace_bytes);
}

void Executor::maybeRelease(int chunk, Slot &s) {
  ChunkState &cs = chunks_[chunk];
  if (!s.wDone || !(cs.vs == 0 || s.gradHandedOff)) return;
  if (!gpu_) { // CUDA: the sends stay with the slot (see slot())
    for (auto r : s.sends) transport_.wait(r);
    s.sends.clear();
  }
  if (s.workspace) cs.freeWorkspaces.push_back(std::move(s.workspace));
  cs.active.erase(s.mb);
  cs.freeSlots.push_back(&s);
}

void Executor::loadData(int chunk, Slot &s, int mb, int64_t it) {
  if (s.dataLoaded) return;
  const StageModel &m = *chunks_[chunk].model;
  const uint64_t first = (uint64_t)(it * plan_.microbatches + mb) * (uint64_t)plan_.microbatchSize;
  if (!gpu_) {
    for (int i = 0; i < m.desc().num_data; ++i)
      data_->read(dataFieldIndex_[chunk][i], first, plan_.microbatchSize, s.data.data() + m.dataLayout().offsets[i]);
  } else if (m.dataLayout().total) {
    // Read into the slot's pinned staging copy (once its previous upload is
    // done), upload on the compute stream: ordered after the slot's previous
    // readers and before this micro-batch's stage calls.
    device_.hostWait(s.dataStaged);
    for (int i = 0; i < m.desc().num_data; ++i)
      data_->read(dataFieldIndex_[chunk][i], first, plan_.microbatchSize, s.dataStage.data() + m.dataLayout().offsets[i]);
    device_.uploadAsync(s.data.data(), s.dataStage.data(), m.dataLayout().total);
    device_.record(s.dataStaged);
  }
  s.dataLoaded = true;
}

void *Executor::paramsFor(int chunk, int mb) {
  ChunkState &cs = chunks_[chunk];
  auto it = cs.pins.find(mb);
  if (it != cs.pins.end() && it->second.restored) return it->second.params->data();
  return cs.model->params().data();
}

void Executor::onOpTime(void *user, const char *op, int32_t phase, double seconds) {
  auto *self = (Executor *)user;
  OpTime &t = self->opTimes_[op];
  (phase == 0 ? t.f : phase == 1 ? t.b : t.w) += seconds;
}

// ---------------------------------------------------------------- compute
void Executor::compute(const Instr &in, int64_t it) {
  ChunkState &cs = chunks_[in.chunk];
  StageModel &m = *cs.model;
  const pipec_stage_desc &d = m.desc();
  const int vs = cs.vs;
  // A forward starts the micro-batch's state when nothing was received for
  // it: the first stage, or a chunk fed by a chunk of this same rank.
  const bool fedLocally = vs > 0 && plan_.vstages[vs - 1].stage == stage_;
  Slot &s = slot(in.chunk, in.mb, in.op == Op::Fwd && (vs == 0 || fedLocally));
  const std::string what = toString(in);

  std::vector<void *> params = m.paramLayout().pointers((char *)paramsFor(in.chunk, in.mb));
  std::vector<void *> data = m.dataLayout().pointers(s.data.data());
  std::vector<void *> inputs = m.inputLayout().pointers(s.inputs.data());
  std::vector<void *> outputs = m.outputLayout().pointers(s.outputs.data());
  std::vector<void *> gradOutputs = m.outputLayout().pointers(s.gradOutputs.data());
  std::vector<void *> gradInputs = m.inputLayout().pointers(s.gradInputs.data());
  std::vector<void *> gradParams = m.gradPtrs();
  float loss = 0;
  pipec_call c{};
  c.microbatch = it * plan_.microbatches + in.mb;
  c.seed = seed_;
  c.params = params.data();
  c.data = (const void *const *)data.data();
  c.inputs = (const void *const *)inputs.data();
  c.outputs = outputs.data();
  c.grad_outputs = d.num_outputs ? (const void *const *)gradOutputs.data() : nullptr;
  c.grad_inputs = gradInputs.data();
  c.grad_params = gradParams.data();
  c.loss = &loss;
  c.loss_scale = 1.0f; // gradients of the sum of micro-batch losses; STEP divides by their count
  c.stream = device_.computeStream();
  if (profiling_ && in.op != Op::Recompute) c.timer = &Executor::onOpTime, c.timer_user = this;

  // A neighbouring virtual stage on this same rank (interleaved/V placement)
  // hands its bundle over by copy instead of a message.
  auto localPrev = [&] { return vs > 0 && plan_.vstages[vs - 1].stage == stage_; };
  auto localNext = [&] { return vs + 1 < V_ && plan_.vstages[vs + 1].stage == stage_; };
  auto chunkOf = [&](int v) { return plan_.vstages[v].chunk; };

  switch (in.op) {
  case Op::Fwd: {
    if (s.fwdDone) fail(what + ": micro-batch computed twice");
    if (localPrev()) {
      Slot &p = slot(chunkOf(vs - 1), in.mb, false);
      if (!p.fwdDone) fail(what + ": forward before the previous chunk's forward");
      device_.copy(s.inputs.data() + 64, p.outputs.data() + 64, m.inputLayout().total - 64);
      s.haveInputs = true;
    }
    if (vs > 0 && !s.haveInputs) fail(what + ": forward before its input activation arrived");
    if (gpu_ && s.inputsReceived) device_.streamWait(nullptr, s.inputsIn); // the RECV_ACT, on the device
    if (d.num_data) loadData(in.chunk, s, in.mb, it);
    std::unique_ptr<Buffer> scratchHolder;
    if (cs.recomputes[in.mb]) {
      if (cs.scratchWorkspace.size() != (size_t)d.workspace_bytes) cs.scratchWorkspace.resize((size_t)d.workspace_bytes);
      c.workspace = cs.scratchWorkspace.data(); // kept only until RECOMPUTE re-creates it
    } else {
      s.workspace = takeWorkspace(in.chunk);
      c.workspace = s.workspace->data();
    }
    s.fwdStep = m.steps;
    c.step = s.fwdStep;
    m.lib().forward(c);
    if (gpu_) device_.record(s.outputsDone); // what SEND_ACT waits for
    s.fwdDone = true;
    if (d.computes_loss) {
      if (!std::isfinite(loss))
        nonFinite("the loss of micro-batch " + std::to_string(in.mb) + " (global micro-batch " +
                      std::to_string(c.microbatch) + ") is " + (std::isnan(loss) ? "NaN" : loss > 0 ? "+inf" : "-inf") +
                      " on stage " + std::to_string(vs),
                  it);
      lossSum_ += loss, lossCount_ += 1;
    }
    if (profiling_) ++fwdCalls_[in.chunk];
    break;
  }
  case Op::Recompute: {
    if (!s.fwdDone) fail(what + ": recompute before the forward");
    if (s.workspace) fail(what + ": recompute of a micro-batch whose activations are still held");
    s.workspace = takeWorkspace(in.chunk);
    c.workspace = s.workspace->data();
    std::vector<void *> scratchOut = m.outputLayout().pointers(cs.scratchOutputs.data());
    c.outputs = scratchOut.data(); // the sent outputs may still be in flight
    c.step = s.fwdStep;            // same dropout masks as the forward
    float discard = 0;
    c.loss = &discard;
    m.lib().forward(c);
    break;
  }
  case Op::Bwd:
  case Op::BwdInput:
  case Op::BwdWeight: {
    c.step = s.fwdStep;
    if (!s.fwdDone || !s.workspace)
      fail(what + ": backward before its forward" + (cs.recomputes[in.mb] ? std::string(" or RECOMPUTE") : ""));
    if (in.op != Op::BwdWeight) {
      if (s.bDone) fail(what + ": backward computed twice");
      if (localNext()) {
        Slot &n = slot(chunkOf(vs + 1), in.mb, false);
        if (!n.bDone) fail(what + ": backward before the next chunk's backward");
        device_.copy(s.gradOutputs.data() + 64, n.gradInputs.data() + 64, m.outputLayout().total - 64);
        s.haveGradOutputs = true;
        n.gradHandedOff = true;
        maybeRelease(chunkOf(vs + 1), n);
      }
      if (d.num_outputs && !s.haveGradOutputs) fail(what + ": backward before its output gradient arrived");
      if (gpu_ && s.gradOutputsReceived) device_.streamWait(nullptr, s.gradOutputsIn); // the RECV_GRAD
      c.workspace = s.workspace->data();
      m.lib().backwardInput(c);
      if (gpu_) device_.record(s.gradInputsDone); // what SEND_GRAD waits for
      s.bDone = true;
    }
    if (in.op != Op::BwdInput) {
      if (!s.bDone) fail(what + ": weight gradient before the input gradient");
      if (s.wDone) fail(what + ": weight gradient computed twice");
      c.workspace = s.workspace->data();
      m.lib().backwardWeight(c);
      s.wDone = true;
      if (in.chunk == 0) mbSinceStep_ += 1;
      cs.pins.erase(in.mb); // the backward releases the micro-batch's kept version
      maybeRelease(in.chunk, s);
    }
    break;
  }
  default:
    break;
  }
}

// ---------------------------------------------------------------- transfers
int Executor::tagOf(int mb, bool grad, int vsDest) const { return (mb * 2 + (grad ? 1 : 0)) * V_ + vsDest; }

void Executor::send(const Instr &in, int64_t it, bool grad) {
  ChunkState &cs = chunks_[in.chunk];
  const int vsDest = grad ? cs.vs - 1 : cs.vs + 1;
  if (vsDest < 0 || vsDest >= V_ || plan_.vstages[vsDest].stage != plan_.stageOfScheduleRank(in.peer))
    fail(toString(in) + ": peer rank " + std::to_string(in.peer) + " does not run virtual stage " + std::to_string(vsDest));
  Slot &s = slot(in.chunk, in.mb, false);
  if (grad ? !s.bDone : !s.fwdDone) fail(toString(in) + ": sent before it was computed");
  Buffer &buf = grad ? s.gradInputs : s.outputs;
  const Layout &layout = grad ? cs.model->inputLayout() : cs.model->outputLayout();
  BundleHeader h{};
  h.magic = kBundleMagic;
  h.iteration = it;
  h.mb = in.mb;
  h.vs = vsDest;
  h.kind = grad ? 1 : 0;
  h.version = in.version;
  h.layoutHash = layout.hash;
  h.bytes = layout.total;
  const int peer = plan_.mpiRankOf(in.peer);
  // CUDA: the send's stream waits for the compute that filled the bundle
  // (not for whatever was enqueued after it), then writes the header and
  // sends, overlapping the compute stream's next work. Host: at once.
  const Stream st = transport_.stream(peer, true);
  if (gpu_) device_.streamWait(st, grad ? s.gradInputsDone : s.outputsDone);
  device_.writeSmall(buf.data(), &h, sizeof h, st);
  s.sends.push_back(transport_.isend(buf.data(), layout.total, peer, tagOf(in.mb, grad, vsDest)));
  if (grad) {
    s.gradHandedOff = true;
    maybeRelease(in.chunk, s);
  }
}

void Executor::recv(const Instr &in, int64_t it, bool grad) {
  ChunkState &cs = chunks_[in.chunk];
  const int vsSrc = grad ? cs.vs + 1 : cs.vs - 1;
  if (vsSrc < 0 || vsSrc >= V_ || plan_.vstages[vsSrc].stage != plan_.stageOfScheduleRank(in.peer))
    fail(toString(in) + ": peer rank " + std::to_string(in.peer) + " does not run virtual stage " + std::to_string(vsSrc));
  Slot &s = slot(in.chunk, in.mb, !grad);
  Buffer &buf = grad ? s.gradOutputs : s.inputs;
  const Layout &layout = grad ? cs.model->outputLayout() : cs.model->inputLayout();
  const int peer = plan_.mpiRankOf(in.peer);
  if (!gpu_) {
    transport_.wait(transport_.irecv(buf.data(), layout.total, peer, tagOf(in.mb, grad, cs.vs)));
    BundleHeader h;
    std::memcpy(&h, buf.data(), sizeof h);
    const std::string e = headerError(h, in, it, grad, cs.vs, layout.hash);
    if (!e.empty()) fail(e);
  } else {
    // Enqueued on the receiving stream once the slot may be written; the
    // consuming compute waits for `inputsIn`/`gradOutputsIn` on the device.
    // The header travels to pinned host memory behind the bundle and is
    // checked when it is there (pollHeaders), without stalling the host.
    const Stream st = transport_.stream(peer, false);
    device_.streamWait(st, s.ready);
    transport_.release(transport_.irecv(buf.data(), layout.total, peer, tagOf(in.mb, grad, cs.vs)));
    PendingHeader p;
    p.host = takePinnedHeader();
    p.event = takeEvent();
    device_.downloadAsync(p.host, buf.data(), sizeof(BundleHeader), st);
    device_.record(p.event, st);
    device_.record(grad ? s.gradOutputsIn : s.inputsIn, st);
    (grad ? s.gradOutputsReceived : s.inputsReceived) = true;
    p.in = in, p.iteration = it, p.grad = grad, p.vs = cs.vs, p.layoutHash = layout.hash;
    p.context = stream_.path + " #" + std::to_string(currentIndex_) + " " + toString(in) + " (iteration " +
                std::to_string(it) + ")";
    pending_.push_back(std::move(p));
  }
  (grad ? s.haveGradOutputs : s.haveInputs) = true;
}

std::string Executor::headerError(const BundleHeader &h, const Instr &in, int64_t it, bool grad, int vs,
                                  uint64_t layoutHash) const {
  if (h.magic != kBundleMagic || h.iteration != it || h.mb != in.mb || h.vs != vs || h.kind != (grad ? 1 : 0) ||
      h.layoutHash != layoutHash)
    return toString(in) + ": received a bundle for iteration " + std::to_string(h.iteration) + " micro-batch " +
           std::to_string(h.mb) + " stage " + std::to_string(h.vs) + (h.layoutHash != layoutHash ? " with another tensor layout" : "") +
           "; the ranks' schedules disagree";
  if (h.version != in.version)
    return toString(in) + ": activation carries weight version " + std::to_string(h.version) + ", the stream expects " +
           std::to_string(in.version);
  return "";
}

void Executor::pollHeaders(bool block) {
  for (size_t k = 0; k < pending_.size();) {
    PendingHeader &p = pending_[k];
    if (!block && !device_.query(p.event)) {
      ++k;
      continue;
    }
    device_.hostWait(p.event);
    BundleHeader h;
    std::memcpy(&h, p.host, sizeof h);
    const std::string e = headerError(h, p.in, p.iteration, p.grad, p.vs, p.layoutHash);
    const std::string context = p.context;
    freeHeaders_.push_back(p.host);
    freeEvents_.push_back(p.event);
    pending_.erase(pending_.begin() + k);
    if (!e.empty()) throw Error(context + ": " + e);
  }
}

char *Executor::takePinnedHeader() {
  if (freeHeaders_.empty()) { // blocks of 256 headers: pinned memory is allocated in pages
    headerBlocks_.emplace_back(device_, 256 * sizeof(BundleHeader));
    for (int k = 255; k >= 0; --k) freeHeaders_.push_back(headerBlocks_.back().data() + k * sizeof(BundleHeader));
  }
  char *p = freeHeaders_.back();
  freeHeaders_.pop_back();
  return p;
}

Event Executor::takeEvent() {
  if (freeEvents_.empty()) {
    allEvents_.push_back(device_.newEvent());
    return allEvents_.back();
  }
  Event e = freeEvents_.back();
  freeEvents_.pop_back();
  return e;
}

// ---------------------------------------------------------------- optimizer
void Executor::allreduceGrads() {
  for (auto &cs : chunks_) {
    StageModel &m = *cs.model;
    const pipec_stage_desc &d = m.desc();
    bool allF32 = true;
    for (int i = 0; i < d.num_params; ++i) allF32 &= d.params[i].tensor.dtype == PIPEC_F32;
    if (allF32) {
      // One call over the whole buffer: padding and buffer slots are zeros.
      transport_.allreduceSumStage(m.grads().data(), m.grads().size() / 4, PIPEC_F32);
    } else {
      for (int i = 0; i < d.num_params; ++i)
        if (d.params[i].role == PIPEC_TRAINED)
          transport_.allreduceSumStage(m.grads().data() + m.paramLayout().offsets[i],
                                       m.paramLayout().bytes[i] / io::dtypeSize(d.params[i].tensor.dtype),
                                       d.params[i].tensor.dtype);
    }
  }
  double count = mbSinceStep_;
  control_.allreduceSumStage(&count, 1);
  reducedCount_ = count;
}

double Executor::finishGradients() {
  const double count = reducedCount_ >= 0 ? reducedCount_ : mbSinceStep_;
  if (count <= 0) fail("STEP without any gradient since the previous step");
  for (auto &cs : chunks_) cs.model->scaleGrads(1.0 / count);
  return count;
}

void Executor::reduceTied() {
  // Each rank holds its stage's gradient averaged over micro-batches and
  // replicas; it contributes 1/R_s of it, so the sum over the group is
  // sum over holder stages of their gradients = the single model's gradient.
  const double share = 1.0 / plan_.replicasOf(stage_);
  for (const TiedHolding &h : tied_) {
    const auto [c0, i0] = h.copies[0];
    StageModel &m0 = *chunks_[c0].model;
    const pipec_dtype dt = m0.desc().params[i0].tensor.dtype;
    const size_t bytes = m0.paramLayout().bytes[i0], n = bytes / io::dtypeSize(dt);
    char *g0 = m0.grads().data() + m0.paramLayout().offsets[i0];
    for (size_t j = 1; j < h.copies.size(); ++j) { // several holders on this rank (ZB-V)
      StageModel &m = *chunks_[h.copies[j].first].model;
      device_.add(g0, m.grads().data() + m.paramLayout().offsets[h.copies[j].second], n, dt);
    }
    if (share != 1.0) device_.scale(g0, n, dt, share);
    transport_.allreduceSumGroup(h.group, g0, n, dt);
    for (size_t j = 1; j < h.copies.size(); ++j) {
      StageModel &m = *chunks_[h.copies[j].first].model;
      device_.copy(m.grads().data() + m.paramLayout().offsets[h.copies[j].second], g0, bytes);
    }
  }
}

void Executor::gradStats(double &sumSq, double &nonFinite) {
  for (size_t c = 0; c < chunks_.size(); ++c) chunks_[c].model->gradStats(sumSq, nonFinite, &normSkip_[c]);
}

void Executor::step(int64_t it) {
  finishGradients();
  reduceTied();
  bool skip = false;
  if (optimizer_.maxGradNorm > 0) {
    // Synchronous schedules: every rank runs exactly one STEP per iteration,
    // so a world reduction of the gradient norm is safe here. Replicas hold
    // identical reduced gradients: only replica 0 contributes.
    double v[2] = {0, 0};
    if (replica_ == 0) gradStats(v[0], v[1]);
    const double local = v[1];
    control_.allreduceSumWorld(v, 2);
    const double norm = std::sqrt(v[0]);
    // Non-finite gradients: the rank that has them stops the job unless
    // allowed (the others skip the step and are ended by its abort).
    if (local > 0) nonFinite(nonFiniteGradients(), it);
    if (v[1] > 0)
      skip = true, ++skippedSteps_;
    else if (norm > optimizer_.maxGradNorm)
      for (auto &cs : chunks_) cs.model->scaleGrads(optimizer_.maxGradNorm / norm);
  } else if (!opt_.allowNonFinite) {
    // Without clipping, one pass over this rank's gradients (the optimizer
    // step makes several): a NaN or inf stops training here.
    double sumSq = 0, bad = 0;
    gradStats(sumSq, bad);
    if (bad > 0) nonFinite(nonFiniteGradients(), it);
  }
  for (auto &cs : chunks_) {
    if (!skip) cs.model->applyStep(optimizer_);
    cs.model->grads().zero();
  }
  mbSinceStep_ = 0;
  reducedCount_ = -1;
}

// ---------------------------------------------------------------- dispatch
void Executor::execute(const Instr &in, int64_t it) {
  switch (in.op) {
  case Op::Load: {
    int chunk = -1;
    for (int c = 0; c < plan_.chunks; ++c)
      if (chunks_[c].vs == 0) chunk = c;
    if (chunk < 0) fail(toString(in) + ": LOAD on a rank that does not run the first stage");
    loadData(chunk, slot(chunk, in.mb, true), in.mb, it);
    break;
  }
  case Op::Fwd:
  case Op::Bwd:
  case Op::BwdInput:
  case Op::BwdWeight:
  case Op::Recompute: compute(in, it); break;
  case Op::SendAct: send(in, it, false); break;
  case Op::SendGrad: send(in, it, true); break;
  case Op::RecvAct: recv(in, it, false); break;
  case Op::RecvGrad: recv(in, it, true); break;
  case Op::Stash:
    for (auto &cs : chunks_) {
      Pin pin;
      pin.version = in.version;
      if (in.version >= 0) {
        // Vertical sync: pin the current version; micro-batches pinning the
        // same version share one copy.
        // Versions in a stream count from the start of its iteration.
        const int64_t current = (int64_t)plan_.replicasOf(stage_) * (cs.model->steps - cs.stepsAtIterationStart);
        if (in.version != current)
          fail(toString(in) + ": this rank is at weight version " + std::to_string(current));
        pin.params = cs.versionCopies[in.version].lock();
        if (!pin.params) {
          pin.params = std::make_shared<Buffer>(device_);
          pin.params->copyFrom(cs.model->params());
          cs.versionCopies[in.version] = pin.params;
        }
      } else {
        pin.params = std::make_shared<Buffer>(device_);
        pin.params->copyFrom(cs.model->params());
      }
      cs.pins[in.mb] = pin;
    }
    break;
  case Op::Restore:
    for (auto &cs : chunks_) {
      auto p = cs.pins.find(in.mb);
      if (p == cs.pins.end()) fail(toString(in) + ": no weight version was stashed for this micro-batch");
      if (in.version >= 0 && p->second.version != in.version)
        fail(toString(in) + ": the micro-batch keeps version " + std::to_string(p->second.version));
      p->second.restored = true;
    }
    break;
  case Op::AllReduce:
    if (in.peer != stage_) fail(toString(in) + ": all-reduce of another stage");
    allreduceGrads();
    break;
  case Op::Step: step(it); break;
  case Op::SpecStep: {
    // ZB-H2: update now, keep the pre-step weights until VALIDATE/ROLLBACK
    // decide; the gradients stay until then (a clipped redo needs them).
    finishGradients();
    reduceTied();
    double v[2] = {0, 0};
    if (replica_ == 0) gradStats(v[0], v[1]);
    validatedSumSq_ = v[0], validatedNonFinite_ = v[1];
    localNonFinite_ = v[1];
    preStep_.clear();
    for (auto &cs : chunks_) {
      preStep_.push_back(cs.model->snapshot());
      cs.model->applyStep(optimizer_);
    }
    validated_ = false;
    break;
  }
  case Op::Validate: {
    if (preStep_.empty()) fail("VALIDATE without a SPEC_STEP");
    double v[2] = {validatedSumSq_, validatedNonFinite_};
    control_.allreduceSumWorld(v, 2);
    validatedSumSq_ = v[0], validatedNonFinite_ = v[1];
    validated_ = true;
    break;
  }
  case Op::Rollback: {
    if (!validated_) fail("ROLLBACK before VALIDATE");
    const double norm = std::sqrt(validatedSumSq_);
    if (validatedNonFinite_ > 0) { // skip the step: back to the pre-step weights
      // Unless allowed, the rank whose gradients are not finite stops the
      // job (the others skip the step and are ended by its abort).
      if (localNonFinite_ > 0) nonFinite(nonFiniteGradients(), it);
      for (size_t c = 0; c < chunks_.size(); ++c) chunks_[c].model->restore(preStep_[c]);
      ++skippedSteps_;
    } else if (optimizer_.maxGradNorm > 0 && norm > optimizer_.maxGradNorm) { // redo it clipped
      for (size_t c = 0; c < chunks_.size(); ++c) {
        chunks_[c].model->restore(preStep_[c]);
        chunks_[c].model->scaleGrads(optimizer_.maxGradNorm / norm);
        chunks_[c].model->applyStep(optimizer_);
      }
      ++rollbacks_;
    }
    for (auto &cs : chunks_) cs.model->grads().zero();
    preStep_.clear();
    validated_ = false;
    mbSinceStep_ = 0;
    reducedCount_ = -1;
    break;
  }
  }
}

void Executor::iteration(int64_t it) {
  lossSum_ = lossCount_ = 0;
  for (auto &cs : chunks_) cs.stepsAtIterationStart = cs.model->steps;
  for (size_t i = 0; i < stream_.instrs.size(); ++i) {
    const Instr &in = stream_.instrs[i];
    watchIteration_.store(it, std::memory_order_relaxed);
    watchIndex_.store((int64_t)i, std::memory_order_relaxed);
    // CUDA: check the headers of the bundles that arrived so far (their
    // errors name their own RECV instruction).
    if (gpu_ && (in.op == Op::RecvAct || in.op == Op::RecvGrad)) pollHeaders(false);
    currentIndex_ = i;
    const double t0 = now();
    try {
      execute(in, it);
    } catch (const Error &e) {
      throw Error(stream_.path + " #" + std::to_string(i) + " " + toString(in) + " (iteration " + std::to_string(it) +
                  "): " + e.what());
    }
    const double t1 = now();
    if (watchdog_) watchdog_->progress();
    if (!opt_.traceFile.empty()) trace_.push_back({t0 - t0_, t1 - t0_, in, it});
  }
  watchIndex_.store(-1, std::memory_order_relaxed);
  if (gpu_) pollHeaders(true); // every receive of the iteration is enqueued: wait for them and check
  for (int c = 0; c < plan_.chunks; ++c) {
    ChunkState &cs = chunks_[c];
    if (!cs.active.empty())
      fail(stream_.path + ": micro-batch " + std::to_string(cs.active.begin()->first) + " of chunk " + std::to_string(c) +
           " is unfinished at the end of the stream (missing backward or transfer)");
    if (!cs.pins.empty())
      fail(stream_.path + ": a weight version stashed for micro-batch " + std::to_string(cs.pins.begin()->first) +
           " was never released");
  }
  if (mbSinceStep_ != 0) fail(stream_.path + ": gradients of " + std::to_string((int)mbSinceStep_) + " micro-batches were never applied by a STEP");
}

void Executor::run() {
  if (watchdog_) watchdog_->phase("start-up: the barrier before the first iteration (MPI_Barrier)");
  control_.barrier();
  t0_ = now();
  fwdCalls_.assign(plan_.chunks, 0);
  bool computesLoss = false;
  for (auto &cs : chunks_) computesLoss |= cs.model->desc().computes_loss != 0;
  double total = 0, lastLoss = NAN;
  int64_t done = 0;
  double windowStart = now();
  for (int64_t it = startIteration_; it < opt_.iters; ++it) {
    profiling_ = !opt_.profileFile.empty() && (it > startIteration_ || opt_.iters - startIteration_ == 1);
    const double start = now();
    if (watchdog_) watchdog_->iterations([this] { return describeCurrent(); });
    iteration(it);
    const double seconds = now() - start;
    if (watchdog_) watchdog_->iterationDone(seconds);
    total += seconds;
    ++done;
    if (computesLoss) {
      double v[2] = {lossSum_, lossCount_};
      control_.allreduceSumStage(v, 2); // replicas of the loss stage
      lastLoss = v[0] / v[1];
      const bool log = (it + 1) % std::max(1, opt_.logEvery) == 0 || it + 1 == opt_.iters;
      if (replica_ == 0 && log && !opt_.quiet) {
        const int64_t window = (it + 1 - startIteration_) % std::max(1, opt_.logEvery) == 0 ? std::max(1, opt_.logEvery) : 1;
        const double elapsed = now() - windowStart;
        const double perIter = elapsed / (double)std::min<int64_t>(window, done);
        std::printf("piperun: iter %lld/%d  loss %.6f  %.2f ms/iter  %.1f samples/s\n", (long long)(it + 1), opt_.iters,
                    lastLoss, perIter * 1e3, plan_.microbatchSize * plan_.microbatches / perIter);
        std::fflush(stdout);
      }
      if (log) windowStart = now();
    }
    if (!opt_.checkpointDir.empty() && opt_.saveEvery > 0 && (it + 1) % opt_.saveEvery == 0) {
      if (watchdog_) watchdog_->phase("the checkpoint of iteration " + std::to_string(it + 1));
      saveCheckpoint(it + 1);
    }
  }
  if (watchdog_) watchdog_->phase("the end of the run (sends, trace, profile, export)");
  if (computesLoss && replica_ == 0 && done > 0 && !opt_.quiet) {
    std::printf("piperun: done: %lld iterations in %.3f s, %.2f ms/iter, %.1f samples/s, final loss %.6f%s\n",
                (long long)done, total, total / done * 1e3, plan_.microbatchSize * plan_.microbatches * done / total,
                lastLoss,
                (rollbacks_ || skippedSteps_)
                    ? (", " + std::to_string(rollbacks_) + " clipped redo(s), " + std::to_string(skippedSteps_) + " skipped step(s)").c_str()
                    : "");
    std::fflush(stdout);
  }
  if (gpu_) {
    // Nothing may be in flight when the buffers and communicators go.
    for (auto &cs : chunks_)
      for (auto &s : cs.slots) {
        for (Transport::Request r : s->sends) transport_.wait(r);
        s->sends.clear();
      }
    device_.synchronize();
  }
  if (!opt_.traceFile.empty()) writeTrace();
  if (!opt_.profileFile.empty()) writeProfile();
  if (!opt_.exportDir.empty()) exportWeights();
}

// ---------------------------------------------------------------- checks
void Executor::nonFinite(const std::string &what, int64_t it) {
  if (!opt_.allowNonFinite)
    fail(what + " in iteration " + std::to_string(it) + "; training stopped (--allow-nonfinite continues)");
  if (warnedNonFinite_) return;
  warnedNonFinite_ = true;
  std::fprintf(stderr, "piperun: %s: warning: %s in iteration %lld; continuing (--allow-nonfinite; later ones are "
               "not reported)\n",
               who().c_str(), what.c_str(), (long long)it);
  std::fflush(stderr);
}

std::string Executor::nonFiniteGradients() {
  // Rare (training is about to stop): one statistics call per parameter.
  std::string found;
  int count = 0;
  for (auto &cs : chunks_) {
    const pipec_stage_desc &d = cs.model->desc();
    std::vector<bool> only(d.num_params, true);
    for (int i = 0; i < d.num_params; ++i) {
      if (d.params[i].role != PIPEC_TRAINED) continue;
      only[i] = false;
      double sumSq = 0, bad = 0;
      cs.model->gradStats(sumSq, bad, &only);
      only[i] = true;
      if (bad <= 0) continue;
      if (++count <= 3)
        found += std::string(found.empty() ? "" : ", ") + d.params[i].tensor.name + " (stage " + std::to_string(cs.vs) +
                 ", " + std::to_string((long long)bad) + " NaN/inf elements)";
    }
  }
  if (count > 3) found += " and " + std::to_string(count - 3) + " more";
  return "non-finite gradients at the optimizer step: " + (found.empty() ? std::string("(not located)") : found);
}

std::string Executor::describeCurrent() const {
  const int64_t it = watchIteration_.load(std::memory_order_relaxed), i = watchIndex_.load(std::memory_order_relaxed);
  auto rankName = [&](int scheduleRank) {
    return "rank " + std::to_string(plan_.mpiRankOf(scheduleRank)) + " (stage " +
           std::to_string(plan_.stageOfScheduleRank(scheduleRank)) + ", replica " +
           std::to_string(plan_.replicaOfScheduleRank(scheduleRank)) + ")";
  };
  if (i < 0 || i >= (int64_t)stream_.instrs.size())
    return "the end of iteration " + std::to_string(it) + " (waiting for the other replicas of stage " +
           std::to_string(stage_) + " or the next iteration)";
  const Instr &in = stream_.instrs[(size_t)i];
  std::string s = stream_.path + " #" + std::to_string(i) + " " + toString(in) + " (iteration " + std::to_string(it) + ")";
  switch (in.op) {
  case Op::RecvAct:
  case Op::RecvGrad: s += ", waiting for " + rankName(in.peer); break;
  case Op::AllReduce: {
    std::string others;
    for (int q = 0; q < plan_.replicasOf(stage_); ++q)
      if (q != replica_) others += (others.empty() ? "" : ", ") + std::to_string(plan_.ranks[stage_][q]);
    s += ", waiting for the other replicas of stage " + std::to_string(stage_) + " (rank " + others + ")";
    break;
  }
  case Op::Step:
  case Op::Validate:
    if (in.op == Op::Validate || optimizer_.maxGradNorm > 0) s += ", waiting for every rank (gradient norm all-reduce)";
    break;
  default: break;
  }
  return s;
}

// ---------------------------------------------------------------- files
void Executor::saveCheckpoint(int64_t it) {
  const fs::path root(opt_.checkpointDir);
  const fs::path tmp = root / ("iter_" + std::to_string(it) + ".tmp"), final = root / ("iter_" + std::to_string(it));
  if (control_.rank() == 0) {
    fs::create_directories(root);
    fs::remove_all(tmp);
    fs::create_directories(tmp);
  }
  control_.barrier();
  if (replica_ == 0)
    for (auto &cs : chunks_)
      io::writeTensorFile((tmp / ("stage_" + std::to_string(cs.vs) + ".bin")).string(), cs.model->checkpointTensors());
  control_.barrier();
  if (control_.rank() == 0) {
    json manifest{{"format", "pipec.checkpoint/1"}, {"iteration", it},   {"schedule", plan_.schedule},
                  {"virtual_stages", V_},           {"microbatches", plan_.microbatches},
                  {"microbatch_size", plan_.microbatchSize}, {"seed", seed_}};
    io::detail::writeFileAtomically((tmp / "manifest.json").string(), manifest.dump(1) + "\n");
    fs::remove_all(final);
    fs::rename(tmp, final); // the checkpoint appears complete or not at all
    io::detail::writeFileAtomically((root / "latest").string(), final.filename().string() + "\n");
    if (!opt_.quiet) std::printf("piperun: checkpoint %s\n", final.string().c_str()), std::fflush(stdout);
  }
  control_.barrier();
}

void Executor::loadCheckpoint(const std::string &dirIn) {
  // The manifest checked against the plan, --iters and the seed (Plan.cpp).
  const CheckpointManifest m = readCheckpointManifest(dirIn, plan_, opt_.iters, seed_);
  startIteration_ = m.iteration;
  for (auto &cs : chunks_) cs.model->loadCheckpoint(m.stageFile(cs.vs));
}

void Executor::exportWeights() {
  if (control_.rank() == 0) fs::create_directories(opt_.exportDir);
  control_.barrier();
  if (replica_ == 0)
    for (auto &cs : chunks_)
      io::writeTensorFile((fs::path(opt_.exportDir) / ("stage_" + std::to_string(cs.vs) + ".bin")).string(),
                          cs.model->weightTensors());
  control_.barrier();
}

namespace {
const char *shortName(Op op) {
  switch (op) {
  case Op::Fwd: return "F";
  case Op::Bwd: return "BW";
  case Op::BwdInput: return "B";
  case Op::BwdWeight: return "W";
  case Op::Recompute: return "R";
  case Op::AllReduce: return "AR";
  case Op::Validate: return "VAL";
  case Op::SpecStep: return "SSTEP";
  default: return opName(op);
  }
}
} // namespace

void Executor::writeTrace() {
  // Each rank ships its events; rank 0 writes one Chrome trace in the
  // schedule library's layout (pid 0, tid = schedule rank), times in µs.
  json mine = json::array();
  for (const TraceEvent &e : trace_)
    mine.push_back({(int)e.in.op, e.in.mb, e.in.chunk, e.in.peer, e.iteration, e.t0, e.t1});
  json meta{{"rank", scheduleRank_}, {"stage", stage_}, {"replica", replica_}, {"events", mine},
            {"vs", [&] { json v = json::array(); for (auto &c : chunks_) v.push_back(c.vs); return v; }()}};
  const auto all = control_.gatherToRoot(meta.dump());
  if (control_.rank() != 0) return;
  std::ofstream os(opt_.traceFile);
  if (!os) fail(opt_.traceFile + ": cannot open the trace file for writing");
  os << "{\"displayTimeUnit\":\"ms\",\"otherData\":{\"schedule\":\"" << plan_.schedule
     << "\",\"measured\":true},\"traceEvents\":[\n";
  os << "{\"name\":\"process_name\",\"ph\":\"M\",\"pid\":0,\"args\":{\"name\":\"" << plan_.schedule << " (measured)\"}}";
  struct End { double t; int rank; };
  std::map<std::tuple<int64_t, int, int, int>, End> sends, recvs; // (iteration, mb, grad, sender vs)
  for (const std::string &s : all) {
    const json r = json::parse(s);
    const int rank = r["rank"];
    os << ",\n{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":0,\"tid\":" << rank << ",\"args\":{\"name\":\"rank " << rank
       << " (stage " << r["stage"].get<int>() << ", replica " << r["replica"].get<int>() << ")\"}}";
    for (const json &e : r["events"]) {
      const Op op = (Op)e[0].get<int>();
      const int mb = e[1], chunk = e[2];
      const int64_t it = e[4];
      const double t0 = e[5], t1 = e[6];
      std::string label = shortName(op);
      if (mb >= 0) label += std::to_string(mb);
      if (chunk > 0) label += ".c" + std::to_string(chunk);
      os << ",\n{\"name\":\"" << label << "\",\"cat\":\"" << opName(op) << "\",\"ph\":\"X\",\"pid\":0,\"tid\":" << rank
         << ",\"ts\":" << t0 * 1e6 << ",\"dur\":" << (t1 - t0) * 1e6 << ",\"args\":{\"mb\":" << mb << ",\"chunk\":" << chunk
         << ",\"iteration\":" << it << "}}";
      if (op == Op::SendAct || op == Op::SendGrad || op == Op::RecvAct || op == Op::RecvGrad) {
        const bool grad = op == Op::SendGrad || op == Op::RecvGrad;
        const bool isSend = op == Op::SendAct || op == Op::SendGrad;
        const int vs = r["vs"][chunk];
        const int senderVs = isSend ? vs : (grad ? vs + 1 : vs - 1);
        (isSend ? sends : recvs)[{it, mb, grad ? 1 : 0, senderVs}] = {isSend ? t0 : t1, rank};
      }
    }
  }
  int id = 0;
  for (const auto &[key, s] : sends) {
    auto r = recvs.find(key);
    if (r == recvs.end()) continue;
    const char *name = std::get<2>(key) ? "grad" : "act";
    os << ",\n{\"name\":\"" << name << std::get<1>(key) << "\",\"cat\":\"comm\",\"ph\":\"s\",\"id\":" << id
       << ",\"pid\":0,\"tid\":" << s.rank << ",\"ts\":" << s.t * 1e6 << "}";
    os << ",\n{\"name\":\"" << name << std::get<1>(key) << "\",\"cat\":\"comm\",\"ph\":\"f\",\"bp\":\"e\",\"id\":" << id++
       << ",\"pid\":0,\"tid\":" << r->second.rank << ",\"ts\":" << r->second.t * 1e6 << "}";
  }
  os << "\n]}\n";
  if (!os) fail(opt_.traceFile + ": write failed");
}

void Executor::writeProfile() {
  // Seconds per micro-batch for each op, from replica 0 of every stage.
  json ops = json::array();
  if (replica_ == 0)
    for (const auto &[name, t] : opTimes_) {
      double calls = 0;
      for (int64_t c : fwdCalls_) calls = std::max<double>(calls, (double)c);
      if (calls <= 0) continue;
      ops.push_back({{"name", name}, {"fwd_s", t.f / calls}, {"bwd_input_s", t.b / calls}, {"bwd_weight_s", t.w / calls}});
    }
  const auto all = control_.gatherToRoot(ops.dump());
  if (control_.rank() != 0) return;
  json merged = json::array();
  for (const std::string &s : all)
    for (const json &o : json::parse(s)) merged.push_back(o);
  json doc{{"format", "pipec.profile/1"},
           {"device", !gpu_ ? std::string("cpu") : plan_.gpu.empty() ? std::string(device_.name()) : plan_.gpu},
           {"ops", merged}};
  std::ofstream os(opt_.profileFile);
  os << doc.dump(1) << "\n";
  if (!os) fail(opt_.profileFile + ": cannot write the profile");
}

} // namespace pipec::rt
