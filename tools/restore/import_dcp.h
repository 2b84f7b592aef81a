// tools/restore/import_dcp.h: `ckpt-restore --root DIR --import-dcp DCP_DIR
// --step N`, converting a directory written by torch.distributed.checkpoint's
// FileSystemWriter into checkpoint N of DIR.
//
// DCP's data files are torch.save archives, read by the `ckpt` Python
// package (ckpt.dcp.import_checkpoint: streamed through bounded staging
// memory, metadata read without running code, the result verified); this
// verb runs it as `$CKPT_PYTHON -m ckpt.dcp import DCP_DIR DIR N` (python3 when
// CKPT_PYTHON is unset) and maps its outcome to ckpt-restore's exit codes.
#ifndef CKPT_TOOLS_RESTORE_IMPORT_DCP_H_
#define CKPT_TOOLS_RESTORE_IMPORT_DCP_H_

#include <cstdint>
#include <ostream>
#include <string>

namespace ckpt::tools {

// Runs the import; returns an `ExitCode`: kExitOk, kExitDataLoss (the DCP
// directory is incomplete, unsafe or unreadable; the importer's message is on
// `err`), kExitError (the interpreter or the package could not be run).
int RunImportDcp(const std::string& root, const std::string& dcp_dir, int64_t step,
                 std::ostream& err);

}  // namespace ckpt::tools

#endif  // CKPT_TOOLS_RESTORE_IMPORT_DCP_H_
