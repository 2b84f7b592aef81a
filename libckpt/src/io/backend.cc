#include "io/backend.h"

#include "absl/random/random.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "ckpt/tensor.h"
#include "util/path.h"
#include "io/io_executor.h"
#include "util/log.h"
#include "util/status_macros.h"

namespace ckpt::internal {
namespace {

absl::StatusOr<std::unique_ptr<IoQueue>> OpenQueue(FileSystem& fs, const IoOptions& options) {
  if (options.backend == ckpt::IoBackend::kThreads) {
    return fs.NewIoQueue(IoQueueKind::kThreads, options.queue_depth);
  }
  auto uring = fs.NewIoQueue(IoQueueKind::kUring, options.queue_depth);
  if (uring.ok() || options.backend == ckpt::IoBackend::kUring) return uring;
  Log(LogLevel::kWarning, absl::StrCat("io_uring unavailable (", uring.status().message(),
                                       "); falling back to a thread pool"));
  return fs.NewIoQueue(IoQueueKind::kThreads, options.queue_depth);
}

// OK if `dir` accepts an O_DIRECT file and a 4 KiB aligned write to it.
absl::Status ProbeDirectIo(FileSystem& fs, IoQueue& queue, const std::string& dir) {
  absl::BitGen gen;
  const std::string path = JoinPath(
      dir, absl::StrFormat(".ckpt-direct-probe-%016x", absl::Uniform<uint64_t>(gen)));
  OpenOptions open;
  open.write = true;
  open.create = true;
  open.exclusive = true;
  open.direct = true;
  auto file = fs.Open(path, open);
  if (!file.ok()) return file.status();
  absl::Status status;
  {
    auto block = AlignedBytes::Allocate(kDirectIoAlignment, /*prefault=*/true);
    if (!block.ok()) return block.status();
    IoExecutor io(&queue, kDirectIoAlignment);
    status = io.Start(IoOp::Kind::kWrite, file->get(), 0, block->data(), kDirectIoAlignment, 0);
    absl::Status drained = io.Drain();
    if (status.ok()) status = drained;
  }
  absl::Status closed = (*file)->Close();
  if (status.ok()) status = closed;
  (void)fs.RemoveFile(path);
  return status;
}

}  // namespace

absl::StatusOr<OpenedIo> OpenIo(FileSystem& fs, const IoOptions& options,
                                 const std::string& probe_dir) {
  if (options.queue_depth == 0 || options.chunk_bytes == 0 ||
      options.chunk_bytes % kDirectIoAlignment != 0 || options.chunk_bytes > (size_t{1} << 30)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "io options: queue_depth must be > 0 and chunk_bytes a multiple of 4096 up to 1 GiB (got ",
        options.queue_depth, ", ", options.chunk_bytes, ")"));
  }
  OpenedIo backend;
  CKPT_ASSIGN_OR_RETURN(backend.queue, OpenQueue(fs, options));
  backend.direct = options.direct != DirectIoMode::kOff;
  if (backend.direct && !probe_dir.empty()) {
    absl::Status probe = ProbeDirectIo(fs, *backend.queue, probe_dir);
    if (!probe.ok()) {
      if (options.direct == DirectIoMode::kOn || probe.code() != absl::StatusCode::kInvalidArgument) {
        return Annotate(probe, absl::StrCat("O_DIRECT probe in ", probe_dir));
      }
      Log(LogLevel::kInfo, absl::StrCat(probe_dir, " refuses O_DIRECT (", probe.message(),
                                        "); using buffered I/O"));
      backend.direct = false;
    }
  }
  backend.description =
      absl::StrCat(backend.queue->name(), backend.direct ? "+O_DIRECT" : "+buffered");
  if (!probe_dir.empty()) {
    Log(LogLevel::kInfo, absl::StrCat("I/O for ", probe_dir, ": ", backend.description,
                                      ", queue depth ", options.queue_depth, ", ",
                                      options.chunk_bytes >> 10, " KiB transfers"));
  }
  return backend;
}

}  // namespace ckpt::internal
