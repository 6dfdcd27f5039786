// Timeline pictures: Chrome trace (Perfetto) and SVG in the style of the
// PipeDream / zero-bubble papers; and the output directory writer.
#include "analysis/Schedule/Schedule.h"
#include "runtime/include/pipec/timeline_label.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <ostream>

namespace pipec::schedule {

namespace {
// Fill colours: chunk 0 light, chunk 1 dark (as the ZB-V figures do).
const char *fillOf(Op op, int chunk) {
  const bool dark = chunk >= 1;
  switch (op) {
  case Op::Fwd: return dark ? "#3f6fbf" : "#8db4ea";
  case Op::BwdInput: return dark ? "#23897d" : "#6fcbbf";
  case Op::Bwd: return dark ? "#1f6f86" : "#5fb0c8";
  case Op::BwdWeight: return dark ? "#4f9a2f" : "#a8da8a";
  case Op::Recompute: return "#f2c14e";
  case Op::AllReduce:
  case Op::Validate: return "#c39bd3";
  default: return "#9e9e9e";
  }
}

std::string fmt(double x, int prec = 2) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.*f", prec, x);
  return buf;
}

// Costs may be unit-less (1, 2, ...) or seconds (1e-5): keep 4 significant digits.
std::string significant(double x) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.4g", x);
  return buf;
}

// The length of the well-formed UTF-8 sequence of an XML character at
// s[i] (no surrogates, U+FFFE or U+FFFF), or 0.
size_t utf8Length(const std::string &s, size_t i) {
  const auto byte = [&](size_t k) { return static_cast<unsigned char>(s[k]); };
  const unsigned char lead = byte(i);
  const size_t length = lead >= 0xf0 && lead <= 0xf4 ? 4 : lead >= 0xe0 ? 3 : lead >= 0xc2 && lead < 0xe0 ? 2 : 0;
  if (length == 0 || lead > 0xf4 || i + length > s.size())
    return 0;
  uint32_t code = lead & (0x7f >> length);
  for (size_t k = 1; k < length; ++k) {
    if ((byte(i + k) & 0xc0) != 0x80)
      return 0;
    code = code << 6 | (byte(i + k) & 0x3f);
  }
  const uint32_t least = length == 2 ? 0x80 : length == 3 ? 0x800 : 0x10000;
  if (code < least || code > 0x10ffff || (code >= 0xd800 && code <= 0xdfff) || code == 0xfffe || code == 0xffff)
    return 0;
  return length;
}

// Text and attribute values of the SVG: markup escaped, and whatever XML 1.0
// cannot carry (control bytes, malformed UTF-8) shown as U+FFFD, so that a
// schedule name read from a file keeps the document well-formed.
std::string esc(const std::string &s) {
  std::string o;
  for (size_t i = 0; i < s.size();) {
    const unsigned char c = static_cast<unsigned char>(s[i]);
    if (c >= 0x80) {
      const size_t length = utf8Length(s, i);
      o += length ? s.substr(i, length) : std::string("\xEF\xBF\xBD");
      i += length ? length : 1;
      continue;
    }
    o += c == '<' ? "&lt;" : c == '>' ? "&gt;" : c == '&' ? "&amp;" : c == '"' ? "&quot;" : c == '\'' ? "&apos;"
         : c < 0x20 && c != '\t' && c != '\n' && c != '\r' ? "\xEF\xBF\xBD" : std::string(1, static_cast<char>(c));
    ++i;
  }
  return o;
}

// A JSON string (quotes included) for the Chrome trace: nlohmann's escaping,
// malformed UTF-8 replaced rather than thrown on.
std::string jsonString(const std::string &s) {
  return nlohmann::json(s).dump(-1, ' ', true, nlohmann::json::error_handler_t::replace);
}

// The label piperun's measured trace uses too (pipec/timeline_label.h).
std::string label(const Interval &iv) { return timelineLabel(iv.instr); }
} // namespace

