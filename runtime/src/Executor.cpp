#include "Executor.h"

#include "Checkpoint.h"
#include "JobCheck.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cassert>
#include <cmath>
#include <cstring>

namespace pipec::rt {
using nlohmann::json;

namespace {
std::string tensorList(const pipec_tensor_desc *d, int n) {
  std::string s;
  for (int i = 0; i < n; ++i) s += (i ? ", " : "") + std::string(io::dtypeName(d[i].dtype)) + io::shapeString(shapeOf(d[i]));
  return "[" + s + "]";
}
} // namespace

std::string Executor::tokenRate(double samplesPerSecond, const char *separator) const {
  const int64_t tokens = plan_.tokensPerSample();
  if (tokens <= 0) return "";
  char text[64];
  std::snprintf(text, sizeof text, "%s %.0f tokens/s", separator, samplesPerSecond * (double)tokens);
  return text;
}

std::string Executor::who() const {
  return "rank " + std::to_string(control_.rank()) + " (stage " + std::to_string(stage_) + ", replica " +
         std::to_string(replica_) + ")";
}

void Executor::fail(const std::string &msg) const { throw Error(msg); }

Executor::Executor(const Plan &plan, const RunOptions &opt, Control &control, Transport &transport, Device &device)
    : plan_(plan), opt_(opt), control_(control), transport_(transport), device_(device), gpu_(!device.host()),
      slots_(device, transport), stash_(device, plan.chunks), headers_(device), recorder_(opt) {
  const int rank = control.rank();
  assert(gpu_ == transport.streamOrdered() &&
         "piperun pairs the host device with MPI and a GPU with NCCL (a transport that moves that device's buffers)");
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
  const OptimizerConfig optimizer = resolveOptimizer(plan, opt.optimizer);
  if (plan.asynchronous && optimizer.maxGradNorm > 0)
    fail(plan.planPath + ": max_grad_norm needs a global gradient norm, which an asynchronous schedule (" +
         choiceName(plan.schedule) + ") never has; set it to 0");

  // The instruction stream, checked against the plan before anything runs
  // (loadPlanStream: rank, stage, replica, micro-batches, chunks and peers
  // against plan.json).
  stream_ = loadPlanStream(plan, scheduleRank_);
  if ((int64_t)plan.microbatches * 2 * V_ > transport.maxTag())
    fail(plan.planPath + ": " + std::to_string(plan.microbatches) + " micro-batches x " + std::to_string(V_) +
         " virtual stages exceed the transport's tag range");

  // Stage libraries, buffers, weights.
  chunks_.resize(plan.chunks);
  recomputes_.assign(plan.chunks, std::vector<bool>(plan.microbatches, false));
  for (int c = 0; c < plan.chunks; ++c) {
    Chunk &ch = chunks_[c];
    ch.vs = plan.virtualStage(stage_, c);
    ch.model = std::make_unique<StageModel>(plan, plan.vstages[ch.vs], device_);
    ch.model->loadWeights(plan.vstages[ch.vs].weights);
    slots_.addChunk(*ch.model, ch.vs == 0);
    const pipec_stage_desc &d = ch.model->desc();
    holdsLoss_ |= d.computes_loss != 0;
    readsData_ |= d.num_data > 0;
    if ((ch.vs == V_ - 1) != (d.computes_loss != 0))
      fail(ch.model->vstage().library + ": computes_loss is " + std::to_string(d.computes_loss) +
           " but the stage is " + (ch.vs == V_ - 1 ? "the last" : "not the last"));
  }
  for (const Instr &in : stream_.instrs)
    if (in.op == Op::Recompute) recomputes_[in.chunk][in.mb] = true;
  if (holdsLoss_) {
    losses_ = Buffer(device_, sizeof(float) * (plan.microbatches + 1)); // + the slot RECOMPUTE writes
    lossInstr_.assign(plan.microbatches, -1);
  }

  sync_ = std::make_unique<GradientSync>(plan, optimizer, opt.allowNonFinite, control, transport, device, chunks_,
                                         stage_, replica_, who());
  data_ = std::make_unique<StageData>(plan, opt.dataFile, opt.dataDtype, seed_, chunks_);
  Validation validation = openValidation(plan, opt.evalDataFile, opt.evalEvery, opt.evalIters, opt.dataDtype, seed_,
                                         /*countOnly=*/!readsData_);
  if (validation.source) {
    validationRounds_ = validation.rounds;
    validationData_ =
        std::make_unique<StageData>(plan, readsData_ ? std::move(validation.source) : nullptr, chunks_);
    for (const Instr &in : stream_.instrs)
      if (in.op == Op::Load || in.op == Op::Fwd || in.op == Op::SendAct || in.op == Op::RecvAct)
        forwardStream_.push_back(in);
  }
  if (!opt.resumeDir.empty()) startIteration_ = loadCheckpoint(plan, opt.resumeDir, opt.iters, seed_, chunks_);
  findGradientsFinal();
  startDataPrefetch();
}

// Where each chunk's gradients of an iteration are final and may be summed
// over the replicas at once: its last BWD or BWD_WEIGHT, when an ALLREDUCE
// follows and nothing between them reads or writes gradients or weights
// (transfers, forwards, recomputes, other chunks' backwards, stashes only).
void Executor::findGradientsFinal() {
  gradientsFinalAt_.assign(chunks_.size(), -1);
  const std::vector<Instr> &instrs = stream_.instrs;
  int64_t allreduce = -1;
  for (size_t i = 0; i < instrs.size(); ++i)
    if (instrs[i].op == Op::AllReduce) allreduce = (int64_t)i;
  for (size_t c = 0; c < chunks_.size(); ++c) {
    int64_t last = -1;
    for (int64_t i = 0; i < allreduce; ++i)
      if ((instrs[(size_t)i].op == Op::Bwd || instrs[(size_t)i].op == Op::BwdWeight) && instrs[(size_t)i].chunk == (int)c)
        last = i;
    if (last < 0) continue;
    bool quiet = true;
    for (int64_t i = last + 1; i < allreduce && quiet; ++i) {
      const Instr &in = instrs[(size_t)i];
      switch (in.op) {
      case Op::Load: case Op::Fwd: case Op::Recompute: case Op::BwdInput: case Op::SendAct: case Op::RecvAct:
      case Op::SendGrad: case Op::RecvGrad: case Op::Stash: case Op::Restore: break;
      case Op::Bwd: case Op::BwdWeight: quiet = in.chunk != (int)c; break;
      default: quiet = false; break;
      }
    }
    if (quiet) gradientsFinalAt_[c] = last;
  }
}

void Executor::checkNeighbours() {
  control_.splitStage(stage_);
  sync_->splitTiedGroups(connections_);
  // What each virtual stage sends and expects, so that a plan whose stage
  // libraries disagree fails at start-up instead of mid-run.
  json mine = json::array();
  for (auto &ch : chunks_) {
    const pipec_stage_desc &d = ch.model->desc();
    json tiedDescs = json::object(); // tied parameter name -> "f32[4x8]"
    for (const TiedParam &tp : plan_.tied) {
      const int i = ch.model->paramIndex(tp.name);
      if (i >= 0 && std::find(tp.stages.begin(), tp.stages.end(), ch.vs) != tp.stages.end())
        tiedDescs[tp.name] = tensorList(&d.params[i].tensor, 1);
    }
    mine.push_back({ch.vs, tensorList(d.inputs, d.num_inputs), tensorList(d.outputs, d.num_outputs),
                    ch.model->vstage().library, tiedDescs});
  }
  // And the point-to-point transfers of its stream, in order.
  json transfers = json::array();
  for (const Transfer &t : transfersOf(stream_)) transfers.push_back({(int)t.op, t.mb, t.chunk, t.peer, t.index});
  // The chunks this rank sums over the replicas early, in the order their
  // gradients become final; the others follow at ALLREDUCE in chunk order.
  // NCCL needs the whole order to be the same on every replica.
  std::vector<int> sumOrder;
  {
    std::vector<std::pair<int64_t, int>> early;
    for (size_t c = 0; c < chunks_.size(); ++c)
      if (gradientsFinalAt_[c] >= 0) early.push_back({gradientsFinalAt_[c], (int)c});
    std::sort(early.begin(), early.end());
    for (const auto &[at, c] : early) sumOrder.push_back(c);
  }
  const json me{{"rank", scheduleRank_}, {"path", stream_.path}, {"chunks", mine}, {"transfers", transfers},
                {"stage", stage_}, {"sum_order", sumOrder}};
  std::vector<std::string> ins(V_), outs(V_), libs(V_);
  std::vector<json> tiedOf(V_);
  const int R = plan_.numRanks();
  std::vector<std::vector<Transfer>> transfersOfRank(R);
  std::vector<std::string> paths(R);
  bool replicasAgree = true;
  for (const std::string &s : control_.allgatherStrings(me.dump())) {
    const json r = json::parse(s);
    for (const json &e : r["chunks"]) {
      const int vs = e[0];
      ins[vs] = e[1], outs[vs] = e[2], libs[vs] = e[3], tiedOf[vs] = e[4];
    }
    const int sr = r["rank"];
    paths[sr] = r["path"];
    if (r["stage"] == stage_ && r["sum_order"] != json(sumOrder)) replicasAgree = false;
    for (const json &t : r["transfers"]) transfersOfRank[sr].push_back({(Op)t[0].get<int>(), t[1], t[2], t[3], t[4]});
  }
  // Replicas that would sum in different orders sum everything at ALLREDUCE
  // (every replica saw every other's order, so all decide alike).
  if (!replicasAgree) gradientsFinalAt_.assign(chunks_.size(), -1);
  // Who sends to whom (world ranks): the NCCL transport's communicators.
  connections_.pairs.clear();
  for (int r = 0; r < R; ++r)
    for (const Transfer &t : transfersOfRank[r])
      if (t.op == Op::SendAct || t.op == Op::SendGrad) connections_.pairs.push_back({plan_.mpiRankOf(r), plan_.mpiRankOf(t.peer)});
  std::sort(connections_.pairs.begin(), connections_.pairs.end());
  // The largest bundle this rank receives from each sender (the staging
  // slots of ranks that share a GPU).
  connections_.receiveBytes.clear();
  connections_.largestSum = 0;
  for (auto &ch : chunks_) connections_.largestSum = std::max(connections_.largestSum, ch.model->grads().size());
  for (const Instr &in : stream_.instrs)
    if (in.op == Op::RecvAct || in.op == Op::RecvGrad) {
      const Chunk &ch = chunks_[in.chunk];
      const Layout &layout = in.op == Op::RecvGrad ? ch.model->outputLayout() : ch.model->inputLayout();
      size_t &most = connections_.receiveBytes[plan_.mpiRankOf(in.peer)];
      most = std::max(most, (size_t)layout.total);
    }
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

// A stage's first call creates library handles, device constants and cuDNN
// plans, and some of that waits for the whole device (cudaMalloc,
// cudaStreamSynchronize). Once transfers run, the device may hold a receive
// of another micro-batch whose sender waits for this rank: such a wait would
// never end. So every entry point runs once here, before the first transfer
// or collective, on zeroed scratch bundles (zero inputs and data are valid
// for every op: token 0, label 0). The weights and optimizer state are only
// read; BatchNorm's running statistics, which a training forward updates,
// are put back, and the accumulated gradients zeroed.
void Executor::warmUp() {
  if (!gpu_) return;
  for (Chunk &ch : chunks_) {
    StageModel &m = *ch.model;
    const pipec_stage_desc &d = m.desc();
    const Layout &params = m.paramLayout();
    size_t bufferBytes = 0;
    for (int i = 0; i < d.num_params; ++i)
      if (d.params[i].role == PIPEC_BUFFER) bufferBytes += params.bytes[i];
    Buffer saved(device_, bufferBytes);
    auto copyBuffers = [&](bool back) { // the BUFFER parameters into `saved`, or back
      for (int i = 0, at = 0; i < d.num_params; ++i)
        if (d.params[i].role == PIPEC_BUFFER) {
          char *param = m.params().data() + params.offsets[i], *copy = saved.data() + at;
          device_.copy(back ? param : copy, back ? copy : param, params.bytes[i]);
          at += params.bytes[i];
        }
    };
    copyBuffers(false);
    Buffer data(device_, m.dataLayout().total), inputs(device_, m.inputLayout().total),
        outputs(device_, m.outputLayout().total), gradOutputs(device_, m.outputLayout().total),
        gradInputs(device_, m.inputLayout().total), workspace(device_, (size_t)d.workspace_bytes),
        loss(device_, 2 * sizeof(float));
    CallTables tables;
    pipec_call c = stageCall(m, m.params().data(), data.data(), inputs.data(), outputs.data(), gradOutputs.data(),
                             gradInputs.data(), tables);
    c.step = m.steps;
    if (d.computes_loss) c.loss = (float *)loss.data();
    c.workspace = workspace.data();
    m.lib().forward(c);
    m.lib().backwardInput(c);
    m.lib().backwardWeight(c);
    c.inference = 1; // validation's forward has its own first call
    m.lib().forward(c);
    copyBuffers(true);
    m.grads().zero();
  }
  device_.synchronize();
}

// ---------------------------------------------------------------- compute
void Executor::startDataPrefetch() {
  if (generatesData()) return;
  // The loads loadData will be asked for, in stream order: a LOAD, or a FWD
  // of a chunk that reads data fields and was not LOADed.
  std::vector<DataPrefetch::Load> order;
  std::vector<std::vector<bool>> loaded(chunks_.size(), std::vector<bool>(plan_.microbatches, false));
  auto load = [&](int chunk, int mb) {
    if (chunk < 0 || chunks_[chunk].model->desc().num_data == 0 || loaded[chunk][mb]) return;
    loaded[chunk][mb] = true;
    order.push_back({chunk, mb});
  };
  for (const Instr &in : stream_.instrs) {
    if (in.op == Op::Load)
      for (int c = 0; c < plan_.chunks; ++c)
        if (chunks_[c].vs == 0) load(c, in.mb);
    if (in.op == Op::Fwd) load(in.chunk, in.mb);
  }
  std::vector<size_t> bytes;
  for (const Chunk &ch : chunks_) bytes.push_back(ch.model->dataLayout().total);
  prefetch_ = std::make_unique<DataPrefetch>(*data_, device_, std::move(order), std::move(bytes), startIteration_,
                                             opt_.iters);
}

void Executor::loadData(int chunk, Slot &s, int mb, int64_t it) {
  if (s.dataLoaded) return;
  const StageModel &m = *chunks_[chunk].model;
  if (!validating_) {
    if (generatesData())
      data_->generate(chunk, it, mb, s.data.data(), device_);
    else
      prefetch_->copyNext(it, chunk, mb, s.data.data());
    s.dataLoaded = true;
    return;
  }
  // Validation reads its held-out set here, at once.
  StageData &source = *validationData_;
  if (!gpu_) {
    source.read(chunk, it, mb, s.data.data());
  } else if (m.dataLayout().total) {
    // Read into the slot's pinned staging copy (once its previous upload is
    // done), upload on the compute stream: ordered after the slot's previous
    // readers and before this micro-batch's stage calls.
    device_.hostWait(s.dataStaged);
    source.read(chunk, it, mb, s.dataStage.data());
    device_.uploadAsync(s.data.data(), s.dataStage.data(), m.dataLayout().total);
    device_.record(s.dataStaged);
  }
  s.dataLoaded = true;
}

pipec_call Executor::stageCall(StageModel &m, char *params, char *data, char *inputs, char *outputs, char *gradOutputs,
                               char *gradInputs, CallTables &t) const {
  const pipec_stage_desc &d = m.desc();
  t.params = m.paramLayout().pointers(params);
  t.data = m.dataLayout().pointers(data);
  t.inputs = m.inputLayout().pointers(inputs);
  t.outputs = m.outputLayout().pointers(outputs);
  t.gradOutputs = m.outputLayout().pointers(gradOutputs);
  t.gradInputs = m.inputLayout().pointers(gradInputs);
  t.gradParams = m.gradPtrs();
  pipec_call c{};
  c.seed = seed_;
  c.params = t.params.data();
  c.data = (const void *const *)t.data.data();
  c.inputs = (const void *const *)t.inputs.data();
  c.outputs = t.outputs.data();
  c.grad_outputs = d.num_outputs ? (const void *const *)t.gradOutputs.data() : nullptr;
  c.grad_inputs = t.gradInputs.data();
  c.grad_params = t.gradParams.data();
  c.loss_scale = 1.0f; // gradients of the sum of micro-batch losses; STEP divides by their count
  c.stream = device_.computeStream();
  c.no_graphs = opt_.noCudaGraphs ? 1 : 0;
  return c;
}

void Executor::compute(const Instr &in, int64_t it) {
  Chunk &ch = chunks_[in.chunk];
  StageModel &m = *ch.model;
  const pipec_stage_desc &d = m.desc();
  const int vs = ch.vs;
  // A neighbouring virtual stage on this same rank (interleaved/V placement)
  // hands its bundle over by copy instead of a message.
  const bool localPrev = vs > 0 && plan_.vstages[vs - 1].stage == stage_;
  const bool localNext = vs + 1 < V_ && plan_.vstages[vs + 1].stage == stage_;
  auto chunkOf = [&](int v) { return plan_.vstages[v].chunk; };
  // A forward starts the micro-batch's state when nothing was received for
  // it: the first stage, or a chunk fed by a chunk of this same rank.
  Slot &s = slots_.get(in.chunk, in.mb, in.op == Op::Fwd && (vs == 0 || localPrev));
  const std::string what = toString(in);

  // Validation uses the current weights (no version is stashed for it).
  CallTables tables;
  pipec_call c =
      stageCall(m, validating_ ? m.params().data() : (char *)stash_.paramsFor(in.chunk, in.mb, m), s.data.data(),
                s.inputs.data(), s.outputs.data(), s.gradOutputs.data(), s.gradInputs.data(), tables);
  c.microbatch = it * plan_.microbatches + in.mb;
  if (d.computes_loss) c.loss = (float *)losses_.data() + (in.op == Op::Recompute ? plan_.microbatches : in.mb);
  if (recorder_.profiling() && in.op != Op::Recompute && !validating_) recorder_.timeOps(c);

  switch (in.op) {
  case Op::Fwd: {
    if (s.fwdDone) fail(what + ": micro-batch computed twice");
    if (localPrev) {
      Slot &p = slots_.get(chunkOf(vs - 1), in.mb, false);
      if (!p.fwdDone) fail(what + ": forward before the previous chunk's forward");
      device_.copy(s.inputs.data() + 64, p.outputs.data() + 64, m.inputLayout().total - 64);
      s.haveInputs = true;
      if (validating_) releaseEvaluated(chunkOf(vs - 1), p);
    }
    if (vs > 0 && !s.haveInputs) fail(what + ": forward before its input activation arrived");
    if (gpu_ && s.inputsReceived) device_.streamWait(nullptr, s.inputsIn); // the RECV_ACT, on the device
    awaitBundle(s, false);
    if (d.num_data) loadData(in.chunk, s, in.mb, it);
    if (validating_) {
      c.workspace = slots_.scratchWorkspace(in.chunk); // nothing is kept for a backward
      c.inference = 1;
    } else if (recomputes_[in.chunk][in.mb]) {
      c.workspace = slots_.scratchWorkspace(in.chunk); // kept only until RECOMPUTE re-creates it
    } else {
      s.workspace = slots_.takeWorkspace(in.chunk);
      c.workspace = s.workspace->data();
    }
    s.fwdStep = m.steps;
    c.step = s.fwdStep;
    m.lib().forward(c);
    if (gpu_) device_.record(s.outputsDone); // what SEND_ACT waits for
    s.fwdDone = true;
    if (d.computes_loss) lossInstr_[in.mb] = (int64_t)currentIndex_;
    if (validating_) {
      if (d.computes_loss) releaseEvaluated(in.chunk, s);
      break;
    }
    if (recorder_.profiling()) recorder_.countForward(in.chunk);
    break;
  }
  case Op::Recompute: {
    if (!s.fwdDone) fail(what + ": recompute before the forward");
    if (s.workspace) fail(what + ": recompute of a micro-batch whose activations are still held");
    s.workspace = slots_.takeWorkspace(in.chunk);
    c.workspace = s.workspace->data();
    std::vector<void *> scratchOut = m.outputLayout().pointers(slots_.scratchOutputs(in.chunk).data());
    c.outputs = scratchOut.data(); // the sent outputs may still be in flight
    c.step = s.fwdStep; // same dropout masks as the forward; its loss goes to a slot nobody reads
    m.lib().forward(c);
    break;
  }
  case Op::Bwd:
  case Op::BwdInput:
  case Op::BwdWeight: {
    c.step = s.fwdStep;
    if (!s.fwdDone || !s.workspace)
      fail(what + ": backward before its forward" + (recomputes_[in.chunk][in.mb] ? std::string(" or RECOMPUTE") : ""));
    if (in.op != Op::BwdWeight) {
      if (s.bDone) fail(what + ": backward computed twice");
      if (localNext) {
        Slot &n = slots_.get(chunkOf(vs + 1), in.mb, false);
        if (!n.bDone) fail(what + ": backward before the next chunk's backward");
        device_.copy(s.gradOutputs.data() + 64, n.gradInputs.data() + 64, m.outputLayout().total - 64);
        s.haveGradOutputs = true;
        n.gradHandedOff = true;
        slots_.maybeRelease(chunkOf(vs + 1), n);
      }
      if (d.num_outputs && !s.haveGradOutputs) fail(what + ": backward before its output gradient arrived");
      if (gpu_ && s.gradOutputsReceived) device_.streamWait(nullptr, s.gradOutputsIn); // the RECV_GRAD
      awaitBundle(s, true);
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
      if ((int64_t)currentIndex_ == gradientsFinalAt_[(size_t)in.chunk] && !validating_) sync_->gradientsFinal(in.chunk);
      if (in.chunk == 0) sync_->countMicrobatch();
      stash_.release(in.chunk, in.mb); // the backward releases the micro-batch's kept version
      slots_.maybeRelease(in.chunk, s);
    }
    break;
  }
  default:
    break;
  }
}

// ---------------------------------------------------------------- transfers
void Executor::send(const Instr &in, int64_t it, bool grad) {
  Chunk &ch = chunks_[in.chunk];
  const int vsDest = grad ? ch.vs - 1 : ch.vs + 1;
  if (vsDest < 0 || vsDest >= V_ || plan_.vstages[vsDest].stage != plan_.stageOfScheduleRank(in.peer))
    fail(toString(in) + ": peer rank " + std::to_string(in.peer) + " does not run virtual stage " + std::to_string(vsDest));
  Slot &s = slots_.get(in.chunk, in.mb, false);
  if (grad ? !s.bDone : !s.fwdDone) fail(toString(in) + ": sent before it was computed");
  Buffer &buf = grad ? s.gradInputs : s.outputs;
  const Layout &layout = grad ? ch.model->inputLayout() : ch.model->outputLayout();
  const BundleHeader h = bundleHeader(in, it, grad, vsDest, layout.hash, layout.total);
  const int peer = plan_.mpiRankOf(in.peer);
  // CUDA: the send's stream waits for the compute that filled the bundle
  // (not for whatever was enqueued after it), then writes the header and
  // sends, overlapping the compute stream's next work. Host: at once.
  const Stream st = transport_.stream(peer, true);
  if (gpu_) device_.streamWait(st, grad ? s.gradInputsDone : s.outputsDone);
  device_.writeSmall(buf.data(), &h, sizeof h, st);
  s.sends.push_back(transport_.isend(buf.data(), layout.total, peer, bundleTag(in.mb, grad, vsDest, V_)));
  if (validating_) releaseEvaluated(in.chunk, s);
  if (grad) {
    s.gradHandedOff = true;
    slots_.maybeRelease(in.chunk, s);
  }
}

void Executor::recv(const Instr &in, int64_t it, bool grad) {
  Chunk &ch = chunks_[in.chunk];
  const int vsSrc = grad ? ch.vs + 1 : ch.vs - 1;
  if (vsSrc < 0 || vsSrc >= V_ || plan_.vstages[vsSrc].stage != plan_.stageOfScheduleRank(in.peer))
    fail(toString(in) + ": peer rank " + std::to_string(in.peer) + " does not run virtual stage " + std::to_string(vsSrc));
  Slot &s = slots_.get(in.chunk, in.mb, !grad);
  Buffer &buf = grad ? s.gradOutputs : s.inputs;
  const Layout &layout = grad ? ch.model->outputLayout() : ch.model->inputLayout();
  const int peer = plan_.mpiRankOf(in.peer);
  const int tag = bundleTag(in.mb, grad, ch.vs, V_);
  if (!gpu_) {
    // Posted here, where the stream's deadlock-free order has it, and waited
    // for by the compute that reads it (awaitBundle): the transfer overlaps
    // the work in between instead of stalling it (docs/runtime.md).
    std::optional<Slot::Pending> &pending = grad ? s.gradOutputsPending : s.inputsPending;
    if (pending) fail(toString(in) + ": a receive into this bundle is already pending");
    pending = Slot::Pending{transport_.irecv(buf.data(), layout.total, peer, tag), in, it};
  } else {
    // Enqueued on the receiving stream once the slot may be written; the
    // consuming compute waits for `inputsIn`/`gradOutputsIn` on the device.
    // The header travels to pinned host memory behind the bundle and is
    // checked when it is there (HeaderChecks), without stalling the host.
    const Stream st = transport_.stream(peer, false);
    device_.streamWait(st, s.ready);
    transport_.release(transport_.irecv(buf.data(), layout.total, peer, tag));
    // Unusable (0xff bytes) before the compute reads it when its header is
    // not the one expected; HeaderChecks then says which it was.
    const BundleHeader expected = bundleHeader(in, it, grad, ch.vs, layout.hash, layout.total);
    device_.guardBundle(buf.data(), layout.total, &expected, kCheckedHeaderBytes, sizeof expected, st);
    headers_.expect(st, buf.data(), in, it, grad, ch.vs, layout.hash,
                    stream_.path + " #" + std::to_string(currentIndex_) + " " + toString(in) + " (iteration " +
                        std::to_string(it) + ")");
    device_.record(grad ? s.gradOutputsIn : s.inputsIn, st);
    (grad ? s.gradOutputsReceived : s.inputsReceived) = true;
  }
  (grad ? s.haveGradOutputs : s.haveInputs) = true;
}

void Executor::awaitBundle(Slot &s, bool grad) {
  std::optional<Slot::Pending> &pending = grad ? s.gradOutputsPending : s.inputsPending;
  if (!pending) return; // local, or already there
  transport_.wait(pending->request);
  const Chunk &ch = chunks_[pending->recv.chunk];
  const Layout &layout = grad ? ch.model->outputLayout() : ch.model->inputLayout();
  BundleHeader h;
  std::memcpy(&h, (grad ? s.gradOutputs : s.inputs).data(), sizeof h);
  const std::string e = headerError(h, pending->recv, pending->iteration, grad, ch.vs, layout.hash);
  pending.reset();
  if (!e.empty()) fail(e);
}

// ---------------------------------------------------------------- dispatch
void Executor::execute(const Instr &in, int64_t it) {
  switch (in.op) {
  case Op::Load: {
    int chunk = -1;
    for (int c = 0; c < plan_.chunks; ++c)
      if (chunks_[c].vs == 0) chunk = c;
    if (chunk < 0) fail(toString(in) + ": LOAD on a rank that does not run the first stage");
    loadData(chunk, slots_.get(chunk, in.mb, true), in.mb, it);
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
  case Op::Stash: stash_.stash(in, chunks_, plan_.replicasOf(stage_)); break;
  case Op::Restore: stash_.restore(in); break;
  case Op::AllReduce:
    if (in.peer != stage_) fail(toString(in) + ": all-reduce of another stage");
    sync_->allreduce();
    break;
  case Op::Step: sync_->step(); break;
  case Op::SpecStep: sync_->specStep(); break;
  case Op::Validate: sync_->validate(); break;
  case Op::Rollback: sync_->rollback(it); break;
  }
}

void Executor::iteration(int64_t it) {
  lossSum_ = lossCount_ = 0;
  stash_.startIteration(chunks_);
  for (size_t i = 0; i < stream_.instrs.size(); ++i) {
    const Instr &in = stream_.instrs[i];
    watchIteration_.store(it, std::memory_order_relaxed);
    watchIndex_.store((int64_t)i, std::memory_order_relaxed);
    // CUDA: check the headers of the bundles that arrived so far (their
    // errors name their own RECV instruction).
    if (gpu_ && (in.op == Op::RecvAct || in.op == Op::RecvGrad)) headers_.poll(false);
    currentIndex_ = i;
    const double t0 = RunRecorder::now();
    try {
      execute(in, it);
    } catch (const Error &e) {
      throw Error(stream_.path + " #" + std::to_string(i) + " " + toString(in) + " (iteration " + std::to_string(it) +
                  "): " + e.what());
    }
    const double t1 = RunRecorder::now();
    if (watchdog_) watchdog_->progress();
    recorder_.record(in, it, t0, t1);
  }
  watchIndex_.store(-1, std::memory_order_relaxed);
  if (gpu_) headers_.poll(true); // every receive of the iteration is enqueued: wait for them and check
  collectLosses(it);
  sync_->checkSteps(it);
  for (int c = 0; c < plan_.chunks; ++c) {
    if (const int mb = slots_.firstActive(c); mb >= 0)
      fail(stream_.path + ": micro-batch " + std::to_string(mb) + " of chunk " + std::to_string(c) +
           " is unfinished at the end of the stream (missing backward or transfer)");
    if (const int mb = stash_.firstKept(c); mb >= 0)
      fail(stream_.path + ": a weight version stashed for micro-batch " + std::to_string(mb) + " was never released");
  }
  if (sync_->unapplied() != 0)
    fail(stream_.path + ": gradients of " + std::to_string(sync_->unapplied()) +
         " micro-batches were never applied by a STEP");
}

void Executor::collectLosses(int64_t it) {
  if (!holdsLoss_) return;
  std::vector<float> losses(lossInstr_.size());
  device_.download(losses.data(), losses_.data(), losses.size() * sizeof(float)); // the iteration's one wait
  for (size_t mb = 0; mb < losses.size(); ++mb) {
    const int64_t i = lossInstr_[mb];
    if (i < 0) continue;
    lossInstr_[mb] = -1;
    const float loss = losses[mb];
    if (validating_) {
      validationLossSum_ += loss, validationLossCount_ += 1;
      continue;
    }
    if (!std::isfinite(loss)) {
      const Instr &in = stream_.instrs[(size_t)i];
      try {
        sync_->nonFinite("the loss of micro-batch " + std::to_string(mb) + " (global micro-batch " +
                             std::to_string(it * plan_.microbatches + (int64_t)mb) + ") is " +
                             (std::isnan(loss) ? "NaN" : loss > 0 ? "+inf" : "-inf") + " on stage " +
                             std::to_string(chunks_[in.chunk].vs),
                         it);
      } catch (const Error &e) {
        throw Error(stream_.path + " #" + std::to_string(i) + " " + toString(in) + " (iteration " + std::to_string(it) +
                    "): " + e.what());
      }
    }
    lossSum_ += loss, lossCount_ += 1;
  }
}

void Executor::releaseEvaluated(int chunk, Slot &s) {
  s.bDone = s.wDone = s.gradHandedOff = true;
  evaluated_.emplace_back(chunk, &s);
}

void Executor::validate(int64_t after) {
  if (watchdog_) watchdog_->phase("the validation after iteration " + std::to_string(after + 1));
  validating_ = true;
  validationLossSum_ = validationLossCount_ = 0;
  for (int64_t round = 0; round < validationRounds_; ++round) {
    for (size_t i = 0; i < forwardStream_.size(); ++i) {
      const Instr &in = forwardStream_[i];
      if (gpu_ && in.op == Op::RecvAct) headers_.poll(false);
      try {
        execute(in, round);
      } catch (const Error &e) {
        throw Error(stream_.path + " (validation, round " + std::to_string(round) + ") " + toString(in) + ": " +
                    e.what());
      }
      if (watchdog_) watchdog_->progress();
    }
    if (gpu_) headers_.poll(true);
    collectLosses(round);
    for (auto &[chunk, slot] : evaluated_) slots_.maybeRelease(chunk, *slot);
    evaluated_.clear();
    for (int c = 0; c < plan_.chunks; ++c)
      if (const int mb = slots_.firstActive(c); mb >= 0)
        fail(stream_.path + ": validation micro-batch " + std::to_string(mb) + " of chunk " + std::to_string(c) +
             " is unfinished at the end of the stream");
  }
  validating_ = false;
  if (!holdsLoss_) return;
  double v[2] = {validationLossSum_, validationLossCount_};
  control_.allreduceSumStage(v, 2); // replicas of the loss stage
  if (replica_ == 0)
    std::printf("piperun: validation after iter %lld/%d  loss %.6f  (%lld micro-batches of %lld, %s)\n",
                (long long)(after + 1), opt_.iters, v[0] / v[1], (long long)v[1], (long long)plan_.microbatchSize,
                opt_.evalDataFile.c_str());
  std::fflush(stdout);
}

void Executor::run() {
  if (watchdog_) watchdog_->phase("start-up: the barrier before the first iteration (MPI_Barrier)");
  control_.barrier();
  recorder_.start(plan_.chunks);
  double total = 0, lastLoss = NAN;
  int64_t done = 0;
  double windowStart = RunRecorder::now();
  for (int64_t it = startIteration_; it < opt_.iters; ++it) {
    recorder_.beginIteration(it, startIteration_, opt_.iters);
    const double start = RunRecorder::now();
    if (watchdog_) watchdog_->iterations([this] { return describeCurrent(); });
    iteration(it);
    const double seconds = RunRecorder::now() - start;
    if (watchdog_) watchdog_->iterationDone(seconds);
    total += seconds;
    ++done;
    if (holdsLoss_) {
      double v[2] = {lossSum_, lossCount_};
      control_.allreduceSumStage(v, 2); // replicas of the loss stage
      lastLoss = v[0] / v[1];
      const bool log = (it + 1) % std::max(1, opt_.logEvery) == 0 || it + 1 == opt_.iters;
      if (replica_ == 0 && log && !opt_.quiet) {
        const int64_t window = (it + 1 - startIteration_) % std::max(1, opt_.logEvery) == 0 ? std::max(1, opt_.logEvery) : 1;
        const double elapsed = RunRecorder::now() - windowStart;
        const double perIter = elapsed / (double)std::min<int64_t>(window, done);
        const double samplesPerSecond = plan_.microbatchSize * plan_.microbatches / perIter;
        std::printf("piperun: iter %lld/%d  loss %.6f  %.2f ms/iter  %.1f samples/s%s\n", (long long)(it + 1),
                    opt_.iters, lastLoss, perIter * 1e3, samplesPerSecond, tokenRate(samplesPerSecond).c_str());
        std::fflush(stdout);
      }
      if (log) windowStart = RunRecorder::now();
    }
    if (!opt_.checkpointDir.empty() && opt_.saveEvery > 0 && (it + 1) % opt_.saveEvery == 0) {
      if (watchdog_) watchdog_->phase("the checkpoint of iteration " + std::to_string(it + 1));
      saveCheckpoint(control_, plan_, chunks_, replica_, opt_.checkpointDir, it + 1, seed_, opt_.quiet);
    }
    if (validationData_ && ((opt_.evalEvery > 0 && (it + 1) % opt_.evalEvery == 0) || it + 1 == opt_.iters)) {
      validate(it);
      windowStart = RunRecorder::now(); // the progress lines time training only
    }
  }
  if (watchdog_) watchdog_->phase("the end of the run (sends, trace, profile, export)");
  const int64_t rollbacks = sync_->rollbacks(), skipped = sync_->skippedSteps();
  if (holdsLoss_ && replica_ == 0 && done > 0 && !opt_.quiet) {
    const double samplesPerSecond = plan_.microbatchSize * plan_.microbatches * done / total;
    std::printf("piperun: done: %lld iterations in %.3f s, %.2f ms/iter, %.1f samples/s%s, final loss %.6f%s\n",
                (long long)done, total, total / done * 1e3, samplesPerSecond, tokenRate(samplesPerSecond, ",").c_str(),
                lastLoss,
                (rollbacks || skipped)
                    ? (", " + std::to_string(rollbacks) + " clipped redo(s), " + std::to_string(skipped) + " skipped step(s)").c_str()
                    : "");
    std::fflush(stdout);
  }
  if (gpu_) {
    // Nothing may be in flight when the buffers and communicators go.
    slots_.waitSends();
    device_.synchronize();
  }
  recorder_.write(control_, plan_, device_, chunks_, scheduleRank_, stage_, replica_);
  if (!opt_.exportDir.empty()) exportWeights(control_, plan_, chunks_, replica_, opt_.exportDir);
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
  case Op::RecvGrad: s += ", posting a receive from " + rankName(in.peer); break;
  case Op::Fwd:
  case Op::Bwd:
  case Op::BwdInput:
    // Host transports wait here for the bundle the stream's RECV posted.
    for (int64_t j = i - 1; j >= 0; --j) {
      const Instr &r = stream_.instrs[(size_t)j];
      if (r.op == (in.op == Op::Fwd ? Op::RecvAct : Op::RecvGrad) && r.mb == in.mb && r.chunk == in.chunk) {
        s += ", computing or waiting for its data from " + rankName(r.peer);
        break;
      }
    }
    break;
  case Op::AllReduce: {
    std::string others;
    for (int q = 0; q < plan_.replicasOf(stage_); ++q)
      if (q != replica_) others += (others.empty() ? "" : ", ") + std::to_string(plan_.ranks[stage_][q]);
    s += ", waiting for the other replicas of stage " + std::to_string(stage_) + " (rank " + others + ")";
    break;
  }
  case Op::Step:
  case Op::Validate:
    if (in.op == Op::Validate || sync_->optimizer().maxGradNorm > 0)
      s += ", waiting for every rank (gradient norm all-reduce)";
    break;
  default: break;
  }
  return s;
}

} // namespace pipec::rt
