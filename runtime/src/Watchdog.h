// The watchdog (docs/runtime.md, "Watchdog"): a thread that ends the rank
// with a message when it makes no progress for too long, so that a stopped,
// lost or deadlocked peer never hangs the job. It is on by default.
//
// Limits: `--watchdog S` (S > 0) allows S seconds everywhere; `--watchdog 0`
// turns it off. By default: kLongPhaseSeconds during start-up, the first
// iteration (of a run or of a resumed run), checkpoints and the end of the
// run (trace, profile, export); afterwards, per instruction,
// max(kFloorSeconds, kIterationFactor x the slowest iteration so far).
//
// When it fires it prints "piperun: WHO: error: no progress for ... in WHAT"
// (WHAT from the current phase, or from the describer during iterations:
// the instruction and whom it waits for) and exits the process with status
// 3; mpirun then ends the other ranks.
#pragma once

#include <atomic>
#include <functional>
#include <mutex>
#include <string>
#include <thread>

namespace pipec::rt {

class Watchdog {
public:
  static constexpr double kLongPhaseSeconds = 600, kFloorSeconds = 60, kIterationFactor = 10;

  // seconds > 0: fixed limit; 0: off; < 0: the default policy. Starts the
  // thread (unless off).
  explicit Watchdog(double seconds);
  ~Watchdog();
  Watchdog(const Watchdog &) = delete;
  Watchdog &operator=(const Watchdog &) = delete;

  bool enabled() const { return seconds_ != 0; }
  void setWho(const std::string &who); // "rank 1 (stage 1, replica 0)"
  // A phase with a fixed description (start-up steps, checkpoint, end of
  // run): the long allowance under the default policy. Marks progress.
  void phase(const std::string &what);
  // Iterations: the message comes from `describe` (called on the watchdog
  // thread when it fires, while the rank is stuck). Marks progress.
  void iterations(std::function<std::string()> describe);
  // One instruction done: one relaxed atomic store.
  void progress();
  // An iteration took `seconds`: from now on the default policy allows
  // max(kFloorSeconds, kIterationFactor x the slowest so far) per instruction.
  void iterationDone(double seconds);
  // The limit in force now (seconds; 0 when off).
  double limit() const;
  // The policy, for messages: "--watchdog 5" or "default watchdog: ...".
  std::string policy() const;

private:
  void loop();
  const double seconds_;
  std::atomic<double> lastProgress_{0}, slowest_{0};
  std::atomic<bool> longPhase_{true}, stop_{false};
  std::mutex mutex_; // guards who_, what_, describe_
  std::string who_ = "rank ?", what_ = "start-up";
  std::function<std::string()> describe_;
  std::thread thread_;
};

} // namespace pipec::rt
