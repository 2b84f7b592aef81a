// tools/restore/list.h: ckpt-restore --list [--verify].
#ifndef CKPT_TOOLS_RESTORE_LIST_H_
#define CKPT_TOOLS_RESTORE_LIST_H_

#include "restore/commands.h"
#include "restore/output.h"

namespace ckpt::tools {

// `RunList` prints one row (or JSON record) per committed checkpoint of
// `request.root`, oldest first, from the manifests. With `request.verify` it
// also reads every tensor of every listed checkpoint (deltas through their
// chains) and adds whether each verifies and, if not, why; it then returns
// kExitDataLoss unless all verify. Without it, kExitOk even when a manifest is
// damaged (listing is informational).
int RunList(const RestoreRequest& request, Output& output);

}  // namespace ckpt::tools

#endif  // CKPT_TOOLS_RESTORE_LIST_H_
