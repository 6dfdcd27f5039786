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
#include "json_schema.h"
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

} // namespace pipec::stream

namespace pipec::schema {

/// {"op": "FWD", "mb": 3, "chunk": 0, "peer": 1, "version": 2}: a member is
/// absent where the instruction has none (Instr's -1; "paired": true only on
/// a FWD paired with the backward after it); ALLREDUCE names its
/// stage as "stage". The op comes first, so that the reader knows it when it
/// reads the peer.
template <> struct Schema<Instr> {
  template <class V, class I> static void members(V &v, I &in) {
    v.required("op", in.op);
    v.optionalWrittenIf(in.mb >= 0, "mb", in.mb);
    v.optionalWrittenIf(in.chunk >= 0, "chunk", in.chunk);
    v.optionalWrittenIf(in.peer >= 0, in.op == Op::AllReduce ? "stage" : "peer", in.peer);
    v.optionalWrittenIf(in.version >= 0, "version", in.version);
    v.optionalWrittenIf(in.paired, "paired", in.paired);
  }
};

template <> struct Schema<stream::RankFile> {
  template <class V, class F> static void members(V &v, F &f) {
    v.required("rank", f.rank);
    v.required("stage", f.stage);
    v.required("replica", f.replica);
    v.required("instructions", f.instrs);
  }
};

} // namespace pipec::schema

namespace pipec::stream {

/// An instruction list (schedule.json's ranks[r]).
inline nlohmann::json toJson(const std::vector<Instr> &list) { return schema::encode(list); }

inline nlohmann::json toJson(const RankFile &f) {
  nlohmann::json j = schema::encode(f);
  j["format"] = kRankFormat;
  return j;
}

/// An instruction list at JSON path `where` (schedule.json's ranks[r]).
template <class Error>
std::vector<Instr> instructionsFromJson(const json_io::Reader<Error> &R, const nlohmann::json &list,
                                        const std::string &where) {
  return schema::fromJson<std::vector<Instr>>(R, list, where);
}

/// A rank file's content; an older or unknown format is an error that says
/// to compile the job again.
template <class Error> RankFile rankFileFromJson(const json_io::Reader<Error> &R, const nlohmann::json &j) {
  const std::string format = R.template get<std::string>(j, "format", "");
  if (format != kRankFormat)
    throw Error(R.file + ": format \"" + format + "\", this program reads \"" + kRankFormat +
                "\"; re-run pipec to write the schedule again (docs/schedule-files.md)");
  return schema::fromJson<RankFile>(R, j);
}

} // namespace pipec::stream
