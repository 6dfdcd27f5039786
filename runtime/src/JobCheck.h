// Start-up checks that keep a job consistent and its numbers meaningful
// (docs/runtime.md, "Job identity" and "Hyper-parameters"). No MPI here:
// piperun exchanges what these functions compute; pipeseq validates its
// hyper-parameters with the same code.
//  * Hyper-parameters: the optimizer's values (plan.json runtime.optimizer,
//    overridden by --lr, --weight-decay, --momentum, --max-grad-norm), the
//    seed and the iteration counts, refused with the option or file and the
//    value when NaN, infinite, negative or out of range.
//  * Job identity: what every rank must agree on (plan.json, the schedule
//    files, each stage's library and weights, the piperun executable, the
//    options that change the numbers or the collectives), as comparable
//    digests; compareIdentities names each item that differs and the ranks
//    on each side.
#pragma once

#include "Plan.h"

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace pipec::rt {

// ---------------------------------------------------------------- hashing
// A 64-bit FNV-1a-style hash over 8-byte words in four lanes (fast enough to
// run over stage libraries and weights at start-up; not cryptographic: it
// finds stale or different copies, not forgeries).
uint64_t hashBytes(const void *data, size_t bytes, uint64_t seed = 0);

// Files up to this size are hashed whole; larger ones by size, the first and
// last 4 MiB and 64 blocks of 64 KiB spread evenly between them.
inline constexpr uint64_t kDigestWholeBytes = 64ull << 20;

struct FileDigest {
  uint64_t bytes = 0, hash = 0;
  bool sampled = false;
  std::string text() const; // "1234 bytes, digest 0123456789abcdef" (+ ", sampled")
};
// Regular files only (io::InputFile); throws io::InputError naming the file.
FileDigest digestFile(const std::string &path, const char *what);

// ---------------------------------------------------------------- hyper-parameters
// Command-line values of the optimizer (unset: plan.json's).
struct OptimizerOverrides {
  std::optional<double> lr, weightDecay, momentum, maxGradNorm;
};

// plan.optimizer with the overrides applied, every value checked: lr and
// weight decay finite and >= 0, momentum, beta1 and beta2 in [0, 1), epsilon
// finite and > 0, max_grad_norm finite and >= 0 (0: no clipping). Values
// from plan.json are those written (Plan::optimizerAsWritten: a value that
// overflows a float is reported as written). Throws Error naming the option ("--lr") or
// the file and member ("PLAN/plan.json: runtime.optimizer.lr") and the value.
OptimizerConfig resolveOptimizer(const Plan &plan, const OptimizerOverrides &overrides);

// Command-line numbers: the whole text must be the number.
// An integer in [lo, hi] ("--iters: \"0\" is out of range: needs 1 .. 1000000000").
int64_t parseCount(const std::string &option, const std::string &text, int64_t lo, int64_t hi);
// A seed: a decimal integer in [0, 2^64).
uint64_t parseSeed(const std::string &option, const std::string &text);
// A real number (NaN and inf are returned as such; resolveOptimizer or the
// caller decides); throws Error when the text is not a number.
double parseReal(const std::string &option, const std::string &text);

/// The shortest decimal text that reads back as exactly `v` ("0.02", not
/// "0.0199999996"), for messages that show hyper-parameters.
std::string shortestText(float v);
std::string shortestText(double v);

inline constexpr int64_t kMaxIterations = 1000000000; // --iters, --log-every, --save-every

// ---------------------------------------------------------------- deadlock
// Whether the ranks' point-to-point transfers of one iteration complete
// under the executor's semantics: a send never blocks (MPI_Isend), a receive
// waits until its sender posted the matching send. transfers[r] and paths[r]:
// schedule rank r's transfers in stream order and its stream file; the
// pairwise orders must already agree (checkTransferOrder). A stream that
// deadlocks here deadlocks in piperun. Returns "" or a message naming the
// ranks that wait on each other and their RECV instructions.
std::string findTransferDeadlock(const Plan &plan, const std::vector<std::vector<Transfer>> &transfers,
                                 const std::vector<std::string> &paths);

// ---------------------------------------------------------------- job identity
// One thing all ranks must agree on: `value` is compared, `shown` completes
// "rank 1 ..." in the message ("was started with --iters 5",
// "has /job/plan.json (1234 bytes, digest ...)"). Ranks with an empty value
// (a file they cannot read and do not use) are left out of the comparison.
struct IdentityItem {
  std::string value, shown;
};
using JobIdentity = std::map<std::string, IdentityItem>; // by name ("--iters", "plan.json", "stage 1 library")

// The plan's own files: plan.json, the set of schedule files, each virtual
// stage's library and weights. Every rank digests every stage's files it can
// read, so a node with a stale copy is found even when no other rank loads
// the same stage.
void addPlanFiles(JobIdentity &id, const Plan &plan);
// A file given on the command line (--data): digest, or "absent" text.
void addFile(JobIdentity &id, const std::string &name, const std::string &option, const std::string &path,
             const char *what);

std::string encodeIdentity(const JobIdentity &id);
// "" when every rank agrees; else one line per item that differs (at most
// `maxItems`), e.g. "ranks disagree on --iters: rank 1 was started with
// --iters 5, rank 0 was started with --iters 3". `encoded[r]` is rank r's.
std::string compareIdentities(const std::vector<std::string> &encoded, size_t maxItems = 8);

} // namespace pipec::rt
