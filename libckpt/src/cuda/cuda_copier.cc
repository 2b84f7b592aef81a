// `NewCudaCopier` for builds with the CUDA toolkit: device->host copies on a
// non-blocking side stream per device, ordered after the caller's stream by
// events, awaited by events. Nothing here synchronizes a whole device.
//
// Ordering after the caller's stream ("fencing"): `MarkCallerStreams`, on
// the caller's thread when a save starts, records an event on each of the
// save's (device, stream) pairs. The save's first copy from a pair makes the
// device's side stream wait for that event, so every copy of the save is
// ordered after the work the caller had queued when it called `SaveAsync` —
// not after what it queued later (a lazily staged save is copied while the
// caller's next forward pass is being queued; waiting for it would serialize
// the copy behind the compute). Without a mark covering the pair, the first
// copy records a fresh event on the caller's stream instead. A pair stays
// fenced until the copier next runs dry (every token recorded so far has
// been waited for, which the stager does at the end of every save), the
// mark changes, or a call fails.
//
// Copies: the stager hands over pieces of up to 512 KiB, in order. Pieces
// whose source and destination continue each other within one device
// allocation are merged (`CopyCoalescer`; where an allocation ends comes
// from the driver's `cuMemGetAddressRange`) into copies of up to
// `kMaxCopyBytes`: a D2H copy of 1 MiB runs at ~90 % of the link's rate, one
// of 32 MiB at ~99 %. A token (`Record`) taken while a merged copy is still
// being built does not cut it: its events are recorded once that copy is
// issued, and `WaitFor` issues it if it has not been.
#include <cuda.h>  // the driver API's types; its functions come through cudart
#include <cuda_runtime_api.h>

#include <deque>
#include <memory>
#include <span>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "staging/copy_coalescer.h"
#include "staging/device_copier.h"
#include "util/status_macros.h"

namespace ckpt::internal {
namespace {

// Copies are merged up to this size (see the top of the file).
constexpr size_t kMaxCopyBytes = size_t{32} << 20;

using GetAddressRangeFn = CUresult (*)(CUdeviceptr* base, size_t* size, CUdeviceptr address);

// The driver's `cuMemGetAddressRange`, reached through the runtime (the
// library links no driver library: a machine without one must load it), or
// null when the driver does not offer it.
GetAddressRangeFn LoadGetAddressRange() {
  void* fn = nullptr;
  cudaDriverEntryPointQueryResult found = cudaDriverEntryPointSymbolNotFound;
  cudaError_t err = cudaGetDriverEntryPointByVersion("cuMemGetAddressRange", &fn, 12000,
                                                     cudaEnableDefault, &found);
  if (err != cudaSuccess || found != cudaDriverEntryPointSuccess) {
    (void)cudaGetLastError();
    return nullptr;
  }
  return reinterpret_cast<GetAddressRangeFn>(fn);
}

// An error from `call`, with CUDA's name and text for `err`. Clears the
// thread's last-error slot so the caller's own error checks do not see it.
absl::Status CudaError(cudaError_t err, absl::string_view call) {
  (void)cudaGetLastError();
  absl::StatusCode code = absl::StatusCode::kInternal;
  switch (err) {
    case cudaErrorInvalidValue:
    case cudaErrorInvalidDevice:
    case cudaErrorInvalidResourceHandle:
      code = absl::StatusCode::kInvalidArgument;
      break;
    case cudaErrorNoDevice:
    case cudaErrorInsufficientDriver:
      code = absl::StatusCode::kUnavailable;
      break;
    default:
      break;
  }
  return absl::Status(code, absl::StrCat(call, ": ", cudaGetErrorString(err), " (",
                                         cudaGetErrorName(err), ")"));
}

absl::Status Check(cudaError_t err, absl::string_view call) {
  return err == cudaSuccess ? absl::OkStatus() : CudaError(err, call);
}

// Makes a device current for its scope, restoring the caller's current
// device on destruction (only if it had to switch).
class ScopedDevice {
 public:
  ScopedDevice() = default;
  ScopedDevice(const ScopedDevice&) = delete;
  ScopedDevice& operator=(const ScopedDevice&) = delete;
  ~ScopedDevice() {
    if (switched_) (void)cudaSetDevice(previous_);
  }

  absl::Status Use(int device) {
    int current = 0;
    CKPT_RETURN_IF_ERROR(Check(cudaGetDevice(&current), "cudaGetDevice"));
    if (current == device) return absl::OkStatus();
    if (!switched_) previous_ = current;
    CKPT_RETURN_IF_ERROR(Check(cudaSetDevice(device), absl::StrCat("cudaSetDevice(", device, ")")));
    switched_ = true;
    return absl::OkStatus();
  }

