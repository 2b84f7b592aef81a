// `Reader`: the public face of reading a checkpoint. Loading the delta chain,
// opening shards, and reading, decoding and verifying records live in read/;
// this file checks arguments and puts those pieces in order.
#include "ckpt/reader.h"

#include <algorithm>
#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "ckpt/catalog.h"
#include "io/backend.h"
#include "read/decode_record.h"
#include "read/delta_chain.h"
#include "read/read_chunks.h"
#include "read/read_raw_records.h"
#include "read/shard_files.h"
#include "read/verify_full.h"
#include "util/log.h"
#include "util/status_macros.h"

namespace ckpt {
namespace {

using namespace internal;  // NOLINT: the reader is glue over the internals

uint64_t LargestRawBytes(const std::vector<TensorInfo>& tensors) {
  uint64_t largest = 0;
  for (const TensorInfo& t : tensors) largest = std::max(largest, t.raw_bytes);
  return largest;
}

class ReaderImpl final : public Reader {
 public:
  // `chain` runs from a full checkpoint to the one opened (a single link
  // for a full checkpoint).
  ReaderImpl(std::shared_ptr<FileSystem> fs, const IoOptions& io, DeltaChain chain,
             internal::OpenedIo backend)
      : chain_(std::move(chain)),
        files_(std::move(fs), io, std::move(backend)),
        chunks_(io, LargestRawBytes(chain_.opened().manifest.tensors), files_.queue()) {}

  int64_t step() const override { return manifest().step; }
  const std::string& dir() const override { return chain_.opened().dir; }
  int world_size() const override { return 1; }
  int rank() const override { return 0; }
  const std::string& extras_json() const override { return manifest().extras_json; }
  const std::vector<TensorInfo>& tensors() const override { return manifest().tensors; }
  const TensorInfo* Find(absl::string_view name) const override {
    return chain_.Find(chain_.size() - 1, name);
  }

  absl::Status ReadInto(std::span<const ReadTarget> targets) override;
  absl::StatusOr<Tensor> Read(absl::string_view name) override;
  absl::StatusOr<std::vector<Tensor>> ReadAll() override;
  using Reader::Verify;
  absl::Status Verify(const VerifyProgress& progress) override;

 private:
  const Manifest& manifest() const { return chain_.opened().manifest; }
  // Reconstructs each tensor through the chain, checking every link.
  absl::Status VerifyByReading(const VerifyProgress& progress);

