// libFuzzer target: the per-rank instruction stream reader
// (schedule/rank_<r>.json), loadRankStream as piperun's Executor and pipeseq
// call it, then the transfer list the start-up order check builds from it.
#include "FuzzSupport.h"

#include "pipec/input_file.h"

#include "Plan.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  const std::string path = pipec::fuzz::writeInput("rank_0.json", data, size);
  try {
    const pipec::rt::RankStream stream = pipec::rt::loadRankStream(path);
    for (const pipec::rt::Instr &in : stream.instrs) (void)pipec::rt::toString(in);
    const auto transfers = pipec::rt::transfersOf(stream);
    for (const auto &t : transfers)
      if (t.index < 0 || t.index >= (int)stream.instrs.size()) pipec::fuzz::violated("transfer index");
  } catch (const pipec::rt::Error &) {
  } catch (const pipec::io::FormatError &) {
  } catch (const pipec::io::InputError &) {
  }
  return 0;
}
