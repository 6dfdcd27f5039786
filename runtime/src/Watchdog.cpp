#include "Watchdog.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>

namespace pipec::rt {

namespace {
double now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}
} // namespace

Watchdog::Watchdog(double seconds) : seconds_(seconds) {
  lastProgress_ = now();
  if (enabled()) thread_ = std::thread([this] { loop(); });
}

Watchdog::~Watchdog() {
  stop_ = true;
  if (thread_.joinable()) thread_.join();
}

void Watchdog::setWho(const std::string &who) {
  std::lock_guard<std::mutex> lock(mutex_);
  who_ = who;
}

void Watchdog::phase(const std::string &what) {
  std::lock_guard<std::mutex> lock(mutex_);
  what_ = what;
  describe_ = nullptr;
  longPhase_ = true;
  lastProgress_ = now();
}

void Watchdog::iterations(std::function<std::string()> describe) {
  std::lock_guard<std::mutex> lock(mutex_);
  describe_ = std::move(describe);
  longPhase_ = slowest_.load() <= 0; // the first iteration gets the long allowance
  lastProgress_ = now();
}

void Watchdog::progress() { lastProgress_.store(now(), std::memory_order_relaxed); }

void Watchdog::iterationDone(double seconds) {
  if (seconds > slowest_.load()) slowest_ = seconds;
  longPhase_ = false;
}

double Watchdog::limit() const {
  if (seconds_ > 0) return seconds_;
  if (seconds_ == 0) return 0;
  if (longPhase_) return kLongPhaseSeconds;
  return std::max(kFloorSeconds, kIterationFactor * slowest_.load());
}

std::string Watchdog::policy() const {
  char b[160];
  if (seconds_ > 0)
    std::snprintf(b, sizeof b, "--watchdog %g", seconds_);
  else
    std::snprintf(b, sizeof b, "default watchdog: %g s at start-up and checkpoints, then max(%g s, %gx the slowest "
                  "iteration); --watchdog S changes it, --watchdog 0 turns it off",
                  kLongPhaseSeconds, kFloorSeconds, kIterationFactor);
  return b;
}

void Watchdog::loop() {
  while (!stop_) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    const double lim = limit();
    const double idle = now() - lastProgress_.load(std::memory_order_relaxed);
    if (lim <= 0 || idle <= lim) continue;
    std::lock_guard<std::mutex> lock(mutex_);
    if (now() - lastProgress_.load() <= lim) continue; // progress while taking the lock
    const std::string what = describe_ ? describe_() : what_;
    std::fprintf(stderr, "piperun: %s: error: no progress for %.1f s in %s; a rank may be stopped, lost or "
                 "deadlocked; exiting (%s)\n",
                 who_.c_str(), idle, what.c_str(), policy().c_str());
    std::fflush(stderr);
    std::_Exit(3);
  }
}

} // namespace pipec::rt
