// Schedule benchmark: generation (+validation) and simulation time for large
// pipelines, and the automatic search against ZB-H1/ZB-H2 on a grid of costs.
// Prints tables; built with the tests, never run by ctest.
#include "analysis/Schedule/Schedule.h"

#include <chrono>
#include <cstdio>
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

int main(int argc, char **argv) {
  const bool quick = argc > 1 && std::string(argv[1]) == "--quick";
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
