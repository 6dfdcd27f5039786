#include "GradientSync.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

namespace pipec::rt {

GradientSync::GradientSync(const Plan &plan, const OptimizerConfig &optimizer, bool allowNonFinite, Control &control,
                           Transport &transport, Device &device, std::vector<Chunk> &chunks, int stage, int replica,
                           std::string who)
    : plan_(plan), optimizer_(optimizer), allowNonFinite_(allowNonFinite), control_(control), transport_(transport),
      device_(device), chunks_(chunks), stage_(stage), replica_(replica), who_(std::move(who)),
      summedEarly_(chunks.size(), 0), gradientsFinal_(chunks.size(), nullptr) {
  // Tied parameters: every holder chunk on this rank must have the
  // parameter, trained and floating-point (shapes are compared across ranks
  // in Executor::checkNeighbours).
  if (!plan.tied.empty() && plan.asynchronous)
    throw Error(plan.planPath + ": runtime.tied: tied parameters across stages (" + plan.tied[0].name +
                ") are not supported with an asynchronous schedule (" + choiceName(plan.schedule) +
                "): the holders step at different times, so their copies would diverge");
  verdict_ = Buffer(device_, 4 * sizeof(double) + sizeof(pipec_step_control));
  stats_ = (double *)verdict_.data();
  stepControl_ = (pipec_step_control *)(stats_ + 4);
  normSkip_.assign(chunks.size(), {});
  for (size_t c = 0; c < chunks.size(); ++c) normSkip_[c].assign(chunks[c].model->desc().num_params, false);
  for (size_t t = 0; t < plan.tied.size(); ++t) {
    const TiedParam &tp = plan.tied[t];
    TiedHolding h;
    h.tied = (int)t;
    for (size_t c = 0; c < chunks.size(); ++c) {
      const Chunk &ch = chunks[c];
      if (std::find(tp.stages.begin(), tp.stages.end(), ch.vs) == tp.stages.end()) continue;
      const int i = ch.model->paramIndex(tp.name);
      const std::string lib = ch.model->vstage().library;
      if (i < 0)
        throw Error(lib + ": runtime.tied lists stage " + std::to_string(ch.vs) + " as a holder of " + tp.name +
                    ", but the stage library has no parameter of that name");
      const pipec_param_desc &pd = ch.model->desc().params[i];
      if (pd.role != PIPEC_TRAINED)
        throw Error(lib + ": tied parameter " + tp.name + " is a buffer, not a trained parameter");
      if (pd.tensor.dtype != PIPEC_F32 && pd.tensor.dtype != PIPEC_F64)
        throw Error(lib + ": tied parameter " + tp.name + " must be f32 or f64, is " + io::dtypeName(pd.tensor.dtype));
      h.copies.push_back({(int)c, i});
      normSkip_[c][i] = ch.vs != tp.stages.front(); // the global norm counts the first holder's copy
    }
    if (!h.copies.empty()) tied_.push_back(h);
  }
}

void GradientSync::splitTiedGroups(Connections &connections) {
  for (size_t t = 0, k = 0; t < plan_.tied.size(); ++t) {
    const bool member = k < tied_.size() && tied_[k].tied == (int)t;
    const int g = control_.splitGroup(member);
    if (member) tied_[k++].group = g, connections.groups.push_back(g);
  }
}

GradientSync::~GradientSync() {
  for (Event e : gradientsFinal_) device_.deleteEvent(e);
  device_.deleteEvent(allFinal_);
  device_.deleteEvent(summed_);
}

void GradientSync::sumGradients(StageModel &m, Stream stream) {
  const pipec_stage_desc &d = m.desc();
  bool allF32 = true;
  for (int i = 0; i < d.num_params; ++i) allF32 &= d.params[i].tensor.dtype == PIPEC_F32;
  if (allF32) {
    // One call over the whole buffer: padding and buffer slots are zeros.
    transport_.allreduceSumStage(m.grads().data(), m.grads().size() / 4, PIPEC_F32, stream);
  } else {
    for (int i = 0; i < d.num_params; ++i)
      if (d.params[i].role == PIPEC_TRAINED)
        transport_.allreduceSumStage(m.grads().data() + m.paramLayout().offsets[i],
                                     m.paramLayout().bytes[i] / io::dtypeSize(d.params[i].tensor.dtype),
                                     d.params[i].tensor.dtype, stream);
  }
}

void GradientSync::gradientsFinal(int chunk) {
  const Stream reduction = transport_.reductionStream();
  if (!reduction) return;
  Event &done = gradientsFinal_[(size_t)chunk];
  if (!done) done = device_.newEvent();
  device_.record(done); // on the compute stream, after the chunk's last weight gradient
  device_.streamWait(reduction, done);
  sumGradients(*chunks_[(size_t)chunk].model, reduction);
  summedEarly_[(size_t)chunk] = 1;
}

void GradientSync::allreduce() {
  // With a reduction stream the sums run there, in one order on every
  // replica (the chunks summed early first, in the order they became final,
  // then the others in chunk order), and the compute stream waits for them
  // only here (averageBuffers).
  const Stream reduction = transport_.reductionStream();
  if (reduction) {
    if (!allFinal_) allFinal_ = device_.newEvent(), summed_ = device_.newEvent();
    device_.record(allFinal_);
    device_.streamWait(reduction, allFinal_);
  }
  for (size_t c = 0; c < chunks_.size(); ++c)
    if (!summedEarly_[c]) sumGradients(*chunks_[c].model, reduction);
  averageBuffers(reduction);
  summedEarly_.assign(chunks_.size(), 0);
  double count = mbSinceStep_;
  control_.allreduceSumStage(&count, 1);
  reducedCount_ = count;
}

// BatchNorm's running statistics (PIPEC_BUFFER parameters), which each
// replica's forwards update from its own micro-batches: averaged over the
// replicas at every step, so that the stage keeps one copy, as data-parallel
// PyTorch does, and what replica 0 saves and exports is the stage's. Summed
// on `stream` (the reduction stream; the compute stream when nullptr) after
// the gradients, then, once the compute stream waited for every sum, scaled.
void GradientSync::averageBuffers(Stream stream) {
  const int replicas = plan_.replicasOf(stage_);
  std::vector<Span> buffers;
  for (auto &ch : chunks_) {
    StageModel &m = *ch.model;
    const pipec_stage_desc &d = m.desc();
    for (int i = 0; i < d.num_params && replicas > 1; ++i) {
      const pipec_dtype dt = d.params[i].tensor.dtype;
      if (d.params[i].role != PIPEC_BUFFER) continue;
      if (dt != PIPEC_F32 && dt != PIPEC_F64)
        throw Error(m.vstage().library + ": the replicas of buffer " + d.params[i].tensor.name + " (" +
                    io::dtypeName(dt) + ") cannot be averaged: only f32 and f64 buffers can");
      char *p = m.params().data() + m.paramLayout().offsets[i];
      const size_t n = m.paramLayout().bytes[i] / io::dtypeSize(dt);
      transport_.allreduceSumStage(p, n, dt, stream);
      buffers.push_back({p, n, dt});
    }
  }
  if (stream) {
    device_.record(summed_, stream);
    device_.streamWait(nullptr, summed_);
  }
  for (const Span &b : buffers) device_.scale(const_cast<void *>(b.p), b.n, b.dtype, 1.0 / replicas);
}

double GradientSync::finishGradients() {
  const double count = reducedCount_ >= 0 ? reducedCount_ : mbSinceStep_;
  if (count <= 0) throw Error("STEP without any gradient since the previous step");
  for (auto &ch : chunks_) ch.model->scaleGrads(1.0 / count);
  return count;
}

void GradientSync::reduceTied() {
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

void GradientSync::gradStats(double &sumSq, double &nonFinite) {
  for (size_t c = 0; c < chunks_.size(); ++c) chunks_[c].model->gradStats(sumSq, nonFinite, &normSkip_[c]);
}

void GradientSync::step() {
  finishGradients();
  reduceTied();
  const bool clip = optimizer_.maxGradNorm > 0;
  if (!clip && allowNonFinite_) { // nothing to decide: the update applies what it gets
    for (auto &ch : chunks_) {
      ch.model->applyStep(optimizer_);
      ch.model->grads().zero();
    }
  } else {
    // The verdict is computed where the gradients are: statistics, then the
    // control the stage's update reads; the host learns it at the
    // iteration's end (checkSteps). Under clipping the norm is global:
    // replicas hold identical reduced gradients, so only replica 0
    // contributes, and the sum over ranks is the one host round trip left.
    if (!clip || replica_ == 0) {
      std::vector<Span> spans;
      for (size_t c = 0; c < chunks_.size(); ++c) {
        std::vector<Span> own = chunks_[c].model->gradSpans(&normSkip_[c]);
        spans.insert(spans.end(), own.begin(), own.end());
      }
      device_.gradientStats(spans, stats_);
    } else {
      device_.zero(stats_, 2 * sizeof(double));
    }
    device_.copy(stats_ + 2, stats_, 2 * sizeof(double)); // this rank's own counts, for checkSteps
    if (clip && control_.size() > 1) {
      double v[2];
      device_.download(v, stats_, sizeof v);
      control_.allreduceSumWorld(v, 2);
      device_.writeSmall(stats_, v, sizeof v);
    }
    device_.stepControl(stats_, clip ? optimizer_.maxGradNorm : 0.0, stepControl_);
    for (auto &ch : chunks_) {
      ch.model->applyStep(optimizer_, stepControl_);
      device_.zeroUnlessSkipped(ch.model->grads().data(), ch.model->grads().size(), stepControl_);
    }
    checkPending_ = true;
  }
  mbSinceStep_ = 0;
  reducedCount_ = -1;
}

void GradientSync::checkSteps(int64_t it) {
  if (!checkPending_) return;
  checkPending_ = false;
  double v[4]; // the verdict's statistics, then this rank's own
  device_.download(v, stats_, sizeof v);
  if (v[1] <= 0) return;
  // A step was skipped (an asynchronous schedule's later steps in this
  // iteration skip too: the gradients stay non-finite until zeroed here).
  // The rank whose gradients are not finite stops the job unless allowed;
  // the others are ended by its abort.
  ++skippedSteps_;
  if (v[3] > 0) nonFinite(nonFiniteGradients(), it);
  for (auto &ch : chunks_) ch.model->grads().zero();
}

void GradientSync::specStep() {
  // ZB-H2: update now, keep the pre-step weights until VALIDATE/ROLLBACK
  // decide; the gradients stay until then (a clipped redo needs them).
  finishGradients();
  reduceTied();
  double v[2] = {0, 0};
  if (replica_ == 0) gradStats(v[0], v[1]);
  validatedSumSq_ = v[0], validatedNonFinite_ = v[1];
  localNonFinite_ = v[1];
  preStep_.clear();
  for (auto &ch : chunks_) {
    preStep_.push_back(ch.model->snapshot());
    ch.model->applyStep(optimizer_);
  }
  validated_ = false;
}

void GradientSync::validate() {
  if (preStep_.empty()) throw Error("VALIDATE without a SPEC_STEP");
  double v[2] = {validatedSumSq_, validatedNonFinite_};
  control_.allreduceSumWorld(v, 2);
  validatedSumSq_ = v[0], validatedNonFinite_ = v[1];
  validated_ = true;
}

void GradientSync::rollback(int64_t it) {
  if (!validated_) throw Error("ROLLBACK before VALIDATE");
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
  for (auto &ch : chunks_) ch.model->grads().zero();
  preStep_.clear();
  validated_ = false;
  mbSinceStep_ = 0;
  reducedCount_ = -1;
}

void GradientSync::nonFinite(const std::string &what, int64_t it) {
  if (!allowNonFinite_)
    throw Error(what + " in iteration " + std::to_string(it) + "; training stopped (--allow-nonfinite continues)");
  if (warnedNonFinite_) return;
  warnedNonFinite_ = true;
  std::fprintf(stderr, "piperun: %s: warning: %s in iteration %lld; continuing (--allow-nonfinite; later ones are "
               "not reported)\n",
               who_.c_str(), what.c_str(), (long long)it);
  std::fflush(stderr);
}

std::string GradientSync::nonFiniteGradients() {
  // Rare (training is about to stop): one statistics call per parameter.
  std::string found;
  int count = 0;
  for (auto &ch : chunks_) {
    const pipec_stage_desc &d = ch.model->desc();
    std::vector<bool> only(d.num_params, true);
    for (int i = 0; i < d.num_params; ++i) {
      if (d.params[i].role != PIPEC_TRAINED) continue;
      only[i] = false;
      double sumSq = 0, bad = 0;
      ch.model->gradStats(sumSq, bad, &only);
      only[i] = true;
      if (bad <= 0) continue;
      if (++count <= 3)
        found += std::string(found.empty() ? "" : ", ") + d.params[i].tensor.name + " (stage " + std::to_string(ch.vs) +
                 ", " + std::to_string((long long)bad) + " NaN/inf elements)";
    }
  }
  if (count > 3) found += " and " + std::to_string(count - 3) + " more";
  return "non-finite gradients at the optimizer step: " + (found.empty() ? std::string("(not located)") : found);
}

} // namespace pipec::rt
