// The files and queues of `FaultInjectionFileSystem`: they count each call,
// inject the armed fault and keep the power-loss log current.
#ifndef CKPT_TESTING_FAULT_INJECTION_IO_H_
#define CKPT_TESTING_FAULT_INJECTION_IO_H_

#include <memory>

#include "ckpt/file_system.h"
#include "testing/fault_injection_log.h"
#include "testing/fault_injection_state.h"

namespace ckpt::testing::fault_internal {

// Wraps `base`, a file of the wrapped file system; `tracked` is its entry in
// the power-loss log (null unless it was opened for writing).
std::unique_ptr<File> NewFaultFile(std::shared_ptr<State> state, std::unique_ptr<File> base,
                                   std::shared_ptr<TrackedFile> tracked);

// Wraps `base`, a queue of the wrapped file system. It hands the base queue
// the base files of the `NewFaultFile` files its ops name.
std::unique_ptr<IoQueue> NewFaultIoQueue(std::shared_ptr<State> state,
                                         std::unique_ptr<IoQueue> base);

}  // namespace ckpt::testing::fault_internal

#endif  // CKPT_TESTING_FAULT_INJECTION_IO_H_
