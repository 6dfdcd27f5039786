// Runs one rank's instruction stream (docs/runtime.md, "How a rank executes").
// The executor checks the stream and dispatches each instruction; its parts
// keep the state: SlotPool (a micro-batch's buffers), WeightStash
// (STASH/RESTORE), HeaderChecks (received bundles, CUDA), GradientSync
// (all-reduce, tied parameters, clipping, the optimizer step), StageData,
// RunRecorder (trace, profile) and Checkpoint.h (checkpoints, export).
#pragma once

#include "Bundle.h"
#include "Chunk.h"
#include "DataPrefetch.h"
#include "GradientSync.h"
#include "Recorder.h"
#include "RunOptions.h"
#include "Slots.h"
#include "StageData.h"
#include "Transport.h"
#include "Watchdog.h"
#include "WeightStash.h"

#include <atomic>
#include <memory>
#include <vector>

namespace pipec::rt {

class Executor {
public:
  // `device` holds every buffer (the host for target cpu); a stream-ordered
  // transport (NCCL) needs a device that is not the host, and vice versa.
  Executor(const Plan &plan, const RunOptions &opt, Control &control, Transport &transport,
           Device &device = hostDevice());
  // Start-up checks that need every rank (neighbour layouts, the order of
  // transfers between each pair of ranks); throws Error.
  void checkNeighbours();
  // GPU ranks: each chunk's entry points once on scratch bundles, so that a
  // stage's lazy initialization is over before the first transfer (before
  // connect; docs/runtime.md, "Ranks sharing a GPU"). Nothing it changes
  // stays changed. No-op on CPU ranks.
  void warmUp();
  // Collective: the transport's communicators (after checkNeighbours).
  void connect();
  void run();
  std::string who() const; // "rank 2 (stage 1, replica 0)"
  // The watchdog that watches run() (piperun's; it also watches start-up).
  void setWatchdog(Watchdog *w) { watchdog_ = w; }

private:
  void iteration(int64_t it);
  // Validation after iteration `it` (docs/runtime.md, "Validation"): the
  // forward-only projection of the rank's stream, `validationRounds_` times,
  // on the held-out set, in inference mode; prints the mean loss.
  void validate(int64_t it);
  // A validation micro-batch's slot is done once its outputs left (sent,
  // copied to the next chunk, or the loss taken); it is returned at the end
  // of the round, when every rank has posted its receives, so that waiting
  // for its send cannot wait for a rank that waits for this one.
  void releaseEvaluated(int chunk, Slot &s);
  void execute(const Instr &in, int64_t it);
  void loadData(int chunk, Slot &s, int mb, int64_t it);
  void startDataPrefetch(); // prefetch_, for the iterations this run trains
  void compute(const Instr &in, int64_t it);
  void send(const Instr &in, int64_t it, bool grad);
  void recv(const Instr &in, int64_t it, bool grad);
  // Host transports: the compute about to read a received bundle waits for
  // its receive (posted by the RECV) and checks its header.
  void awaitBundle(Slot &s, bool grad);
  [[noreturn]] void fail(const std::string &msg) const;
  // The watchdog's message while iterating: the instruction and whom it waits for.
  std::string describeCurrent() const;
  // The progress lines' token rate of a sequence model ("  N tokens/s", after
  // `separator`), empty for other models (Plan::tokensPerSample).
  std::string tokenRate(double samplesPerSecond, const char *separator = " ") const;

  const Plan &plan_;
  RunOptions opt_;
  Control &control_;
  Transport &transport_;
  Device &device_;
  const bool gpu_; // device buffers, stream-ordered transport
  int scheduleRank_ = 0, stage_ = 0, replica_ = 0, V_ = 1;
  uint64_t seed_ = 0;
  RankStream stream_;
  size_t currentIndex_ = 0; // of the instruction being executed
  int64_t startIteration_ = 0;
  Connections connections_;

  // The parts; those after chunks_ refer to it.
  std::vector<Chunk> chunks_;
  std::vector<std::vector<bool>> recomputes_; // per chunk and micro-batch: a RECOMPUTE follows its FWD
  // Per chunk: the stream index of its last weight gradient before
  // ALLREDUCE when nothing in between touches its gradients (GradientSync
  // starts their sum there), else -1. checkNeighbours keeps them only where
  // every replica of the stage sums in the same order.
  std::vector<int64_t> gradientsFinalAt_;
  void findGradientsFinal();
  // One stage call's pointer tables (they must outlive the call) and the
  // fields of the call that they and the run settle; the caller sets the
  // rest (micro-batch, step, loss slot, workspace, inference).
  struct CallTables {
    std::vector<void *> params, data, inputs, outputs, gradOutputs, gradInputs, gradParams;
  };
  pipec_call stageCall(StageModel &m, char *params, char *data, char *inputs, char *outputs, char *gradOutputs,
                       char *gradInputs, CallTables &tables) const;
  SlotPool slots_;
  WeightStash stash_;
  HeaderChecks headers_;
  RunRecorder recorder_;
  std::unique_ptr<GradientSync> sync_; // made once the chunks are loaded
  std::unique_ptr<StageData> data_;
  std::unique_ptr<DataPrefetch> prefetch_; // reads data_ ahead (after it: destroyed first)
  // A CUDA rank generates synthetic training data on the device, in the
  // compute stream's order, instead of reading it ahead (prefetch_ is null).
  bool generatesData() const { return gpu_ && data_->synthetic(); }
  // --eval-data: the held-out fields, the stream's LOAD/FWD/SEND_ACT/RECV_ACT,
  // the rounds per validation, and whether one is running.
  std::unique_ptr<StageData> validationData_;
  std::vector<Instr> forwardStream_;
  int64_t validationRounds_ = 0;
  bool validating_ = false;
  // Whether a chunk of this rank computes the loss, or reads data fields.
  bool holdsLoss_ = false, readsData_ = false;
  std::vector<std::pair<int, Slot *>> evaluated_; // (chunk, slot) to return at the round's end

  // Loss of the last stage, per iteration, and per validation. The stage
  // writes each micro-batch's loss into losses_ (this device's memory, one
  // float per micro-batch) without waiting; collectLosses reads them once
  // per iteration (or validation round). lossInstr_: per micro-batch, the
  // FWD that wrote it (-1: none since the last read), for messages.
  Buffer losses_;
  std::vector<int64_t> lossInstr_;
  // Reads, checks (training: a non-finite loss stops it unless
  // --allow-nonfinite) and sums the losses written since the last call.
  void collectLosses(int64_t it);
  double lossSum_ = 0, lossCount_ = 0;
  double validationLossSum_ = 0, validationLossCount_ = 0;

  // Watchdog: reports the instruction a rank is stuck in, then exits.
  Watchdog *watchdog_ = nullptr;
  std::atomic<int64_t> watchIteration_{0}, watchIndex_{-1}; // -1: between iterations
};

} // namespace pipec::rt
