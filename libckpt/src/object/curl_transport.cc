// `CurlHttpTransport`: HttpTransport over libcurl's easy interface, one
// handle per request in flight, taken from a pool so that connections (and
// TLS sessions) are reused.
#include <curl/curl.h>

#include <cstring>
#include <mutex>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "ckpt/object_store.h"

namespace ckpt {
namespace {

struct Exchange {
  CURL* curl = nullptr;
  const HttpRequest* request = nullptr;
  HttpResponse* response = nullptr;
  size_t sent = 0;
  bool sink_overflow = false;
};

size_t OnHeader(char* data, size_t size, size_t n, void* user) {
  auto* x = static_cast<Exchange*>(user);
  absl::string_view line(data, size * n);
  // A new status line (after a 100 Continue, or a redirect) starts over.
  if (absl::StartsWith(line, "HTTP/")) x->response->headers.clear();
  const size_t colon = line.find(':');
  if (colon != absl::string_view::npos) {
    x->response->headers[absl::AsciiStrToLower(line.substr(0, colon))] =
        std::string(absl::StripAsciiWhitespace(line.substr(colon + 1)));
  }
  return size * n;
}

size_t OnBody(char* data, size_t size, size_t n, void* user) {
  auto* x = static_cast<Exchange*>(user);
  const size_t bytes = size * n;
  long status = 0;
  curl_easy_getinfo(x->curl, CURLINFO_RESPONSE_CODE, &status);
  std::span<char> sink = x->request->sink;
  if (!sink.empty() && status >= 200 && status < 300) {
    if (x->response->sink_bytes + bytes > sink.size()) {
      x->sink_overflow = true;
      return 0;
    }
    std::memcpy(sink.data() + x->response->sink_bytes, data, bytes);
    x->response->sink_bytes += bytes;
    return bytes;
  }
  x->response->body.append(data, bytes);
  return bytes;
}

size_t OnRead(char* out, size_t size, size_t n, void* user) {
  auto* x = static_cast<Exchange*>(user);
  const size_t left = x->request->body.size() - x->sent;
  const size_t bytes = std::min(left, size * n);
  std::memcpy(out, x->request->body.data() + x->sent, bytes);
  x->sent += bytes;
  return bytes;
}

int OnSeek(void* user, curl_off_t offset, int origin) {
  auto* x = static_cast<Exchange*>(user);
  if (origin != SEEK_SET || offset < 0 || static_cast<size_t>(offset) > x->request->body.size()) {
    return CURL_SEEKFUNC_FAIL;
  }
  x->sent = static_cast<size_t>(offset);
  return CURL_SEEKFUNC_OK;
}

class CurlTransport final : public HttpTransport {
 public:
  explicit CurlTransport(std::string ca_bundle) : ca_bundle_(std::move(ca_bundle)) {
    static std::once_flag once;
    std::call_once(once, [] { curl_global_init(CURL_GLOBAL_DEFAULT); });
  }
  ~CurlTransport() override {
    for (CURL* c : idle_) curl_easy_cleanup(c);
  }

