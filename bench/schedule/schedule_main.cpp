// Stand-alone driver for `pipec schedule` (until the lead's pipec main
// dispatches to it): pipec-schedule --stages 4 --microbatches 8 --compare
#include "analysis/Schedule/Schedule.h"

#include <string>
#include <vector>

int main(int argc, char **argv) {
  std::vector<char *> args(argv, argv + argc);
  static char name[] = "schedule";
  args[0] = name;
  return pipec::schedule::runScheduleCommand((int)args.size(), args.data());
}
