#include "testing/fault_injection_transport.h"

#include "absl/strings/str_cat.h"

namespace ckpt::testing {

const char* TransportFaultName(TransportFault fault) {
  switch (fault) {
    case TransportFault::kNone: return "none";
    case TransportFault::kFail: return "fail";
    case TransportFault::kLoseResponse: return "lose-response";
    case TransportFault::kCorruptBody: return "corrupt-body";
    case TransportFault::kCrash: return "crash";
  }
  return "?";
}

absl::StatusOr<HttpResponse> FaultInjectionTransport::Send(const HttpRequest& request) {
  const uint64_t n = count_++;
  TransportFault fault = TransportFault::kNone;
  {
    std::lock_guard<std::mutex> lock(mu_);
    log_.push_back(absl::StrCat(request.method, " ", request.url));
    if (n == index_) fault = fault_;
  }
  if (fault != TransportFault::kNone) fired_ = true;
  if (fault == TransportFault::kCrash) crashed_ = true;
  if (crashed_) return absl::UnavailableError("injected: the job is dead (crash)");
  switch (fault) {
    case TransportFault::kFail:
      return absl::UnavailableError(absl::StrCat("injected: request ", n, " failed unsent"));
    case TransportFault::kLoseResponse: {
      (void)base_->Send(request);
      return absl::UnavailableError(absl::StrCat("injected: response to request ", n, " lost"));
    }
    case TransportFault::kCorruptBody: {
      if (!request.body.empty()) {
        std::string body(request.body.data(), request.body.size());
        body[body.size() / 2] ^= 0x10;
        HttpRequest copy = request;
        copy.body = body;
        return base_->Send(copy);
      }
      auto response = base_->Send(request);
      if (response.ok()) {
        if (response->sink_bytes > 0) {
          request.sink[response->sink_bytes / 2] ^= 0x10;
        } else if (!response->body.empty()) {
          response->body[response->body.size() / 2] ^= 0x10;
        }
      }
      return response;
    }
    default:
      return base_->Send(request);
  }
}

}  // namespace ckpt::testing
