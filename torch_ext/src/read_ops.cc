#include "read_ops.h"

#include <algorithm>
#include <cstdint>
#include <functional>
#include <memory>
#include <utility>

#include <ATen/ops/empty.h>
#include <c10/core/Event.h>
#include <c10/core/impl/VirtualGuardImpl.h>
#include <c10/util/Exception.h>
#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "ckpt/catalog.h"
#include "ckpt/json.h"
#include "ckpt/newest.h"
#include "ckpt/reader.h"
#include "tensor_convert.h"
#include "torch_status.h"

namespace ckpt::torch_ext {
namespace {

// `ReadFn` does the reading once a checkpoint is open. A library error means
// "this checkpoint does not read back"; invalid requests throw instead.
using ReadFn = std::function<absl::Status(Reader&)>;

std::optional<int> Rank(std::optional<int64_t> rank) {
  if (!rank.has_value()) return std::nullopt;
  TORCH_CHECK_VALUE(*rank >= 0 && *rank <= INT32_MAX, "ckpt: rank must be >= 0, got ", *rank);
  return static_cast<int>(*rank);
}

// " (rank r's part)" for error contexts, or "".
std::string OfRank(std::optional<int> rank) {
  return rank.has_value() ? absl::StrCat(" (rank ", *rank, "'s part)") : std::string();
}

std::unique_ptr<Reader> OpenOrThrow(const std::string& root, std::optional<int64_t> step,
                                    std::optional<int> rank) {
  ReaderOptions options;
  options.step = step;
  options.rank = rank;
  auto reader = Reader::Open(root, options);
  ThrowIfError(reader.status(), absl::StrCat("ckpt: load from ", root, OfRank(rank), ": "));
  return std::move(*reader);
}

// Runs `fn` on checkpoint `step`, or (no step / negative) on the newest one
// for which it succeeds (ckpt/newest.h), recording each newer one it skipped
// and why. Returns the step read.
int64_t ReadNewest(const std::string& root, std::optional<int64_t> step, std::optional<int> rank,
                   const ReadFn& fn, std::vector<std::string>* skipped) {
  ReaderOptions options;
  if (step.has_value() && *step >= 0) options.step = step;
  options.rank = rank;
  auto reader = OpenNewest(root, options, fn, [&](const SkippedCheckpoint& s) {
    skipped->push_back(absl::StrCat("step ", s.step, ": ", s.why.ToString()));
  });
  ThrowIfError(reader.status(),
               options.step.has_value()
                   ? absl::StrCat("ckpt: load step ", *step, " from ", root, OfRank(rank), ": ")
                   : absl::StrCat("ckpt: load from ", root, OfRank(rank), ": "));
  return (*reader)->step();
}

// A destination in device memory, filled through pinned host memory.
struct DeviceTarget {
  std::string name;
  at::Tensor dst;
  size_t bytes = 0;
};

constexpr size_t kDeviceBatchBytes = size_t{256} << 20;
constexpr size_t kBatchAlign = 4096;  // each tensor's place in a batch, for O_DIRECT reads

size_t AlignUp(size_t n) { return (n + kBatchAlign - 1) / kBatchAlign * kBatchAlign; }

// Fills `targets` (device tensors) from `reader`: batches of tensors are
// read into one of two pinned host buffers while the other's host-to-device
// copies run on each destination's current stream, so the copies overlap
// the reads. Each batch's reads are verified before its copies are queued;
// returns once every copy has landed.
absl::Status ReadIntoDevice(Reader& reader, const std::vector<DeviceTarget>& targets) {
  if (targets.empty()) return absl::OkStatus();
  size_t batch_bytes = kDeviceBatchBytes;
  for (const DeviceTarget& t : targets) batch_bytes = std::max(batch_bytes, AlignUp(t.bytes));
  const auto pinned = at::TensorOptions().dtype(at::kByte).pinned_memory(true);
  at::Tensor buffers[2] = {at::empty({static_cast<int64_t>(batch_bytes)}, pinned),
                           at::empty({static_cast<int64_t>(batch_bytes)}, pinned)};
  std::optional<c10::Event> copied[2];  // the last copies out of each buffer
  const c10::DeviceType type = targets.front().dst.device().type();
  c10::impl::VirtualGuardImpl guard(type);
  size_t next = 0;
  for (int batch = 0; next < targets.size(); ++batch) {
    const int b = batch % 2;
    if (copied[b].has_value()) copied[b]->synchronize();  // its last copies have landed
    std::vector<ReadTarget> reads;
    std::vector<std::pair<size_t, size_t>> placed;  // (target, offset in the buffer)
    size_t used = 0;
    char* base = static_cast<char*>(buffers[b].data_ptr());
    while (next < targets.size() && used + AlignUp(targets[next].bytes) <= batch_bytes) {
      reads.push_back(ReadTarget{targets[next].name, base + used, targets[next].bytes});
      placed.emplace_back(next, used);
      used += AlignUp(targets[next].bytes);
      ++next;
    }
    absl::Status read = reader.ReadInto(reads);
    if (!read.ok()) {
      for (auto& e : copied) {
        if (e.has_value()) e->synchronize();
      }
      return read;
    }
    copied[b].emplace(type);
    for (const auto& [i, offset] : placed) {
      const at::Tensor& dst = targets[i].dst;
      at::Tensor host = buffers[b]
                            .narrow(0, static_cast<int64_t>(offset), static_cast<int64_t>(targets[i].bytes))
                            .view(dst.scalar_type())
                            .view(dst.sizes());
      dst.copy_(host, /*non_blocking=*/true);
    }
    // (One event per batch, on the stream of its last destination's device;
    // destinations on other devices or streams are synchronized below.)
    const c10::Device device = targets[placed.back().first].dst.device();
    copied[b]->record(guard.getStream(device));
    for (const auto& [i, offset] : placed) {
      const c10::Device d = targets[i].dst.device();
      if (d != device) guard.getStream(d).synchronize();
    }
  }
  for (auto& e : copied) {
    if (e.has_value()) e->synchronize();
  }
  return absl::OkStatus();
}

// Fills `tensors` in place with the named tensors of `reader`'s checkpoint
// (ReadIntoStep, StepReader.read_into): invalid requests (a name the
// checkpoint lacks, a dtype or shape that differs) throw before anything is
// read; a library error is returned.
absl::Status FillInto(Reader& reader, const std::string& root, const std::vector<std::string>& names,
                      at::TensorList tensors) {
  // Tensors that are CPU and contiguous are filled in place; other CPU
  // ones through a CPU temporary, copied over only once all reads
  // verified.
  // CUDA tensors through pinned host memory, overlapping their
  // host-to-device copies with the reads (`ReadIntoDevice`).
  std::vector<ReadTarget> targets;
  std::vector<std::pair<at::Tensor, at::Tensor>> copies;  // (temporary, destination)
  std::vector<DeviceTarget> device_targets;
  for (size_t i = 0; i < names.size(); ++i) {
    const at::Tensor& dst = tensors[i];
    const TensorInfo* info = reader.Find(names[i]);
    TORCH_CHECK_VALUE(info != nullptr, "ckpt: step ", reader.step(), " in ", root,
                      " has no tensor \"", names[i], "\"");
    TORCH_CHECK_VALUE(dst.defined() && dst.layout() == c10::kStrided, "ckpt: destination of \"",
                      names[i], "\" is not a dense tensor");
    std::optional<DType> dtype = ToCkptDType(dst.scalar_type());
    TORCH_CHECK_TYPE(dtype == info->dtype, "ckpt: tensor \"", names[i], "\" of step ",
                     reader.step(), " is ", std::string(DTypeName(info->dtype)),
                     " but its destination is ", DTypeNameOf(dst.scalar_type()));
    TORCH_CHECK_VALUE(std::equal(info->shape.begin(), info->shape.end(), dst.sizes().begin(),
                                 dst.sizes().end()),
                      "ckpt: tensor \"", names[i], "\" of step ", reader.step(),
                      " has shape ", c10::IntArrayRef(info->shape),
                      " but its destination has shape ", dst.sizes());
    if (info->raw_bytes == 0) continue;
    if (dst.is_cuda()) {
      device_targets.push_back(DeviceTarget{names[i], dst, info->raw_bytes});
      continue;
    }
    at::Tensor host = dst;
    if (!dst.is_cpu() || !dst.is_contiguous()) {
      host = at::empty(dst.sizes(), dst.options().device(c10::kCPU));
      copies.emplace_back(host, dst);
    }
    targets.push_back(ReadTarget{names[i], host.data_ptr(), info->raw_bytes});
  }
  absl::Status status = reader.ReadInto(targets);
  if (status.ok()) status = ReadIntoDevice(reader, device_targets);
  if (!status.ok()) return status;
  for (auto& [host, dst] : copies) dst.copy_(host);
  return absl::OkStatus();
}

}  // namespace

std::vector<int64_t> ListSteps(const std::string& root) {
  auto steps = ckpt::ListSteps(root);
  ThrowIfError(steps.status(), absl::StrCat("ckpt: list ", root, ": "));
  return std::move(*steps);
}

ReadResult ReadStep(const std::string& root, std::optional<int64_t> step,
                    std::optional<int64_t> rank) {
  std::vector<Tensor> read;
  std::string extras;
  std::vector<std::string> skipped;
  const int64_t chosen = ReadNewest(
      root, step, Rank(rank),
      [&](Reader& reader) {
        auto all = reader.ReadAll();
        if (!all.ok()) return all.status();
        read = std::move(*all);
        extras = reader.extras_json();
        return absl::OkStatus();
      },
      &skipped);
  std::vector<std::string> names;
  std::vector<at::Tensor> tensors;
  names.reserve(read.size());
  tensors.reserve(read.size());
  for (Tensor& t : read) {
    names.push_back(t.name);
    tensors.push_back(FromCkptTensor(std::move(t)));
  }
  return {chosen, std::move(names), std::move(tensors), std::move(extras), std::move(skipped)};
}

std::tuple<int64_t, std::string, std::vector<std::string>> ReadIntoStep(
    const std::string& root, std::optional<int64_t> step, const std::vector<std::string>& names,
    at::TensorList tensors, std::optional<int64_t> rank) {
  TORCH_CHECK_VALUE(names.size() == tensors.size(), "ckpt: read_into got ", names.size(),
                    " names but ", tensors.size(), " tensors");
  std::string extras;
  std::vector<std::string> skipped;
  const int64_t chosen = ReadNewest(
      root, step, Rank(rank),
      [&](Reader& reader) {
        absl::Status status = FillInto(reader, root, names, tensors);
        if (status.ok()) extras = reader.extras_json();
        return status;
      },
      &skipped);
  return {chosen, std::move(extras), std::move(skipped)};
}

namespace {

// ReadRegionsStep on an open reader; `context` prefixes a failed read.
void ReadRegions(Reader& reader, const std::string& root, const std::vector<std::string>& names,
                 const std::vector<std::vector<int64_t>>& offsets, at::TensorList tensors,
                 const std::string& context) {
  TORCH_CHECK_VALUE(names.size() == tensors.size() && names.size() == offsets.size(),
                    "ckpt: read_regions got ", names.size(), " names, ", offsets.size(),
                    " offsets and ", tensors.size(), " tensors");
  const int64_t step = reader.step();
  // As in ReadIntoStep: CPU-contiguous destinations are filled in place,
  // others through a CPU temporary copied over once every read verified.
  std::vector<RegionTarget> targets;
  std::vector<std::pair<at::Tensor, at::Tensor>> copies;  // (temporary, destination)
  for (size_t i = 0; i < names.size(); ++i) {
    const at::Tensor& dst = tensors[i];
    const TensorInfo* info = reader.Find(names[i]);
    TORCH_CHECK_VALUE(info != nullptr, "ckpt: step ", step, " in ", root, " has no tensor \"",
                      names[i], "\"");
    TORCH_CHECK_VALUE(dst.defined() && dst.layout() == c10::kStrided, "ckpt: destination of \"",
                      names[i], "\" is not a dense tensor");
    std::optional<DType> dtype = ToCkptDType(dst.scalar_type());
    TORCH_CHECK_TYPE(dtype == info->dtype, "ckpt: tensor \"", names[i], "\" of step ", step, " is ",
                     std::string(DTypeName(info->dtype)), " but its destination is ",
                     DTypeNameOf(dst.scalar_type()));
    const size_t dims = info->shape.size();
    TORCH_CHECK_VALUE(offsets[i].size() == dims && static_cast<size_t>(dst.dim()) == dims,
                      "ckpt: tensor \"", names[i], "\" of step ", step, " has shape ",
                      c10::IntArrayRef(info->shape), ": a box of it needs ", dims,
                      " offsets and a destination of ", dims, " dimensions, got offsets ",
                      c10::IntArrayRef(offsets[i]), " and shape ", dst.sizes());
    for (size_t d = 0; d < dims; ++d) {
      TORCH_CHECK_VALUE(offsets[i][d] >= 0 && offsets[i][d] + dst.size(d) <= info->shape[d],
                        "ckpt: the box at ", c10::IntArrayRef(offsets[i]), " of shape ",
                        dst.sizes(), " lies outside tensor \"", names[i], "\" of step ", step,
                        " (shape ", c10::IntArrayRef(info->shape), ")");
    }
    if (dst.numel() == 0) continue;
    at::Tensor host = dst;
    if (!dst.is_cpu() || !dst.is_contiguous()) {
      host = at::empty(dst.sizes(), dst.options().device(c10::kCPU));
      copies.emplace_back(host, dst);
    }
    targets.push_back(RegionTarget{names[i], offsets[i],
                                   std::vector<int64_t>(dst.sizes().begin(), dst.sizes().end()),
                                   host.data_ptr(),
                                   static_cast<size_t>(host.numel() * host.element_size())});
  }
  ThrowIfError(reader.ReadRegions(targets), context);
  for (auto& [host, dst] : copies) dst.copy_(host);
}

std::string DescribeReader(const Reader& reader) {
  nlohmann::json tensors = nlohmann::json::array();
  for (const TensorInfo& t : reader.tensors()) {
    nlohmann::json j = nlohmann::json::parse(TensorInfoJson(t));
    if (!j.contains("placement")) j["placement"] = std::string(TensorPlacementName(t.placement));
    if (!j.contains("rank")) j["rank"] = t.rank;
    tensors.push_back(std::move(j));
  }
  nlohmann::json out{{"step", reader.step()},
                     {"dir", reader.dir()},
                     {"world_size", reader.world_size()},
                     {"rank", reader.rank()},
                     {"extras", nlohmann::json::parse(reader.extras_json(), nullptr, false)},
                     {"tensors", std::move(tensors)}};
  return out.dump();
}

}  // namespace

int64_t ReadRegionsStep(const std::string& root, int64_t step, const std::vector<std::string>& names,
                        const std::vector<std::vector<int64_t>>& offsets, at::TensorList tensors,
                        std::optional<int64_t> rank) {
  TORCH_CHECK_VALUE(step >= 0, "ckpt: read_regions needs a step >= 0, got ", step);
  std::unique_ptr<Reader> reader = OpenOrThrow(root, step, Rank(rank));
  ReadRegions(*reader, root, names, offsets, tensors,
              absl::StrCat("ckpt: load step ", step, " from ", root, OfRank(Rank(rank)), ": "));
  return static_cast<int64_t>(reader->bytes_read());
}


std::string DescribeStep(const std::string& root, std::optional<int64_t> step,
                         std::optional<int64_t> rank) {
  if (step.has_value() && *step < 0) step.reset();
  return DescribeReader(*OpenOrThrow(root, step, Rank(rank)));
}

void VerifyStep(const std::string& root, int64_t step, std::optional<int64_t> rank) {
  std::unique_ptr<Reader> reader = OpenOrThrow(root, step, Rank(rank));
  ThrowIfError(reader->Verify(),
               absl::StrCat("ckpt: verify step ", step, " in ", root, OfRank(Rank(rank)), ": "));
}

StepReaderHolder::StepReaderHolder(const std::string& root, int64_t step, int64_t rank)
    : root_(root) {
  TORCH_CHECK_VALUE(step >= 0, "ckpt: StepReader needs a step >= 0, got ", step);
  TORCH_CHECK_VALUE(rank >= -1, "ckpt: StepReader's rank must be >= 0 (or -1: all of it), got ", rank);
  if (rank >= 0) rank_ = Rank(rank);
  reader_ = OpenOrThrow(root, step, rank_);
}

std::string StepReaderHolder::Context() const {
  return absl::StrCat("ckpt: load step ", reader_->step(), " from ", root_, OfRank(rank_), ": ");
}

void StepReaderHolder::ReadInto(const std::vector<std::string>& names, at::TensorList tensors) {
  TORCH_CHECK_VALUE(names.size() == tensors.size(), "ckpt: StepReader.read_into got ", names.size(),
                    " names but ", tensors.size(), " tensors");
  ThrowIfError(FillInto(*reader_, root_, names, tensors), Context());
}

std::string StepReaderHolder::Describe() const { return DescribeReader(*reader_); }

int64_t StepReaderHolder::ReadRegions(const std::vector<std::string>& names,
                                      const std::vector<std::vector<int64_t>>& offsets,
                                      at::TensorList tensors) {
  ::ckpt::torch_ext::ReadRegions(*reader_, root_, names, offsets, tensors, Context());
  return bytes_read();
}

std::vector<at::Tensor> StepReaderHolder::ReadNew(const std::vector<std::string>& names) {
  auto read = reader_->ReadNamed(names);
  ThrowIfError(read.status(), Context());
  std::vector<at::Tensor> tensors;
  tensors.reserve(read->size());
  for (Tensor& t : *read) tensors.push_back(FromCkptTensor(std::move(t)));
  return tensors;
}

NewestFirstHolder::NewestFirstHolder(const std::string& root) : root_(root) {
  auto walk = NewestFirst::Start(root);
  ThrowIfError(walk.status(), absl::StrCat("ckpt: load from ", root, ": "));
  walk_.emplace(std::move(*walk));
}

void NewestFirstHolder::Skip(int64_t step, const std::string& code, const std::string& message) {
  absl::StatusCode parsed = absl::StatusCode::kUnknown;
  for (int c = 1; c <= static_cast<int>(absl::StatusCode::kUnauthenticated); ++c) {
    if (absl::StatusCodeToString(static_cast<absl::StatusCode>(c)) == code) {
      parsed = static_cast<absl::StatusCode>(c);
    }
  }
  walk_->Skip(step, absl::Status(parsed, message));
}

void NewestFirstHolder::RaiseNoneLeft() const {
  ThrowIfError(walk_->NoneLeft(), absl::StrCat("ckpt: load from ", root_, ": "));
}

}  // namespace ckpt::torch_ext
