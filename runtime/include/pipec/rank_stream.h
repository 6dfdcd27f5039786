// A rank's stream file, schedule/rank_<r>.json (docs/schedule-files.md): its
// one description, writer and reader. The schedule library writes it
// (analysis/Schedule), piperun and pipeseq read it (runtime/src/Plan.cpp);
// schedule.json's per-rank lists use the same instruction spelling.
//
// A stream file holds only what is the rank's: which rank, stage and replica
// it is, and its instructions. The pipeline's facts (schedule family,
// micro-batches, chunks, placement, asynchronous) are plan.json's alone, so
// nothing in a job repeats them for the runtime to reconcile.
#pragma once

#include "json_reader.h"
#include "vocabulary.h"

#include <nlohmann/json.hpp>

#include <string>
#include <vector>

namespace pipec::stream {

/// Version 2 dropped the copies of the pipeline's facts (version 1 repeated
/// schedule, chunks, placement and asynchronous in every rank's file).
inline constexpr const char *kRankFormat = "pipec.schedule.rank/2";

struct RankFile {
  int rank = 0, stage = 0, replica = 0;
  std::vector<Instr> instrs; ///< the file's "instructions"
};

/// {"op": "FWD", "mb": 3, "chunk": 0, "peer": 1, "version": 2}, members absent
/// where the instruction has none (-1); ALLREDUCE names its stage as "stage".
inline nlohmann::json toJson(const Instr &in) {
  nlohmann::json j;
  j["op"] = opName(in.op);
  if (in.mb >= 0) j["mb"] = in.mb;
  if (in.chunk >= 0) j["chunk"] = in.chunk;
  if (in.peer >= 0) j[in.op == Op::AllReduce ? "stage" : "peer"] = in.peer;
  if (in.version >= 0) j["version"] = in.version;
  return j;
}

inline nlohmann::json toJson(const std::vector<Instr> &list) {
  nlohmann::json out = nlohmann::json::array();
  for (const Instr &in : list) out.push_back(toJson(in));
  return out;
}

inline nlohmann::json toJson(const RankFile &f) {
  return {{"format", kRankFormat},
          {"rank", f.rank},
          {"stage", f.stage},
          {"replica", f.replica},
          {"instructions", toJson(f.instrs)}};
}

/// An instruction list at JSON path `where` (a rank file's "instructions",
/// schedule.json's ranks[r]).
template <class Error>
std::vector<Instr> instructionsFromJson(const json_io::Reader<Error> &R, const nlohmann::json &list,
                                        const std::string &where) {
  if (!list.is_array()) throw Error(R.file + ": missing member " + where);
  std::vector<Instr> out;
  out.reserve(list.size());
  for (size_t i = 0; i < list.size(); ++i) {
    const std::string at = where + "[" + std::to_string(i) + "]";
    const std::string name = R.template get<std::string>(list[i], "op", at);
    Instr in;
    if (!parseOp(name, in.op)) throw Error(R.file + ": " + at + ": unknown instruction \"" + name + "\"");
    in.mb = R.template opt<int>(list[i], "mb", at, -1);
    in.chunk = R.template opt<int>(list[i], "chunk", at, -1);
    in.peer = R.template opt<int>(list[i], in.op == Op::AllReduce ? "stage" : "peer", at, -1);
    in.version = R.template opt<int>(list[i], "version", at, -1);
    out.push_back(in);
  }
  return out;
}

/// A rank file's content; an older or unknown format is an error that says
/// to compile the job again.
template <class Error> RankFile rankFileFromJson(const json_io::Reader<Error> &R, const nlohmann::json &j) {
  const std::string format = R.template get<std::string>(j, "format", "");
  if (format != kRankFormat)
    throw Error(R.file + ": format \"" + format + "\", this program reads \"" + kRankFormat +
                "\"; re-run pipec to write the schedule again (docs/schedule-files.md)");
  RankFile f;
  f.rank = R.template get<int>(j, "rank", "");
  f.stage = R.template get<int>(j, "stage", "");
  f.replica = R.template get<int>(j, "replica", "");
  f.instrs =
      instructionsFromJson(R, j.contains("instructions") ? j.at("instructions") : nlohmann::json(), "instructions");
  return f;
}

} // namespace pipec::stream