  absl::StatusOr<HttpResponse> Send(const HttpRequest& request) override {
    CURL* curl = Take();
    HttpResponse response;
    Exchange x{curl, &request, &response};
    char error[CURL_ERROR_SIZE] = {0};
    curl_slist* headers = nullptr;
    for (const auto& [name, value] : request.headers) {
      headers = curl_slist_append(headers, absl::StrCat(name, ": ", value).c_str());
    }
    // No "Expect: 100-continue" round trip, no form content type on POST.
    headers = curl_slist_append(headers, "Expect:");
    headers = curl_slist_append(headers, "Content-Type:");
    headers = curl_slist_append(headers, "Accept:");
    curl_easy_setopt(curl, CURLOPT_URL, request.url.c_str());
    curl_easy_setopt(curl, CURLOPT_HTTPHEADER, headers);
    curl_easy_setopt(curl, CURLOPT_ERRORBUFFER, error);
    curl_easy_setopt(curl, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(curl, CURLOPT_HEADERFUNCTION, OnHeader);
    curl_easy_setopt(curl, CURLOPT_HEADERDATA, &x);
    curl_easy_setopt(curl, CURLOPT_WRITEFUNCTION, OnBody);
    curl_easy_setopt(curl, CURLOPT_WRITEDATA, &x);
    curl_easy_setopt(curl, CURLOPT_LOW_SPEED_LIMIT, request.low_speed_bytes);
    curl_easy_setopt(curl, CURLOPT_LOW_SPEED_TIME, request.low_speed_seconds);
    curl_easy_setopt(curl, CURLOPT_TIMEOUT, request.timeout_seconds);
    curl_easy_setopt(curl, CURLOPT_CONNECTTIMEOUT, 30L);
    if (!ca_bundle_.empty()) curl_easy_setopt(curl, CURLOPT_CAINFO, ca_bundle_.c_str());
    if (request.max_send_bytes_per_second > 0) {
      curl_easy_setopt(curl, CURLOPT_MAX_SEND_SPEED_LARGE,
                       static_cast<curl_off_t>(request.max_send_bytes_per_second));
    }
    if (request.method == "HEAD") {
      curl_easy_setopt(curl, CURLOPT_NOBODY, 1L);
    } else if (request.method == "PUT") {
      curl_easy_setopt(curl, CURLOPT_UPLOAD, 1L);
      // 1 MiB a read callback, not 64 KiB: fewer copies and sends per part.
      curl_easy_setopt(curl, CURLOPT_UPLOAD_BUFFERSIZE, 1L << 20);
      curl_easy_setopt(curl, CURLOPT_READFUNCTION, OnRead);
      curl_easy_setopt(curl, CURLOPT_READDATA, &x);
      curl_easy_setopt(curl, CURLOPT_SEEKFUNCTION, OnSeek);
      curl_easy_setopt(curl, CURLOPT_SEEKDATA, &x);
      curl_easy_setopt(curl, CURLOPT_INFILESIZE_LARGE,
                       static_cast<curl_off_t>(request.body.size()));
    } else if (request.method == "POST") {
      curl_easy_setopt(curl, CURLOPT_POST, 1L);
      curl_easy_setopt(curl, CURLOPT_POSTFIELDS, request.body.data());
      curl_easy_setopt(curl, CURLOPT_POSTFIELDSIZE_LARGE,
                       static_cast<curl_off_t>(request.body.size()));
    } else if (request.method != "GET") {
      curl_easy_setopt(curl, CURLOPT_CUSTOMREQUEST, request.method.c_str());
    }
    const CURLcode code = curl_easy_perform(curl);
    long status = 0;
    curl_easy_getinfo(curl, CURLINFO_RESPONSE_CODE, &status);
    curl_slist_free_all(headers);
    if (code != CURLE_OK) {
      // A handle that failed mid-transfer is not reused: its connection may
      // be in any state.
      curl_easy_cleanup(curl);
      if (x.sink_overflow) {
        return absl::DataLossError(absl::StrCat(request.method, " ", request.url,
                                                ": the server sent more bytes than asked for"));
      }
      return absl::UnavailableError(absl::StrCat(request.method, " ", request.url, ": ",
                                                 error[0] != 0 ? error : curl_easy_strerror(code)));
    }
    Give(curl);
    response.status = static_cast<int>(status);
    return response;
  }

 private:
  CURL* Take() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (!idle_.empty()) {
        CURL* c = idle_.back();
        idle_.pop_back();
        curl_easy_reset(c);
        return c;
      }
    }
    return curl_easy_init();
  }
  void Give(CURL* c) {
    std::lock_guard<std::mutex> lock(mu_);
    idle_.push_back(c);
  }

  const std::string ca_bundle_;
  std::mutex mu_;
  std::vector<CURL*> idle_;  // GUARDED_BY(mu_)
};

}  // namespace

std::shared_ptr<HttpTransport> CurlHttpTransport(const std::string& ca_bundle) {
  return std::make_shared<CurlTransport>(ca_bundle);
}

}  // namespace ckpt
