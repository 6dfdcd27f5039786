// Schedule benchmark: generation (+validation) and simulation time for large
// pipelines, and the automatic search against ZB-H1/ZB-H2 on a grid of costs;
// `--grid [--json]`: the best schedule under each memory limit on issue 15's
// grid, with its ratio to the winning family's lower bound; `--time-orders`:
// times compute orders given on stdin with pipec's lowering, validator and
// simulator (how orders of other generators are compared with pipec's,
// docs/schedules.md).
// Prints tables; built with the tests, never run by ctest.
#include "analysis/Schedule/Schedule.h"
// vTurningRankBound, the V's bound from its turning rank; lower() and mk()
// for --time-orders.
#include "analysis/Schedule/Orders.h"

#include <algorithm>
#include <cstdlib>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <iostream>
#include <limits>
#include <map>
#include <sstream>
#include <string>
#include <vector>

using namespace pipec::schedule;

namespace {
double msSince(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

Problem problem(int p, int m, double f, double b, double w, double c) {
  Problem P;
  P.stages = p;
  P.microbatches = m;
  P.costF = {f};
  P.costB = {b};
  P.costW = {w};
  P.comm = c;
  return P;
}
} // namespace

/// The five cost sets of issue 15's comparison with the zero-bubble
/// repository's generators (per stage, per micro-batch; c: one transfer).
struct CostSet {
  const char *name;
  double f, b, w, c;
};
constexpr CostSet kCostSets[] = {{"F=B=W=1", 1, 1, 1, 0},
                                 {"F1 B1.2 W0.8 c0.05", 1, 1.2, 0.8, 0.05},
                                 {"6.2B profile", 29.718, 29.444, 19.927, 0.527},
                                 {"B=2F W=F", 1, 2, 1, 0},
                                 {"F1 B1.2 W0.8 c0.5", 1, 1.2, 0.8, 0.5}};

/// The bound of a schedule with v chunks per rank: the first forward crosses
/// p - 1 stages at F/v each plus a transfer, then the busiest rank computes
/// its share: m(F + B + W), less what its F&B pairs hide with --fb-overlap
/// (the simulated busiest rank's compute). (v = 1: (p-1)(F+c) + m(F+B+W);
/// the V: (p-1)(F/2+c) + m(F+B+W).)
double lowerBound(int p, int v, const CostSet &k, const SimResult &r) {
  return (p - 1) * (k.f / v + k.c) + r.maxRankCompute;
}

bool hasPairs(const Schedule &s) {
  for (const auto &rank : s.ranks)
    for (const auto &in : rank)
      if (in.paired)
        return true;
  return false;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v.size() % 2 ? v[v.size() / 2] : (v[v.size() / 2 - 1] + v[v.size() / 2]) / 2;
}

/// `bench_schedule --grid [--json] [--fb-overlap X]`: p in {4, 8, 16}, m in
/// {p, 2p, 3p, 4p, 8p}, the five cost sets, memory limits p, 2p and
/// unlimited, F&B pairs (DualPipeV) at F + B - X min(F, B). Per cell every
/// synchronous family generates under the limit; the cell reports the best
/// makespan, the family that reached it and its ratio to that family's
/// lower bound, then a summary per limit.
int runGrid(bool json, double fbOverlap) {
  struct Cell {
    int p, m;
    const CostSet *costs;
    std::string limit, family;
    double makespan, bound, ratio, peak;
    double tightBound = 0, tightRatio = 0; // the larger of bound and (for the V) its turning rank's
  };
  std::vector<Cell> cells;
  for (int p : {4, 8, 16})
    for (int k : {1, 2, 3, 4, 8})
      for (const CostSet &costs : kCostSets)
        for (const char *limit : {"p", "2p", "unlimited"}) {
          const int m = k * p;
          Cell best{p, m, &costs, limit, "", std::numeric_limits<double>::infinity(), 0, 0, 0};
          double bestTight = 0;
          for (const ScheduleFamily &family : scheduleFamilies()) {
            if (family.asynchronous)
              continue; // PipeDream's changes the training, not only the time
            // A family of any chunk count at each count auto and the planner try.
            std::vector<int> chunkCounts{family.chunks};
            if (family.anyChunks)
              chunkCounts = searchedChunkCounts();
            for (int chunks : chunkCounts) {
            Problem P = problem(p, m, costs.f, costs.b, costs.w, costs.c);
            P.chunks = chunks;
            P.memoryLimit = std::string(limit) == "p" ? p : std::string(limit) == "2p" ? 2.0 * p : 1e9;
            P.fbOverlap = fbOverlap;
            try {
              const Schedule s = generate(std::string(family.name), P);
              SimResult r = simulate(s);
              const double bound = lowerBound(p, chunks, costs, r);
              // Equal makespans (to rounding): the family nearer its own
              // bound is reported, so that a tie does not read as a gap.
              const bool tie = std::abs(r.makespan - best.makespan) <= 1e-9 * std::max(1.0, best.makespan);
              if (r.maxPeakMemory > P.memoryLimit + 1e-9 ||
                  (tie ? bound <= best.bound : r.makespan > best.makespan))
                continue;
              best.family = std::string(family.name) + (family.anyChunks ? "/" + std::to_string(chunks) : "");
              best.makespan = r.makespan;
              best.bound = bound;
              best.peak = r.maxPeakMemory;
              // The turning rank's bound counts whole computes: not for pairs that overlap.
              bestTight = family.placement == Placement::VShape && !(fbOverlap > 0 && hasPairs(s))
                              ? std::max(bound, pipec::schedule::detail::vTurningRankBound(P))
                              : bound;
            } catch (const ScheduleError &) {
              // over the limit, or not defined for this p and m
            }
            }
          }
          best.ratio = best.makespan / best.bound;
          best.tightBound = bestTight;
          best.tightRatio = best.makespan / bestTight;
          cells.push_back(best);
        }
  if (json) {
    std::printf("[\n");
    for (size_t i = 0; i < cells.size(); ++i) {
      const Cell &c = cells[i];
      std::printf("  {\"p\": %d, \"m\": %d, \"costs\": \"%s\", \"memory_limit\": \"%s\", \"family\": \"%s\", "
                  "\"makespan\": %.4f, \"lower_bound\": %.4f, \"ratio\": %.4f, \"tight_bound\": %.4f, "
                  "\"tight_ratio\": %.4f, \"peak_memory\": %.2f}%s\n",
                  c.p, c.m, c.costs->name, c.limit.c_str(), c.family.c_str(), c.makespan, c.bound, c.ratio,
                  c.tightBound, c.tightRatio, c.peak,
                  i + 1 < cells.size() ? "," : "");
    }
    std::printf("]\n");
    return 0;
  }
  std::printf("%3s %4s %-20s %-9s %-12s %10s %10s %7s %6s %10s %7s\n", "p", "m", "costs", "limit", "best",
              "makespan", "bound", "ratio", "peak", "tight", "tratio");
  for (const Cell &c : cells)
    std::printf("%3d %4d %-20s %-9s %-12s %10.2f %10.2f %7.4f %6.1f %10.2f %7.4f\n", c.p, c.m, c.costs->name,
                c.limit.c_str(), c.family.c_str(), c.makespan, c.bound, c.ratio, c.peak, c.tightBound, c.tightRatio);
  std::printf("\nsummary per memory limit: cells, median / worst ratio to the winner's bound, cells at the bound "
              "(ratio <= 1.0005), winners; then the same against the tight bound (for the V the larger of its "
              "bound and its turning rank's)\n");
  for (const char *limit : {"p", "2p", "unlimited"}) {
    std::vector<double> ratios, tightRatios;
    std::map<std::string, int> winners;
    int atBound = 0, atTight = 0;
    for (const Cell &c : cells)
      if (c.limit == limit) {
        ratios.push_back(c.ratio);
        tightRatios.push_back(c.tightRatio);
        atBound += c.ratio <= 1.0005;
        atTight += c.tightRatio <= 1.0005;
        winners[c.family]++;
      }
    std::string won;
    for (const auto &[family, count] : winners)
      won += (won.empty() ? "" : ", ") + family + " " + std::to_string(count);
    std::printf("  %-9s %3zu cells  median %.4f  worst %.4f  at bound %d  (%s)\n", limit, ratios.size(),
                median(ratios), *std::max_element(ratios.begin(), ratios.end()), atBound, won.c_str());
    std::printf("  %-9s tight:    median %.4f  worst %.4f  at bound %d\n", "", median(tightRatios),
                *std::max_element(tightRatios.begin(), tightRatios.end()), atTight);
  }
  return 0;
}

/// `bench_schedule --time-orders`: per block on stdin
///   CELL <id> <p> <m> <F> <B> <W> <C> <chunks 1|2>
///   R <op><chunk>:<mb> ...      (one line per rank: op F, B or W; model chunk)
///   END
/// the order is lowered as pipec lowers its own (the optimizer step appended;
/// two chunks in the V placement, one chunk as ZB-H1's shape), validated and
/// simulated with no memory limit; prints `<id> <makespan> <peak memory>
/// <valid 1|0>`, makespan and peak `inf` when the order cannot run. The
/// caller compares the peak with its limit.
int runTimeOrders() {
  std::string token;
  while (std::cin >> token) {
    if (token != "CELL") {
      std::fprintf(stderr, "time-orders: expected CELL, got '%s'\n", token.c_str());
      return 2;
    }
    std::string id, line;
    int p = 0, m = 0, chunks = 1;
    double f = 0, b = 0, w = 0, c = 0;
    std::cin >> id >> p >> m >> f >> b >> w >> c >> chunks;
    std::getline(std::cin, line);
    if (!std::cin || p < 1 || m < 1 || (chunks != 1 && chunks != 2)) {
      std::fprintf(stderr, "time-orders: bad CELL line for '%s'\n", id.c_str());
      return 2;
    }
    pipec::schedule::detail::Orders orders(p);
    bool parsed = true;
    for (int r = 0; r < p; ++r) {
      std::getline(std::cin, line);
      std::istringstream in(line);
      std::string item;
      in >> item; // R
      while (in >> item) {
        const size_t colon = item.find(':');
        const char kind = item[0];
        if (colon == std::string::npos || colon < 2 || (kind != 'F' && kind != 'B' && kind != 'W')) {
          parsed = false;
          break;
        }
        const Op op = kind == 'F' ? Op::Fwd : kind == 'B' ? Op::BwdInput : Op::BwdWeight;
        try {
          orders[r].push_back(pipec::schedule::detail::mk(op, std::stoi(item.substr(colon + 1)),
                                                          std::stoi(item.substr(1, colon - 1))));
        } catch (const std::exception &) {
          parsed = false;
          break;
        }
      }
      orders[r].push_back(pipec::schedule::detail::mk(Op::Step));
    }
    std::getline(std::cin, line); // END
    Schedule s;
    s.name = chunks == 2 ? "zb-v" : "zb-h1";
    s.problem = problem(p, m, f, b, w, c);
    s.problem.chunks = chunks;
    s.placement = chunks == 2 ? Placement::VShape : Placement::Interleaved;
    s.splitBackward = true;
    bool ok = parsed;
    SimResult r;
    try {
      if (ok) {
        pipec::schedule::detail::lower(s, orders);
        ok = validate(s).ok();
      }
      if (ok)
        r = simulate(s);
    } catch (const std::exception &) { // ScheduleError, or a number out of range
      ok = false;
    }
    if (ok)
      std::printf("%s %.10g %.10g 1\n", id.c_str(), r.makespan, r.maxPeakMemory);
    else
      std::printf("%s inf inf 0\n", id.c_str());
  }
  return 0;
}

int main(int argc, char **argv) {
  const std::string mode = argc > 1 ? argv[1] : "";
  if (mode == "--grid") {
    bool json = false;
    double fbOverlap = 0;
    for (int i = 2; i < argc; ++i) {
      const std::string arg = argv[i];
      if (arg == "--json")
        json = true;
      else if (arg == "--fb-overlap" && i + 1 < argc)
        fbOverlap = std::atof(argv[++i]);
      else {
        std::fprintf(stderr, "bench_schedule --grid [--json] [--fb-overlap X]: unexpected '%s'\n", arg.c_str());
        return 2;
      }
    }
    if (!(fbOverlap >= 0 && fbOverlap <= 1)) {
      std::fprintf(stderr, "bench_schedule: --fb-overlap must be between 0 and 1\n");
      return 2;
    }
    return runGrid(json, fbOverlap);
  }
  if (mode == "--time-orders")
    return runTimeOrders();
  const bool quick = mode == "--quick";
  std::printf("== generation (incl. validation) and simulation time, uniform costs F=B=W=1 ==\n");
  std::printf("%-12s %4s %5s %9s %12s %10s %10s %9s\n", "schedule", "P", "M", "instrs", "generate ms", "sim ms",
              "makespan", "bubble");
  const std::vector<int> ps = quick ? std::vector<int>{4, 16} : std::vector<int>{4, 8, 16, 32, 64};
  const std::vector<int> ms = quick ? std::vector<int>{64} : std::vector<int>{64, 256, 1024};
  // Every family of the registry (Families.cpp), at the chunk count it runs by default.
  for (const ScheduleFamily &family : scheduleFamilies())
    for (int p : ps)
      for (int m : ms) {
        if (m < p)
          continue;
        const std::string nameText(family.name);
        const char *name = nameText.c_str();
        Problem P = problem(p, m, 1, 1, 1, 0);
        P.chunks = family.chunks;
        auto t0 = std::chrono::steady_clock::now();
        Schedule s;
        try {
          s = generate(name, P);
        } catch (const ScheduleError &e) {
          std::printf("%-12s %4d %5d  failed: %s\n", name, p, m, e.what());
          continue;
        }
        const double gen = msSince(t0);
        t0 = std::chrono::steady_clock::now();
        SimResult r = simulate(s);
        const double sim = msSince(t0);
        size_t n = 0;
        for (const auto &rank : s.ranks)
          n += rank.size();
        std::printf("%-12s %4d %5d %9zu %12.1f %10.1f %10.1f %8.2f%%\n", name, p, m, n, gen, sim, r.makespan,
                    100 * r.bubbleOverIdeal);
        std::fflush(stdout);
      }

  std::printf("\n== automatic search vs ZB-H1 / ZB-H2, P=8 M=32 (makespan; bubble over ideal) ==\n");
  std::printf("%4s %4s %4s %5s | %15s | %15s | %15s | %15s | %8s\n", "F", "B", "W", "C", "zb-h1 (mem p)",
              "zb-h2 (2p-1)", "auto limit p", "auto limit 2p", "auto/h1");
  for (double b : {1.0, 2.0})
    for (double w : {0.5, 1.0, 2.0})
      for (double c : {0.0, 0.2}) {
        Problem P = problem(8, 32, 1.0, b, w, c);
        auto cell = [&](const char *name, double limit, double *makespan) {
          Problem Q = P;
          Q.memoryLimit = limit;
          SimResult r = simulate(generate(name, Q));
          *makespan = r.makespan;
          char buf[64];
          std::snprintf(buf, sizeof buf, "%7.1f %6.2f%%", r.makespan, 100 * r.bubbleOverIdeal);
          return std::string(buf);
        };
        double h1, h2, a1, a2;
        std::string c1 = cell("zb-h1", 0, &h1), c2 = cell("zb-h2", 0, &h2), c3 = cell("auto", 8, &a1),
                    c4 = cell("auto", 16, &a2);
        std::printf("%4.1f %4.1f %4.1f %5.2f | %s | %s | %s | %s | %8.3f\n", 1.0, b, w, c, c1.c_str(), c2.c_str(),
                    c3.c_str(), c4.c_str(), a1 / h1);
      }
  return 0;
}
