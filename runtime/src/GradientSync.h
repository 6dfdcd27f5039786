// From the backward passes to the optimizer step (docs/runtime.md, "How a
// rank executes its stream" and "Non-finite loss and gradients"): the count
// of micro-batches, the all-reduce over a stage's replicas, tied parameters
// summed over their holders, the global gradient norm for clipping, the
// non-finite checks, and ZB-H2's speculative step (SPEC_STEP, VALIDATE,
// ROLLBACK).
#pragma once

#include "Chunk.h"
#include "Transport.h"

#include <string>
#include <vector>

namespace pipec::rt {

class GradientSync {
public:
  // Checks the tied parameters this rank holds (throws Error). `who` names
  // the rank in warnings ("rank 2 (stage 1, replica 0)").
  GradientSync(const Plan &plan, const OptimizerConfig &optimizer, bool allowNonFinite, Control &control,
               Transport &transport, Device &device, std::vector<Chunk> &chunks, int stage, int replica,
               std::string who);

  // Collective over every rank, in plan order: one communicator per tied
  // parameter (all ranks of all its holders), added to `connections`.
  void splitTiedGroups(Connections &connections);

  const OptimizerConfig &optimizer() const { return optimizer_; }
  // A micro-batch's weight gradient is done (counted once per rank).
  void countMicrobatch() { mbSinceStep_ += 1; }
  // Micro-batches whose gradients no STEP applied yet.
  int unapplied() const { return (int)mbSinceStep_; }
  int64_t rollbacks() const { return rollbacks_; }
  int64_t skippedSteps() const { return skippedSteps_; }

  ~GradientSync();
  // Chunk c's weight gradients of this iteration are final and nothing
  // before ALLREDUCE touches them (the executor decides, the replicas
  // agreed on the order): where the transport has a reduction stream, their
  // sum over the replicas starts there now, overlapping what the compute
  // stream does until ALLREDUCE.
  void gradientsFinal(int chunk);
  void allreduce();          // ALLREDUCE (and the replicas' BatchNorm statistics averaged)
  void step();               // STEP: decided and applied on the device, no host round trip (but clipping over ranks)
  // At the end of iteration `it`: what the STEPs decided (one host read):
  // counts a skipped step and, for non-finite gradients of this rank, stops
  // training naming them (Error) unless --allow-nonfinite.
  void checkSteps(int64_t it);
  void specStep();           // SPEC_STEP
  void validate();           // VALIDATE
  void rollback(int64_t it); // ROLLBACK
  // A non-finite loss or gradient: stops training (Error) unless
  // --allow-nonfinite, which warns once.
  void nonFinite(const std::string &what, int64_t it);

private:
  void sumGradients(StageModel &m, Stream stream);
  void averageBuffers(Stream stream);
  double finishGradients(); // scale by 1/count; returns the number of micro-batches
  void reduceTied();        // sum tied parameters' gradients over their holders
  void gradStats(double &sumSq, double &nonFinite); // replica 0's share of the global norm
  // Which trained parameters of this rank have non-finite gradients.
  std::string nonFiniteGradients();

  const Plan &plan_;
  const OptimizerConfig optimizer_;
  const bool allowNonFinite_;
  Control &control_;
  Transport &transport_;
  Device &device_;
  std::vector<Chunk> &chunks_;
  const int stage_, replica_;
  const std::string who_;

  // The replicas' sums on the transport's reduction stream (gradientsFinal).
  std::vector<char> summedEarly_;      // per chunk, this iteration
  std::vector<Event> gradientsFinal_;  // per chunk: recorded on the compute stream
  Event allFinal_ = nullptr, summed_ = nullptr;

  // Tied parameters this rank holds (runtime.tied): per entry of plan.tied
  // with a holder chunk here, its communicator group and the (chunk, param
  // index) of each copy on this rank (two with ZB-V placement).
  struct TiedHolding {
    int tied = 0, group = -1;
    std::vector<std::pair<int, int>> copies;
  };
  std::vector<TiedHolding> tied_;
  std::vector<std::vector<bool>> normSkip_; // per chunk: tied copies the norm counts at another holder

  // The STEP's verdict, in the device's memory (verdict_): stats_[0..1] the
  // statistics it was decided on (world sums under clipping), [2..3] this
  // rank's own, then the control the stage's update reads.
  Buffer verdict_;
  double *stats_ = nullptr;
  pipec_step_control *stepControl_ = nullptr;
  bool checkPending_ = false; // a STEP since the last checkSteps

  // Between steps.
  double mbSinceStep_ = 0, reducedCount_ = -1;
  std::vector<WeightSnapshot> preStep_; // SPEC_STEP: per chunk
  double validatedSumSq_ = 0, validatedNonFinite_ = 0;
  bool validated_ = false;
  double localNonFinite_ = 0; // SPEC_STEP: this rank's share of the non-finite count
  int64_t rollbacks_ = 0, skippedSteps_ = 0;
  bool warnedNonFinite_ = false; // --allow-nonfinite: reported once
};

} // namespace pipec::rt
