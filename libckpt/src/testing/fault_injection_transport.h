// FaultInjectionTransport: an HttpTransport that faults the Nth request
// under an ObjectStore, for the object tier's fault sweeps (the HTTP
// counterpart of FaultInjectionFileSystem).
#ifndef CKPT_TESTING_FAULT_INJECTION_TRANSPORT_H_
#define CKPT_TESTING_FAULT_INJECTION_TRANSPORT_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "ckpt/object_store.h"

namespace ckpt::testing {

enum class TransportFault {
  kNone,
  kFail,          // never sent: a connection error
  kLoseResponse,  // sent and applied by the server, then a connection error
  kCorruptBody,   // one byte of the request body (uploads) or response body
                  // (downloads) flipped; the rest goes through as is
  kCrash,         // this request and every later one fail unsent (the job died)
};
const char* TransportFaultName(TransportFault fault);

class FaultInjectionTransport final : public HttpTransport {
 public:
  explicit FaultInjectionTransport(std::shared_ptr<HttpTransport> base) : base_(std::move(base)) {}

  // Faults request number `index` (0-based, counted from construction).
  void Arm(uint64_t index, TransportFault fault) {
    std::lock_guard<std::mutex> lock(mu_);
    index_ = index;
    fault_ = fault;
  }
  // Requests seen so far; whether the armed fault was applied.
  uint64_t requests() const { return count_.load(); }
  bool fired() const { return fired_.load(); }
  // "METHOD url" of every request, in order.
  std::vector<std::string> log() const {
    std::lock_guard<std::mutex> lock(mu_);
    return log_;
  }

  absl::StatusOr<HttpResponse> Send(const HttpRequest& request) override;

 private:
  std::shared_ptr<HttpTransport> base_;
  mutable std::mutex mu_;
  uint64_t index_ = UINT64_MAX;           // GUARDED_BY(mu_)
  TransportFault fault_ = TransportFault::kNone;  // GUARDED_BY(mu_)
  std::vector<std::string> log_;          // GUARDED_BY(mu_)
  std::atomic<uint64_t> count_{0};
  std::atomic<bool> fired_{false};
  std::atomic<bool> crashed_{false};
};

}  // namespace ckpt::testing

#endif  // CKPT_TESTING_FAULT_INJECTION_TRANSPORT_H_