  const DeltaChain chain_;
  ShardFiles files_;
  ReadChunks chunks_;  // created on first use; uses `files_`'s queue
};

absl::Status ReaderImpl::ReadInto(std::span<const ReadTarget> targets) {
  // Each target starts from the newest whole record of its chain.
  std::vector<RecordTarget> records;
  std::vector<size_t> bases;  // the chain link of each record
  records.reserve(targets.size());
  bases.reserve(targets.size());
  for (const ReadTarget& target : targets) {
    const TensorInfo* info = Find(target.name);
    if (info == nullptr) {
      return absl::NotFoundError(absl::StrCat("no tensor \"", target.name, "\" in ", dir()));
    }
    if (target.capacity < info->raw_bytes || (info->raw_bytes > 0 && target.data == nullptr)) {
      return absl::InvalidArgumentError(absl::StrCat("tensor \"", target.name, "\" needs ",
                                                     info->raw_bytes, " bytes, target has ",
                                                     target.capacity));
    }
    CKPT_ASSIGN_OR_RETURN(size_t base, chain_.BaseLinkOf(target.name));
    records.push_back(RecordTarget{&chain_.link(base).dir, chain_.Find(base, target.name),
                                   static_cast<char*>(target.data)});
    bases.push_back(base);
  }
  // Compressed records first, each on its own (one executor per queue at a time).
  for (const RecordTarget& record : records) {
    if (record.info->encoding == RecordEncoding::kZstd) {
      CKPT_RETURN_IF_ERROR(DecodeZstdRecord(files_, *record.dir, *record.info, record.dst));
    }
  }
  absl::Status status = ReadRawRecords(files_, chunks_, records);
  // Then the deltas, link by link, each checked.
  for (size_t i = 0; i < records.size() && status.ok(); ++i) {
    if (bases[i] + 1 < chain_.size()) {
      status = ApplyDeltas(files_, chain_, records[i].info->name, bases[i], records[i].dst);
    }
  }
  return status;
}

absl::StatusOr<Tensor> ReaderImpl::Read(absl::string_view name) {
  const TensorInfo* info = Find(name);
  if (info == nullptr) return absl::NotFoundError(absl::StrCat("no tensor \"", name, "\" in ", dir()));
  Tensor tensor{info->name, info->dtype, info->shape, {}};
  CKPT_ASSIGN_OR_RETURN(tensor.bytes, AlignedBytes::Allocate(info->raw_bytes, false));
  ReadTarget target{info->name, tensor.bytes.data(), tensor.bytes.size()};
  CKPT_RETURN_IF_ERROR(ReadInto({&target, 1}));
  return tensor;
}

absl::StatusOr<std::vector<Tensor>> ReaderImpl::ReadAll() {
  std::vector<Tensor> tensors;
  std::vector<ReadTarget> targets;
  tensors.reserve(manifest().tensors.size());
  for (const TensorInfo& info : manifest().tensors) {
    Tensor tensor{info.name, info.dtype, info.shape, {}};
    CKPT_ASSIGN_OR_RETURN(tensor.bytes, AlignedBytes::Allocate(info.raw_bytes, false));
    targets.push_back(ReadTarget{info.name, tensor.bytes.data(), tensor.bytes.size()});
    tensors.push_back(std::move(tensor));
  }
  CKPT_RETURN_IF_ERROR(ReadInto(targets));
  return tensors;
}

absl::Status ReaderImpl::VerifyByReading(const VerifyProgress& progress) {
  CKPT_ASSIGN_OR_RETURN(AlignedBytes buffer,
                        AlignedBytes::Allocate(LargestRawBytes(manifest().tensors), false));
  for (const TensorInfo& t : manifest().tensors) {
    ReadTarget target{t.name, buffer.data(), buffer.size()};
    CKPT_RETURN_IF_ERROR(ReadInto({&target, 1}));
    if (progress) progress(t.raw_bytes);
  }
  return absl::OkStatus();
}

absl::Status ReaderImpl::Verify(const VerifyProgress& progress) {
  if (chain_.is_delta()) return VerifyByReading(progress);
  return VerifyFullCheckpoint(files_, chunks_, dir(), manifest(), progress);
}

}  // namespace

absl::StatusOr<std::unique_ptr<Reader>> Reader::Open(const std::string& root,
                                                     const ReaderOptions& options) {
  std::shared_ptr<FileSystem> fs = options.fs != nullptr ? options.fs : PosixFileSystem();
  CKPT_ASSIGN_OR_RETURN(std::vector<int64_t> steps, ListSteps(root, fs));
  auto opened = OpenIo(*fs, options.io, "");
  if (!opened.ok()) return Annotate(opened.status(), absl::StrCat("checkpoint root ", root));
  internal::OpenedIo backend = std::move(*opened);
  if (options.step.has_value()) {
    const int64_t step = *options.step;
    if (!std::binary_search(steps.begin(), steps.end(), step)) {
      return absl::NotFoundError(absl::StrCat("no checkpoint for step ", step, " in ", root));
    }
    CKPT_ASSIGN_OR_RETURN(DeltaChain chain, DeltaChain::Load(*fs, root, step));
    return std::unique_ptr<Reader>(
        new ReaderImpl(fs, options.io, std::move(chain), std::move(backend)));
  }
  std::string skipped;
  for (auto it = steps.rbegin(); it != steps.rend(); ++it) {
    auto chain = DeltaChain::Load(*fs, root, *it);
    if (chain.ok()) {
      return std::unique_ptr<Reader>(
          new ReaderImpl(fs, options.io, std::move(*chain), std::move(backend)));
    }
    // Only damage is skipped: an I/O error (EIO, EACCES, ...) may be
    // transient, and silently restoring an older step would hide it.
    if (chain.status().code() != absl::StatusCode::kDataLoss &&
        chain.status().code() != absl::StatusCode::kUnimplemented) {
      return Annotate(chain.status(), absl::StrCat("checkpoint step ", *it, " in ", root));
    }
    Log(LogLevel::kWarning, absl::StrCat("skipping step ", *it, ": ", chain.status().message()));
    absl::StrAppend(&skipped, skipped.empty() ? "" : "; ", "step ", *it, ": ",
                    chain.status().message());
  }
  if (skipped.empty()) return absl::NotFoundError(absl::StrCat("no checkpoint in ", root));
  return absl::DataLossError(absl::StrCat("no readable checkpoint in ", root, " (", skipped, ")"));
}

}  // namespace ckpt
