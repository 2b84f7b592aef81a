#include "io/io_executor.h"

#include <algorithm>
#include <cerrno>

#include "absl/strings/str_cat.h"
#include "util/errno_status.h"
#include "util/status_macros.h"

namespace ckpt::internal {
namespace {

// A transfer that keeps failing with EINTR/EAGAIN this many times in a row is
// reported rather than spun on forever.
constexpr uint32_t kMaxRetries = 10000;

std::string Describe(const IoOp& op) {
  return absl::StrCat(op.kind == IoOp::Kind::kWrite ? "write " : "read ", op.length,
                      " bytes at offset ", op.offset, " of ", op.file->path());
}

}  // namespace

IoExecutor::IoExecutor(IoQueue* queue, size_t max_piece)
    : queue_(queue), max_piece_(std::max<size_t>(max_piece, kDirectIoAlignment)) {
  slots_.resize(queue_->depth());
  free_slots_.reserve(slots_.size());
  for (size_t i = slots_.size(); i > 0; --i) free_slots_.push_back(static_cast<uint32_t>(i - 1));
}

IoExecutor::~IoExecutor() { (void)Drain(); }

void IoExecutor::RecordError(absl::Status status) {
  if (status_.ok()) status_ = std::move(status);
}

void IoExecutor::PieceDone(uint64_t transfer) {
  auto it = transfers_.find(transfer);
  if (it == transfers_.end()) return;
  if (--it->second.pieces_left == 0) {
    // Finished, failed or abandoned: the caller's buffer is no longer in use.
    finished_.push_back(it->second.tag);
    transfers_.erase(it);
  }
}

absl::Status IoExecutor::SubmitPiece(const Piece& piece) {
  while (free_slots_.empty()) CKPT_RETURN_IF_ERROR(ReapAndHandle(1));
  // A transfer that failed while we waited for room: start nothing more.
  if (!status_.ok()) return status_;
  uint32_t slot = free_slots_.back();
  Piece& stored = slots_[slot];
  stored = piece;
  stored.op.tag = slot;
  absl::Status submitted = queue_->Submit({&stored.op, 1});
  if (!submitted.ok()) {
    RecordError(Annotate(submitted, Describe(piece.op)));
    return status_;
  }
  free_slots_.pop_back();
  ++in_queue_;
  return absl::OkStatus();
}

void IoExecutor::SubmitRetries() {
  while (!resubmit_.empty()) {
    Piece retry = resubmit_.back();
    resubmit_.pop_back();
    // After an error retries are abandoned; their transfer still finishes
    // (so its tag is reported and its buffer given back).
    if (!status_.ok() || !SubmitPiece(retry).ok()) PieceDone(retry.transfer);
  }
}

absl::Status IoExecutor::Start(IoOp::Kind kind, File* file, uint64_t offset, void* buf,
                               size_t length, uint64_t tag, int buf_index, size_t required) {
  if (required > length) required = length;
  if (!status_.ok()) return status_;
  uint64_t id = next_transfer_++;
  size_t pieces = length == 0 ? 0 : (length + max_piece_ - 1) / max_piece_;
  if (pieces == 0) {
    finished_.push_back(tag);
    return absl::OkStatus();
  }
  transfers_[id] = Transfer{tag, pieces};
  auto* bytes = static_cast<char*>(buf);
  size_t started = 0;
  for (size_t done = 0; done < length; ++started) {
    size_t n = std::min(max_piece_, length - done);
    Piece piece;
    piece.op = IoOp{kind, file, offset + done, bytes + done, static_cast<uint32_t>(n), buf_index, 0};
    piece.transfer = id;
    piece.required = static_cast<uint32_t>(required > done ? std::min(n, required - done) : 0);
    absl::Status s = SubmitPiece(piece);
    if (!s.ok()) {
      if (started == 0) {
        // Nothing of it started: the caller keeps its buffer, and the tag is
        // never reported.
        transfers_.erase(id);
        return s;
      }
      // Part of it is in flight: the pieces never started count as done, the
      // tag is reported once the started ones complete, and the error comes
      // from `Poll`/`Drain`.
      for (size_t i = started; i < pieces; ++i) PieceDone(id);
      return absl::OkStatus();
    }
    done += n;
    SubmitRetries();  // retries queued while reaping
  }
  return absl::OkStatus();
}

void IoExecutor::HandleCompletion(const IoCompletion& completion) {
  Piece piece = slots_[completion.tag];
  free_slots_.push_back(static_cast<uint32_t>(completion.tag));
  --in_queue_;
  const int64_t r = completion.result;
  const IoOp& op = piece.op;
  bool piece_done = false;
  if (r == op.length || (op.kind == IoOp::Kind::kRead && r >= 0 && r >= piece.required)) {
    piece_done = true;
  } else if (r == -EINTR || r == -EAGAIN) {
    if (++piece.retries > kMaxRetries) {
      RecordError(ErrnoToStatus(static_cast<int>(-r), Describe(op) + " (retries exhausted)"));
      piece_done = true;
    } else {
      resubmit_.push_back(piece);
    }
  } else if (r < 0) {
    RecordError(ErrnoToStatus(static_cast<int>(-r), Describe(op)));
    piece_done = true;
  } else if (r == 0) {
    if (op.kind == IoOp::Kind::kWrite) {
      RecordError(ErrnoToStatus(ENOSPC, Describe(op) + " wrote 0 bytes"));
    } else {
      RecordError(absl::DataLossError(
          absl::StrCat(Describe(op), ": unexpected end of file (file truncated?)")));
    }
    piece_done = true;
  } else {
    // Short transfer: resubmit the remainder.
    piece.op.offset += static_cast<uint64_t>(r);
    piece.op.buf = static_cast<char*>(op.buf) + r;
    piece.op.length -= static_cast<uint32_t>(r);
    piece.required -= static_cast<uint32_t>(std::min<int64_t>(r, piece.required));
    piece.retries = 0;
    resubmit_.push_back(piece);
  }
  if (piece_done) PieceDone(piece.transfer);
}

absl::Status IoExecutor::ReapAndHandle(size_t min) {
  completions_.clear();
  absl::Status reaped = queue_->Reap(min, &completions_);
  for (const IoCompletion& c : completions_) HandleCompletion(c);
  if (!reaped.ok()) RecordError(reaped);
  return reaped;
}

absl::Status IoExecutor::Poll(bool block, std::vector<uint64_t>* finished) {
  while (true) {
    SubmitRetries();
    bool need_wait = block && finished_.empty() && in_queue_ > 0;
    if (!need_wait) {
      // Pick up whatever already completed without blocking.
      if (in_queue_ > 0) {
        absl::Status s = ReapAndHandle(0);
        if (!s.ok()) RecordError(s);
      }
      if (!resubmit_.empty()) continue;
      break;
    }
    absl::Status s = ReapAndHandle(1);
    if (!s.ok()) break;
  }
  finished->insert(finished->end(), finished_.begin(), finished_.end());
  finished_.clear();
  return status_;
}

absl::Status IoExecutor::Drain(std::vector<uint64_t>* finished) {
  std::vector<uint64_t> local;
  while (in_queue_ > 0 || !resubmit_.empty()) {
    absl::Status s = Poll(/*block=*/true, &local);
    if (!s.ok() && in_queue_ > 0) {
      // Keep reaping so no transfer outlives its buffer.
      completions_.clear();
      if (!queue_->Reap(in_queue_, &completions_).ok()) break;
      for (const IoCompletion& c : completions_) HandleCompletion(c);
    }
  }
  local.insert(local.end(), finished_.begin(), finished_.end());
  finished_.clear();
  if (finished != nullptr) finished->insert(finished->end(), local.begin(), local.end());
  transfers_.clear();
  return status_;
}

}  // namespace ckpt::internal
