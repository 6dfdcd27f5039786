#include "Recorder.h"

#include "pipec/timeline_label.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <fstream>
#include <tuple>

namespace pipec::rt {
using nlohmann::json;

double RunRecorder::now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

void RunRecorder::start(int chunks) {
  t0_ = now();
  fwdCalls_.assign(chunks, 0);
}

void RunRecorder::beginIteration(int64_t it, int64_t first, int64_t iters) {
  profiling_ = !profileFile_.empty() && (it > first || iters - first == 1);
}

void RunRecorder::record(const Instr &in, int64_t iteration, double t0, double t1) {
  if (!traceFile_.empty()) trace_.push_back({t0 - t0_, t1 - t0_, in, iteration});
}

void RunRecorder::timeOps(pipec_call &c) { c.timer = &RunRecorder::onOpTime, c.timer_user = this; }

void RunRecorder::onOpTime(void *user, const char *op, int32_t phase, double seconds) {
  auto *self = (RunRecorder *)user;
  OpTime &t = self->opTimes_[op];
  (phase == 0 ? t.f : phase == 1 ? t.b : t.w) += seconds;
}

void RunRecorder::write(Control &control, const Plan &plan, const Device &device, const std::vector<Chunk> &chunks,
                        int scheduleRank, int stage, int replica) {
  if (!traceFile_.empty()) writeTrace(control, plan, chunks, scheduleRank, stage, replica);
  if (!profileFile_.empty()) writeProfile(control, plan, device, replica);
}

void RunRecorder::writeTrace(Control &control, const Plan &plan, const std::vector<Chunk> &chunks, int scheduleRank,
                             int stage, int replica) {
  // Each rank ships its events; rank 0 writes one Chrome trace in the
  // schedule library's layout (pid 0, tid = schedule rank), times in µs.
  json mine = json::array();
  for (const TraceEvent &e : trace_)
    mine.push_back({(int)e.in.op, e.in.mb, e.in.chunk, e.in.peer, e.iteration, e.t0, e.t1});
  json meta{{"rank", scheduleRank}, {"stage", stage}, {"replica", replica}, {"events", mine},
            {"vs", [&] { json v = json::array(); for (auto &c : chunks) v.push_back(c.vs); return v; }()}};
  const auto all = control.gatherToRoot(meta.dump());
  if (control.rank() != 0) return;
  std::ofstream os(traceFile_);
  if (!os) throw Error(traceFile_ + ": cannot open the trace file for writing");
  os << "{\"displayTimeUnit\":\"ms\",\"otherData\":{\"schedule\":\"" << choiceName(plan.schedule)
     << "\",\"measured\":true},\"traceEvents\":[\n";
  os << "{\"name\":\"process_name\",\"ph\":\"M\",\"pid\":0,\"args\":{\"name\":\"" << choiceName(plan.schedule) << " (measured)\"}}";
  struct End { double t; int rank; };
  std::map<std::tuple<int64_t, int, int, int>, End> sends, recvs; // (iteration, mb, grad, sender vs)
  for (const std::string &s : all) {
    const json r = json::parse(s);
    const int rank = r["rank"];
    os << ",\n{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":0,\"tid\":" << rank << ",\"args\":{\"name\":\"rank " << rank
       << " (stage " << r["stage"].get<int>() << ", replica " << r["replica"].get<int>() << ")\"}}";
    for (const json &e : r["events"]) {
      const Op op = (Op)e[0].get<int>();
      const int mb = e[1], chunk = e[2];
      const int64_t it = e[4];
      const double t0 = e[5], t1 = e[6];
      os << ",\n{\"name\":\"" << timelineLabel(Instr{op, mb, chunk}) << "\",\"cat\":\"" << choiceName(op) << "\",\"ph\":\"X\",\"pid\":0,\"tid\":" << rank
         << ",\"ts\":" << t0 * 1e6 << ",\"dur\":" << (t1 - t0) * 1e6 << ",\"args\":{\"mb\":" << mb << ",\"chunk\":" << chunk
         << ",\"iteration\":" << it << "}}";
      if (isP2P(op)) {
        const bool grad = op == Op::SendGrad || op == Op::RecvGrad;
        const bool isSend = op == Op::SendAct || op == Op::SendGrad;
        const int vs = r["vs"][chunk];
        const int senderVs = isSend ? vs : (grad ? vs + 1 : vs - 1);
        (isSend ? sends : recvs)[{it, mb, grad ? 1 : 0, senderVs}] = {isSend ? t0 : t1, rank};
      }
    }
  }
  int id = 0;
  for (const auto &[key, s] : sends) {
    auto r = recvs.find(key);
    if (r == recvs.end()) continue;
    const char *name = std::get<2>(key) ? "grad" : "act";
    os << ",\n{\"name\":\"" << name << std::get<1>(key) << "\",\"cat\":\"comm\",\"ph\":\"s\",\"id\":" << id
       << ",\"pid\":0,\"tid\":" << s.rank << ",\"ts\":" << s.t * 1e6 << "}";
    os << ",\n{\"name\":\"" << name << std::get<1>(key) << "\",\"cat\":\"comm\",\"ph\":\"f\",\"bp\":\"e\",\"id\":" << id++
       << ",\"pid\":0,\"tid\":" << r->second.rank << ",\"ts\":" << r->second.t * 1e6 << "}";
  }
  os << "\n]}\n";
  if (!os) throw Error(traceFile_ + ": write failed");
}

void RunRecorder::writeProfile(Control &control, const Plan &plan, const Device &device, int replica) {
  // Seconds per micro-batch for each op, from replica 0 of every stage.
  json ops = json::array();
  if (replica == 0)
    for (const auto &[name, t] : opTimes_) {
      double calls = 0;
      for (int64_t c : fwdCalls_) calls = std::max<double>(calls, (double)c);
      if (calls <= 0) continue;
      ops.push_back({{"name", name}, {"fwd_s", t.f / calls}, {"bwd_input_s", t.b / calls}, {"bwd_weight_s", t.w / calls}});
    }
  const auto all = control.gatherToRoot(ops.dump());
  if (control.rank() != 0) return;
  json merged = json::array();
  for (const std::string &s : all)
    for (const json &o : json::parse(s)) merged.push_back(o);
  json doc{{"format", "pipec.profile/1"},
           {"device", device.host() ? std::string("cpu") : plan.gpu.empty() ? std::string(device.name()) : plan.gpu},
           {"ops", merged}};
  std::ofstream os(profileFile_);
  os << doc.dump(1) << "\n";
  if (!os) throw Error(profileFile_ + ": cannot write the profile");
}

} // namespace pipec::rt
