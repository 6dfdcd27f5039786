// How a timeline labels an instruction ("F3", "B2.c1", "AR"). The schedule
// library's pictures of a schedule (Chrome trace and SVG) and piperun's
// measured --trace use the same labels, so that a predicted and a measured
// timeline read alike. Plain C++17, header-only, like vocabulary.h.
#pragma once

#include "vocabulary.h"

#include <string>

namespace pipec {

inline const char *opShortName(Op op) {
  switch (op) {
  case Op::Fwd: return "F";
  case Op::Bwd: return "BW";
  case Op::BwdInput: return "B";
  case Op::BwdWeight: return "W";
  case Op::Recompute: return "R";
  case Op::AllReduce: return "AR";
  case Op::Validate: return "VAL";
  case Op::SpecStep: return "SSTEP";
  default: return choiceName(op);
  }
}

// The short name, then the micro-batch (if any), then ".c<chunk>" for chunks
// after the first; "&" after a forward paired with the backward that follows.
inline std::string timelineLabel(const Instr &in) {
  std::string s = opShortName(in.op);
  if (in.mb >= 0) s += std::to_string(in.mb);
  if (in.chunk > 0) s += ".c" + std::to_string(in.chunk);
  if (in.paired) s += "&"; // the first half of an F&B
  return s;
}

} // namespace pipec