 private:
  int previous_ = 0;
  bool switched_ = false;
};

// Events recorded on caller streams; destroying them while a side stream
// still waits on one is allowed (CUDA releases it once it completes).
class CudaStreamMark final : public CallerStreamMark {
 public:
  struct Entry {
    DeviceStream stream;
    cudaEvent_t event = nullptr;
  };
  ~CudaStreamMark() override {
    for (const Entry& e : entries) (void)cudaEventDestroy(e.event);
  }
  cudaEvent_t Find(int device, cudaStream_t stream) const {
    for (const Entry& e : entries) {
      if (e.stream.device == device && e.stream.stream == stream) return e.event;
    }
    return nullptr;
  }
  std::vector<Entry> entries;
};

class CudaCopier final : public DeviceCopier {
 public:
  explicit CudaCopier(int device_count) : devices_(device_count) {}

  // Waits for this copier's own streams (never the device), then frees them.
  ~CudaCopier() override {
    ScopedDevice scope;
    for (size_t d = 0; d < devices_.size(); ++d) {
      DeviceState& state = devices_[d];
      if (state.side == nullptr) continue;
      if (!scope.Use(static_cast<int>(d)).ok()) continue;
      (void)cudaStreamSynchronize(state.side);
      for (cudaEvent_t e : state.free_events) (void)cudaEventDestroy(e);
      (void)cudaEventDestroy(state.fence);
      (void)cudaStreamDestroy(state.side);
    }
    for (const Token& t : outstanding_) {
      for (const auto& [device, event] : t.events) (void)cudaEventDestroy(event);
    }
    (void)cudaGetLastError();
  }

  // Touches no copier state: safe beside the stager.
  absl::StatusOr<std::unique_ptr<CallerStreamMark>> MarkCallerStreams(
      std::span<const DeviceStream> streams) override {
    auto mark = std::make_unique<CudaStreamMark>();
    ScopedDevice scope;
    for (const DeviceStream& ds : streams) {
      if (ds.device < 0 || ds.device >= static_cast<int>(devices_.size())) {
        return absl::InvalidArgumentError(absl::StrCat(
            "CUDA device ", ds.device, " does not exist (", devices_.size(), " visible)"));
      }
      CKPT_RETURN_IF_ERROR(scope.Use(ds.device));
      cudaEvent_t event = nullptr;
      CKPT_RETURN_IF_ERROR(Check(cudaEventCreateWithFlags(&event, cudaEventDisableTiming),
                                 absl::StrCat("cudaEventCreateWithFlags (CUDA device ", ds.device, ")")));
      mark->entries.push_back({ds, event});
      cudaError_t err = cudaEventRecord(event, static_cast<cudaStream_t>(ds.stream));
      if (err != cudaSuccess) {
        return CudaError(err, absl::StrFormat("cudaEventRecord on the caller's stream %p (CUDA device %d)",
                                              ds.stream, ds.device));
      }
    }
    return std::unique_ptr<CallerStreamMark>(std::move(mark));
  }

  absl::Status CopyAsync(void* dst, const void* src, size_t n, int device, void* caller_stream,
                         const CallerStreamMark* mark) override {
    if (n == 0) return absl::OkStatus();
    if (mark != fenced_mark_) {
      ForgetFences();  // another save: fence its streams again
      fenced_mark_ = mark;
    }
    if (device < 0 || device >= static_cast<int>(devices_.size())) {
      return absl::InvalidArgumentError(absl::StrCat(
          "CUDA device ", device, " does not exist (", devices_.size(), " visible)"));
    }
    absl::Status s = Enqueue(static_cast<char*>(dst), static_cast<const char*>(src), n, device,
                             static_cast<cudaStream_t>(caller_stream),
                             static_cast<const CudaStreamMark*>(mark));
    if (!s.ok()) ForgetFences();
    return s;
  }

  absl::StatusOr<uint64_t> Record() override {
    const uint64_t token = next_token_++;
    outstanding_.push_back(Token{token, token, {}});
    ++unresolved_;
    // A copy still being merged settles this token once it is issued.
    if (coalescer_.has_pending()) return token;
    absl::Status s = ResolveTokens();
    if (!s.ok()) {
      ForgetFences();
      return s;
    }
    return token;
  }

