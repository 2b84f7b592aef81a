// `IoExecutor` drives an `IoQueue`: it splits transfers into pieces, keeps
// the queue full, and retries what the kernel may legitimately cut short.
#ifndef CKPT_IO_IO_EXECUTOR_H_
#define CKPT_IO_IO_EXECUTOR_H_

#include <cstddef>
#include <cstdint>
#include <unordered_map>
#include <vector>

#include "absl/status/status.h"
#include "ckpt/file_system.h"

namespace ckpt::internal {

// Not thread-safe: one thread drives one executor.
//
// Retries: a short transfer is resubmitted for its remainder; -EINTR and
// -EAGAIN are resubmitted as they were. A write that transfers 0 bytes is
// ENOSPC (kResourceExhausted); a read that returns 0 bytes before the end is
// kDataLoss (the file is shorter than its manifest says). Any other error is
// the first error: it sticks, nothing more is started, and `Drain` returns it
// after every transfer already in flight has finished (their buffers stay
// the caller's until then).
class IoExecutor {
 public:
  // `max_piece` bytes at most per queued op (a multiple of 4 KiB).
  IoExecutor(IoQueue* queue, size_t max_piece);
  ~IoExecutor();  // drains

  IoExecutor(const IoExecutor&) = delete;
  IoExecutor& operator=(const IoExecutor&) = delete;

  // Starts moving `length` bytes between `buf` and `file` at `offset`. Waits
  // for queue room when needed. An error means none of it started: the
  // buffer stays the caller's and `tag` is never reported. OK means it
  // started: `tag` is reported by `Poll`/`Drain` exactly once, when no part
  // of it is in flight any more -- whether it succeeded or not (a failure
  // after the start is their error) -- and only then is the buffer the
  // caller's again. `buf_index` names a registered buffer holding `buf`.
  // For reads, `required` (<= `length`) is how many bytes must arrive: a
  // read that ends early at end of file after `required` bytes is complete
  // (O_DIRECT reads of a final, partial block). Default: all of `length`.
  absl::Status Start(IoOp::Kind kind, File* file, uint64_t offset, void* buf, size_t length,
                     uint64_t tag, int buf_index = -1, size_t required = SIZE_MAX);

  // Appends the tags of transfers that completed to `finished`; with `block`,
  // first waits until at least one more completes (if any is in flight).
  absl::Status Poll(bool block, std::vector<uint64_t>* finished);

  // Waits for everything in flight; appends finished tags when `finished` is
  // not null. Returns the first error of any transfer.
  absl::Status Drain(std::vector<uint64_t>* finished = nullptr);

  size_t transfers_in_flight() const { return transfers_.size(); }
  const absl::Status& status() const { return status_; }

 private:
  struct Piece {
    IoOp op;
    uint64_t transfer = 0;
    uint32_t required = 0;  // bytes of `op` that must transfer
    uint32_t retries = 0;
  };
  struct Transfer {
    uint64_t tag = 0;
    size_t pieces_left = 0;
  };

  // Waits for at least `min` completions and handles them.
  absl::Status ReapAndHandle(size_t min);
  void HandleCompletion(const IoCompletion& completion);
  // One piece of `transfer` is no longer in flight (done, failed or never
  // to be started); the last one reports the transfer's tag.
  void PieceDone(uint64_t transfer);
  // Submits the pieces waiting for a retry; after an error, abandons them.
  void SubmitRetries();
  absl::Status SubmitPiece(const Piece& piece);
  void RecordError(absl::Status status);

  IoQueue* const queue_;
  const size_t max_piece_;
  std::vector<Piece> slots_;          // indexed by the queue tag
  std::vector<uint32_t> free_slots_;
  std::vector<Piece> resubmit_;       // retries waiting for submission
  std::unordered_map<uint64_t, Transfer> transfers_;
  uint64_t next_transfer_ = 1;
  std::vector<uint64_t> finished_;
  std::vector<IoCompletion> completions_;
  size_t in_queue_ = 0;
  absl::Status status_;
};

}  // namespace ckpt::internal

#endif  // CKPT_IO_IO_EXECUTOR_H_