void writeChromeTrace(const Schedule &s, const SimResult &sim, std::ostream &os) {
  // One cost unit is shown as one millisecond (Chrome traces count in µs).
  const double us = 1000.0;
  os << "{\"displayTimeUnit\":\"ms\",\"otherData\":{\"schedule\":" << jsonString(s.name)
     << ",\"makespan\":" << sim.makespan << ",\"bubble_flush\":" << sim.bubbleFlush
     << ",\"bubble_steady\":" << sim.bubbleSteady << "},\"traceEvents\":[\n";
  os << "{\"name\":\"process_name\",\"ph\":\"M\",\"pid\":0,\"args\":{\"name\":" << jsonString(s.name) << "}}";
  for (int r = 0; r < (int)s.ranks.size(); ++r)
    os << ",\n{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":0,\"tid\":" << r << ",\"args\":{\"name\":\"rank " << r
       << " (stage " << s.problem.stageOfRank(r) << ", replica " << s.problem.replicaOfRank(r) << ")\"}}";
  for (const Interval &iv : sim.intervals)
    os << ",\n{\"name\":\"" << label(iv) << "\",\"cat\":\"" << choiceName(iv.instr.op) << "\",\"ph\":\"X\",\"pid\":0,\"tid\":"
       << iv.rank << ",\"ts\":" << iv.start * us << ",\"dur\":" << (iv.end - iv.start) * us
       << ",\"args\":{\"mb\":" << iv.instr.mb << ",\"chunk\":" << iv.instr.chunk << "}}";
  // Transfers as flow arrows (s/f pairs) between the ranks' tracks.
  int id = 0;
  for (const Transfer &t : sim.transfers) {
    const char *name = t.grad ? "grad" : "act";
    os << ",\n{\"name\":\"" << name << t.mb << "\",\"cat\":\"comm\",\"ph\":\"s\",\"id\":" << id
       << ",\"pid\":0,\"tid\":" << t.src << ",\"ts\":" << t.sent * us << "}";
    os << ",\n{\"name\":\"" << name << t.mb << "\",\"cat\":\"comm\",\"ph\":\"f\",\"bp\":\"e\",\"id\":" << id++
       << ",\"pid\":0,\"tid\":" << t.dst << ",\"ts\":" << t.arrived * us << "}";
  }
  os << "\n]}\n";
}

