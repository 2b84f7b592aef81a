// ckpt-retain: the retention/tiering job, meant for cron. The command line
// lives in cli.{h,cc}, the job in retention.{h,cc} and what it decides in
// plan.{h,cc}. See docs/retention.md.
#include <iostream>

#include "retain/cli.h"

int main(int argc, char** argv) {
  return ckpt::tools::RetainMain(argc, argv, std::cout, std::cerr);
}
