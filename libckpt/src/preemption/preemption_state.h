// What the engines of a process read of a preemption (ckpt/preemption.h):
// the deadline in force, and how many saves are in flight across them (the
// watch ends the process only once that is zero, or its allowance ran out).
// Lock-free; safe from any thread.
#ifndef CKPT_PREEMPTION_PREEMPTION_STATE_H_
#define CKPT_PREEMPTION_PREEMPTION_STATE_H_

#include <chrono>
#include <optional>
#include <string>

namespace ckpt::internal {

// When this process's saves must be durable by, once a watched signal
// arrived (std::chrono::steady_clock, which is CLOCK_MONOTONIC); nullopt
// before. It stays in force after the watch is uninstalled.
std::optional<std::chrono::steady_clock::time_point> PreemptionDeadline();
// Whether that deadline is in force and past: saves are refused, and those
// not durable yet are given up.
bool PreemptionDeadlinePassed();
// The signal that set the deadline (0 before).
int PreemptionSignal();
// "SIGTERM", or "signal 40" for one without a name.
std::string SignalName(int sig);
// "the preemption grace after SIGTERM ran out": how the errors of saves
// refused or given up at the deadline say why.
std::string PreemptionGraceRanOut();

// Engines count their saves in flight here (+1 when one is queued, -1 once
// it finished, its temp directory removed if it failed).
void AddProcessSavesInFlight(int delta);
int ProcessSavesInFlight();

}  // namespace ckpt::internal

#endif  // CKPT_PREEMPTION_PREEMPTION_STATE_H_