void writeSvg(const Schedule &s, const SimResult &sim, std::ostream &os) {
  const int R = (int)s.ranks.size();
  const double left = 78, top = 46, rowH = 26, gap = 6, right = 16;
  const double span = std::max(sim.makespan, 1e-9);
  // About 14 px per F of a uniform problem, clamped to a readable width.
  const double drawW = std::clamp(span * 14.0, 600.0, 2400.0);
  const double sx = drawW / span;
  // Legend.
  struct Item {
    const char *name;
    const char *fill;
  };
  std::vector<Item> items = {{"F (forward)", fillOf(Op::Fwd, 0)}};
  if (s.splitBackward)
    items.insert(items.end(), {{"B (input grad)", fillOf(Op::BwdInput, 0)}, {"W (weight grad)", fillOf(Op::BwdWeight, 0)}});
  else
    items.push_back({"B+W (backward)", fillOf(Op::Bwd, 0)});
  if (s.problem.chunks > 1)
    items.push_back({"dark = chunk 1", fillOf(Op::Fwd, 1)});
  items.insert(items.end(), {{"step / collective", "#9e9e9e"}, {"idle", "#ececec"}});
  if (s.problem.comm > 0)
    items.push_back({"transfer", "#e07b39"});
  double legendW = 0;
  for (const Item &it : items)
    legendW += 30 + 6.2 * std::string(it.name).size();
  const double W = left + std::max(drawW, legendW) + right;
  const double legendY = top + R * (rowH + gap) + 12;
  const double H = legendY + 30;
  os << "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" << fmt(W, 0) << "\" height=\"" << fmt(H, 0)
     << "\" viewBox=\"0 0 " << fmt(W, 0) << " " << fmt(H, 0) << "\" font-family=\"Helvetica, Arial, sans-serif\">\n";
  os << "<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n";
  os << "<text x=\"" << left << "\" y=\"18\" font-size=\"14\" font-weight=\"bold\">" << esc(s.name) << "  (p="
     << s.problem.stages << ", m=" << s.problem.microbatches << ", v=" << s.problem.chunks << ")</text>\n";
  os << "<text x=\"" << left << "\" y=\"36\" font-size=\"11\" fill=\"#444\">makespan " << significant(sim.makespan)
     << " · bubble flush-to-flush " << fmt(100 * sim.bubbleFlush, 1) << "% · steady-state "
     << fmt(100 * sim.bubbleSteady, 1) << "% · peak memory " << fmt(sim.maxPeakMemory) << " (units of M_B)</text>\n";
  // Rows: grey background = idle.
  for (int r = 0; r < R; ++r) {
    const double y = top + r * (rowH + gap);
    os << "<text x=\"" << left - 8 << "\" y=\"" << fmt(y + rowH * 0.65) << "\" font-size=\"11\" text-anchor=\"end\">rank "
       << r << "</text>\n";
    os << "<rect x=\"" << left << "\" y=\"" << fmt(y) << "\" width=\"" << fmt(drawW) << "\" height=\"" << rowH
       << "\" fill=\"#ececec\"/>\n";
  }
  // Transfers: thin lines from the sender's row to the receiver's row.
  if (s.problem.comm > 0)
    for (const Transfer &t : sim.transfers) {
      const double y1 = top + t.src * (rowH + gap) + (t.dst > t.src ? rowH : 0);
      const double y2 = top + t.dst * (rowH + gap) + (t.dst > t.src ? 0 : rowH);
      os << "<line x1=\"" << fmt(left + t.sent * sx) << "\" y1=\"" << fmt(y1) << "\" x2=\"" << fmt(left + t.arrived * sx)
         << "\" y2=\"" << fmt(y2) << "\" stroke=\"#e07b39\" stroke-width=\"1\" opacity=\"0.7\"/>\n";
    }
  const double font = std::min(11.0, std::max(6.0, sx * 0.55));
  for (const Interval &iv : sim.intervals) {
    const double y = top + iv.rank * (rowH + gap);
    const double x = left + iv.start * sx, w = std::max((iv.end - iv.start) * sx, 0.8);
    os << "<rect x=\"" << fmt(x) << "\" y=\"" << fmt(y) << "\" width=\"" << fmt(w) << "\" height=\"" << rowH
       << "\" fill=\"" << fillOf(iv.instr.op, iv.instr.chunk) << "\" stroke=\"white\" stroke-width=\"0.6\"><title>"
       << esc(toString(iv.instr)) << " [" << fmt(iv.start) << ", " << fmt(iv.end) << "]</title></rect>\n";
    if (iv.instr.mb >= 0 && w >= font * 0.7 * std::to_string(iv.instr.mb).size())
      os << "<text x=\"" << fmt(x + w / 2) << "\" y=\"" << fmt(y + rowH / 2 + font * 0.35) << "\" font-size=\""
         << fmt(font, 1) << "\" text-anchor=\"middle\" fill=\"" << (iv.instr.chunk >= 1 ? "white" : "#111")
         << "\">" << iv.instr.mb << "</text>\n";
  }
  double x = left;
  for (const Item &it : items) {
    os << "<rect x=\"" << fmt(x) << "\" y=\"" << fmt(legendY) << "\" width=\"14\" height=\"14\" fill=\"" << it.fill
       << "\" stroke=\"#888\" stroke-width=\"0.5\"/>\n";
    os << "<text x=\"" << fmt(x + 18) << "\" y=\"" << fmt(legendY + 11) << "\" font-size=\"11\">" << it.name << "</text>\n";
    x += 30 + 6.2 * std::string(it.name).size();
  }
  os << "</svg>\n";
}

void writeScheduleDir(const Schedule &s, const SimResult &sim, const std::string &dir) {
  namespace fs = std::filesystem;
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec)
    throw ScheduleError("cannot create " + dir + ": " + ec.message());
  auto open = [&](const std::string &name) {
    std::ofstream f(fs::path(dir) / name);
    if (!f)
      throw ScheduleError("cannot write " + (fs::path(dir) / name).string());
    return f;
  };
  for (int r = 0; r < (int)s.ranks.size(); ++r)
    open("rank_" + std::to_string(r) + ".json") << rankToJson(s, r);
  open("schedule.json") << toJson(s);
  open("schedule.txt") << toText(s);
  {
    auto f = open("timeline.json");
    writeChromeTrace(s, sim, f);
  }
  {
    auto f = open("timeline.svg");
    writeSvg(s, sim, f);
  }
}

} // namespace pipec::schedule
