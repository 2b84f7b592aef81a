// read_ops.h: the load ops of torch.ops.ckpt (registered in ops.cc).
#ifndef CKPT_TORCH_EXT_READ_OPS_H_
#define CKPT_TORCH_EXT_READ_OPS_H_

#include <cstdint>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include <ATen/core/Tensor.h>
#include <torch/custom_class.h>

#include "ckpt/newest.h"
#include "ckpt/reader.h"

namespace ckpt::torch_ext {

// Steps of the committed checkpoints in `root`, ascending.
std::vector<int64_t> ListSteps(const std::string& root);

// What a load read: the step, the tensors (manifest order), the extras JSON,
// and one line "step N: <reason>" per newer checkpoint that was skipped
// because it did not read back intact.
using ReadResult = std::tuple<int64_t, std::vector<std::string>, std::vector<at::Tensor>,
                              std::string, std::vector<std::string>>;

// `ReadStep` reads every tensor of checkpoint `step` into new CPU tensors.
// With no step (or a negative one) it reads the newest checkpoint that reads
// back completely and verifies, skipping damaged newer ones.
// `rank` (all the ops below): the part of a multi-rank checkpoint to read —
// that rank's own tensors and every replicated one, under their names — or,
// unset, all of it (replicated tensors under their names, every rank's
// others as "rank<r>/<name>"); ReaderOptions::rank.
ReadResult ReadStep(const std::string& root, std::optional<int64_t> step,
                    std::optional<int64_t> rank = std::nullopt);

// `ReadIntoStep` copies the named tensors of the checkpoint into `tensors`
// in place (any device, any strides; dtype and shape must match). Step
// selection as for `ReadStep`; a skipped checkpoint may have partly written
// the tensors before the next one overwrote them. Returns the step, the
// extras JSON and the skipped lines.
std::tuple<int64_t, std::string, std::vector<std::string>> ReadIntoStep(
    const std::string& root, std::optional<int64_t> step, const std::vector<std::string>& names,
    at::TensorList tensors, std::optional<int64_t> rank = std::nullopt);

// `ReadRegionsStep` fills each of `tensors` (in place; any device, any
// strides) with a box of the tensor `names[i]` of checkpoint `step`: the
// elements from `offsets[i]` (one entry per dimension) on, as many per
// dimension as `tensors[i]` has (Reader::ReadRegions). The tensor may be a
// sharded one (only the chunks overlapping the box are read) or any other.
// dtype must match; a box outside the tensor is a ValueError. Tensors that
// are not CPU-contiguous are filled through a CPU temporary, copied over only
// once every read verified. Returns the bytes the reader read from shard
// files (Reader::bytes_read: what the boxes cost, block rounding included).
int64_t ReadRegionsStep(const std::string& root, int64_t step, const std::vector<std::string>& names,
                        const std::vector<std::vector<int64_t>>& offsets, at::TensorList tensors,
                        std::optional<int64_t> rank = std::nullopt);

// `DescribeStep` is the manifest of a checkpoint (newest whose manifest
// verifies when no step) as JSON: {"step", "dir", "world_size", "rank" (-1:
// all of it), "extras" (the reader's extras_json(): the viewed rank's),
// "tensors": [{"name", "dtype", "shape", "raw_bytes", "stored_bytes",
// "encoding", "error_bound", "placement" ("default", "replicated",
// "rank_local", "sharded"), "rank" (-1 for a sharded tensor)}]}; a sharded
// tensor, shown once with its global shape, adds "chunks": [{"rank",
// "offset", "shape", "stored_bytes", "encoding"}], one per saved chunk.
// Reads no tensor data.
std::string DescribeStep(const std::string& root, std::optional<int64_t> step,
                         std::optional<int64_t> rank = std::nullopt);

// `VerifyStep` reads every record of checkpoint `step` and checks every
// checksum; raises naming the file and tensor on the first mismatch.
void VerifyStep(const std::string& root, int64_t step, std::optional<int64_t> rank = std::nullopt);

// `NewestFirstHolder` is `torch.classes.ckpt.NewestFirst`: the library's walk
// over a root's checkpoints, newest first (ckpt/newest.h), for the Python
// loader, which works out what to read from each candidate's manifest:
//   walk = torch.classes.ckpt.NewestFirst(root)
//   while (step := walk.next()) is not None:
//       try: ...; return step
//       except CheckpointError as e: walk.skip(step, e.code or "", str(e))
//   walk.raise_none_left()
class NewestFirstHolder : public torch::CustomClassHolder {
 public:
  explicit NewestFirstHolder(const std::string& root);  // raises if ROOT cannot be listed

  c10::optional<int64_t> Next() { return walk_->Next(); }
  // Records that `step` did not read back; `code` is a status code name
  // ("DATA_LOSS", ...; anything else counts as UNKNOWN).
  void Skip(int64_t step, const std::string& code, const std::string& message);
  // The "step N: <reason>" lines of the steps skipped so far.
  std::vector<std::string> Skipped() const { return walk_->SkippedLines(); }
  // Raises the library's NOT_FOUND error for a walk that found nothing.
  void RaiseNoneLeft() const;

 private:
  std::string root_;
  std::optional<NewestFirst> walk_;
};

// `StepReaderHolder` is `torch.classes.ckpt.StepReader`: one checkpoint
// opened once (its manifests parsed, its files opened, one ring) and read
// from in several calls, which a load that interleaves its reads with other
// work needs (ckpt.load with a process group reads its share of the
// replicated tensors a batch at a time while the batch before travels to the
// other ranks):
//   reader = torch.classes.ckpt.StepReader(root, step, rank)  # rank -1: all
//   reader.describe()  # as DescribeStep(root, step, rank), no second open
//   reader.read_into(names, tensors); tensors = reader.read_new(names)
//   reader.read_regions(names, offsets, tensors)  # as ReadRegionsStep
//   reader.bytes_read()
// Errors raise as the load ops' do (CheckpointError from the Python side).
class StepReaderHolder : public torch::CustomClassHolder {
 public:
  StepReaderHolder(const std::string& root, int64_t step, int64_t rank);

  int64_t step() const { return reader_->step(); }
  int64_t world_size() const { return reader_->world_size(); }
  std::string extras() const { return reader_->extras_json(); }
  // The manifest as JSON, as DescribeStep gives it.
  std::string Describe() const;
  // Fills boxes of the named tensors, as ReadRegionsStep does; returns
  // bytes_read() after it.
  int64_t ReadRegions(const std::vector<std::string>& names,
                      const std::vector<std::vector<int64_t>>& offsets, at::TensorList tensors);
  // Fills `tensors` in place, as ReadIntoStep does.
  void ReadInto(const std::vector<std::string>& names, at::TensorList tensors);
  // The named tensors in new CPU tensors (Reader::ReadNamed).
  std::vector<at::Tensor> ReadNew(const std::vector<std::string>& names);
  // Bytes read from shard files so far (Reader::bytes_read).
  int64_t bytes_read() const { return static_cast<int64_t>(reader_->bytes_read()); }

 private:
  std::string Context() const;

  std::string root_;
  std::optional<int> rank_;
  std::unique_ptr<Reader> reader_;
};

}  // namespace ckpt::torch_ext

#endif  // CKPT_TORCH_EXT_READ_OPS_H_