  absl::Status WaitFor(uint64_t token) override {
    if (token >= next_token_) {
      return absl::InvalidArgumentError(
          absl::StrCat("WaitFor(", token, "): no such token was recorded"));
    }
    absl::Status s;
    if (unresolved_ > 0 && token >= outstanding_[outstanding_.size() - unresolved_].token) {
      s = Issue();  // the copy this token waits for is still being merged
      if (s.ok() && unresolved_ > 0) s = ResolveTokens();
    }
    uint64_t last = token;  // the token whose events cover `token`
    for (const Token& t : outstanding_) {
      if (t.token == token) last = t.settled_by;
    }
    while (s.ok() && !outstanding_.empty() && outstanding_.front().token <= last) {
      Token& t = outstanding_.front();
      for (const auto& [device, event] : t.events) {
        cudaError_t err = cudaEventSynchronize(event);
        if (err != cudaSuccess) {
          s = CudaError(err, absl::StrCat("cudaEventSynchronize (copies from CUDA device ", device, ")"));
          break;
        }
      }
      if (!s.ok()) break;
      for (const auto& [device, event] : t.events) devices_[device].free_events.push_back(event);
      outstanding_.pop_front();
    }
    if (!s.ok()) {
      // The copies behind a failed event are lost; forget them (their events
      // are destroyed, not reused) so later saves start afresh.
      for (const Token& t : outstanding_) {
        for (const auto& [device, event] : t.events) (void)cudaEventDestroy(event);
      }
      outstanding_.clear();
      unresolved_ = 0;
      (void)coalescer_.Flush();
      (void)cudaGetLastError();
    }
    if (outstanding_.empty()) ForgetFences();  // run dry: the next copy fences again
    return s;
  }

 private:
  struct DeviceState {
    cudaStream_t side = nullptr;  // non-blocking: no implicit sync with stream 0
    cudaEvent_t fence = nullptr;  // recorded on caller streams
    std::vector<cudaEvent_t> free_events;
    bool dirty = false;  // copies issued since events were last recorded
  };
  // A `Record()` token. Once settled, `settled_by` names the token whose
  // events follow every copy queued before it (itself, or a later token
  // taken while the same merged copy was being built), and `events` holds
  // the events recorded for it, one per side stream used since the token
  // before it.
  struct Token {
    uint64_t token = 0;
    uint64_t settled_by = 0;
    std::vector<std::pair<int, cudaEvent_t>> events;
  };

  absl::Status Enqueue(char* dst, const char* src, size_t n, int device, cudaStream_t stream,
                       const CudaStreamMark* mark) {
    if (!IsFenced(device, stream)) {
      CKPT_RETURN_IF_ERROR(Issue());  // earlier pieces need not wait for this stream
      CKPT_RETURN_IF_ERROR(Fence(device, stream, mark != nullptr ? mark->Find(device, stream) : nullptr));
    }
    return IssueCopy(coalescer_.Add(DeviceCopy{dst, src, n, device}));
  }

  // Where the device allocation holding `address` ends, from the driver.
  absl::StatusOr<uintptr_t> AllocationEnd(int device, const char* address) {
    if (get_address_range_ == nullptr) return absl::UnimplementedError("no cuMemGetAddressRange");
    ScopedDevice scope;
    CKPT_RETURN_IF_ERROR(scope.Use(device));
    CUdeviceptr base = 0;
    size_t size = 0;
    CUresult r = get_address_range_(&base, &size, reinterpret_cast<CUdeviceptr>(address));
    if (r != CUDA_SUCCESS) {
      return absl::NotFoundError(absl::StrCat("cuMemGetAddressRange: CUresult ", static_cast<int>(r)));
    }
    return static_cast<uintptr_t>(base) + size;
  }

  // Records events for the unsettled tokens: after every copy issued so
  // far, on each side stream used since the last events. The newest token
  // holds them; the others are settled by it.
  absl::Status ResolveTokens() {
    Token& newest = outstanding_.back();
    for (size_t d = 0; d < devices_.size(); ++d) {
      DeviceState& state = devices_[d];
      if (!state.dirty) continue;
      CKPT_ASSIGN_OR_RETURN(cudaEvent_t event, RecordOn(static_cast<int>(d)));
      newest.events.emplace_back(static_cast<int>(d), event);
      state.dirty = false;
    }
    for (size_t i = outstanding_.size() - unresolved_; i < outstanding_.size(); ++i) {
      outstanding_[i].settled_by = newest.token;
    }
    unresolved_ = 0;
    return absl::OkStatus();
  }

  void ForgetFences() {
    fenced_.clear();
    fenced_mark_ = nullptr;  // a later mark at the same address is a new one
  }

  bool IsFenced(int device, cudaStream_t stream) const {
    for (const auto& [d, s] : fenced_) {
      if (d == device && s == stream) return true;
    }
    return false;
  }

  // Orders `device`'s side stream after `marked` (an event recorded on
  // `stream` earlier), or when null after the work queued so far on `stream`
  // (REQUIRES: `stream` is null or belongs to `device`).
  absl::Status Fence(int device, cudaStream_t stream, cudaEvent_t marked) {
    ScopedDevice scope;
    CKPT_RETURN_IF_ERROR(scope.Use(device));
    CKPT_RETURN_IF_ERROR(Prepare(device));
    DeviceState& state = devices_[device];
    cudaEvent_t fence = marked;
    if (fence == nullptr) {
      fence = state.fence;
      cudaError_t err = cudaEventRecord(fence, stream);
      if (err != cudaSuccess) {
        return CudaError(err, absl::StrFormat("cudaEventRecord on the caller's stream %p (CUDA device %d)",
                                              static_cast<void*>(stream), device));
      }
    }
    cudaError_t err = cudaStreamWaitEvent(state.side, fence, 0);
    if (err != cudaSuccess) {
      return CudaError(err, absl::StrCat("cudaStreamWaitEvent (CUDA device ", device, ")"));
    }
    fenced_.emplace_back(device, stream);
    return absl::OkStatus();
  }

  // Creates `device`'s side stream and fence event on first use.
  // REQUIRES: `device` is current.
  absl::Status Prepare(int device) {
    DeviceState& state = devices_[device];
    if (state.side != nullptr) return absl::OkStatus();
    CKPT_RETURN_IF_ERROR(Check(cudaEventCreateWithFlags(&state.fence, cudaEventDisableTiming),
                               absl::StrCat("cudaEventCreateWithFlags (CUDA device ", device, ")")));
    cudaError_t err = cudaStreamCreateWithFlags(&state.side, cudaStreamNonBlocking);
    if (err != cudaSuccess) {
      (void)cudaEventDestroy(state.fence);
      state.fence = nullptr;
      state.side = nullptr;
      return CudaError(err, absl::StrCat("cudaStreamCreateWithFlags (CUDA device ", device, ")"));
    }
    return absl::OkStatus();
  }

  // Issues the copy being merged, if any.
  absl::Status Issue() { return IssueCopy(coalescer_.Flush()); }

  // Issues `copy` on its device's side stream; the tokens taken before it
  // are then settled.
  absl::Status IssueCopy(const std::optional<DeviceCopy>& copy) {
    if (!copy.has_value()) return absl::OkStatus();
    const DeviceCopy& p = *copy;
    ScopedDevice scope;
    CKPT_RETURN_IF_ERROR(scope.Use(p.device));
    DeviceState& state = devices_[p.device];
    cudaError_t err = cudaMemcpyAsync(p.dst, p.src, p.n, cudaMemcpyDeviceToHost, state.side);
    if (err != cudaSuccess) {
      return CudaError(err, absl::StrFormat("cudaMemcpyAsync of %d bytes from CUDA device %d memory %p to host",
                                            p.n, p.device, static_cast<const void*>(p.src)));
    }
    state.dirty = true;
    return unresolved_ > 0 ? ResolveTokens() : absl::OkStatus();
  }

  // Records a (free or new) event on `device`'s side stream.
  absl::StatusOr<cudaEvent_t> RecordOn(int device) {
    ScopedDevice scope;
    CKPT_RETURN_IF_ERROR(scope.Use(device));
    DeviceState& state = devices_[device];
    cudaEvent_t event = nullptr;
    if (!state.free_events.empty()) {
      event = state.free_events.back();
      state.free_events.pop_back();
    } else {
      CKPT_RETURN_IF_ERROR(Check(cudaEventCreateWithFlags(&event, cudaEventDisableTiming),
                                 absl::StrCat("cudaEventCreateWithFlags (CUDA device ", device, ")")));
    }
    cudaError_t err = cudaEventRecord(event, state.side);
    if (err != cudaSuccess) {
      (void)cudaEventDestroy(event);
      return CudaError(err, absl::StrCat("cudaEventRecord on the side stream (CUDA device ", device, ")"));
    }
    return event;
  }

  std::vector<DeviceState> devices_;  // by device index; streams made on first use
  std::vector<std::pair<int, cudaStream_t>> fenced_;  // (device, caller stream) pairs
  const CallerStreamMark* fenced_mark_ = nullptr;     // the mark `fenced_` was made with
  const GetAddressRangeFn get_address_range_ = LoadGetAddressRange();
  CopyCoalescer coalescer_{[this](int device, const char* p) { return AllocationEnd(device, p); },
                           kMaxCopyBytes};
  std::deque<Token> outstanding_;  // recorded, not yet waited for; in token order
  size_t unresolved_ = 0;          // the newest tokens of `outstanding_`, not yet settled
  uint64_t next_token_ = 1;
};

}  // namespace

absl::StatusOr<std::unique_ptr<DeviceCopier>> NewCudaCopier() {
  int count = 0;
  cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess) {
    (void)cudaGetLastError();
    return absl::UnavailableError(absl::StrCat("cudaGetDeviceCount: ", cudaGetErrorString(err),
                                               " (", cudaGetErrorName(err), ")"));
  }
  if (count == 0) return absl::UnavailableError("cudaGetDeviceCount: no CUDA device");
  return std::unique_ptr<DeviceCopier>(new CudaCopier(count));
}

}  // namespace ckpt::internal
