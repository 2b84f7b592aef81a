// maintenance_ops.cc: `torch.ops.ckpt.checkpoint_bases` and
// `torch.ops.ckpt.remove_checkpoint`, over ckpt/catalog.h and
// ckpt/maintenance.h: what integrations that delete checkpoints (Lightning's
// top-k) need to keep every delta chain whole; and the uploads behind the
// save (`publish_checkpoint`; with a process group `publish_part`,
// `commit_published_parts` and `TierLease`), over ckpt/object_tier.h.
#include <cstdint>
#include <string>
#include <unistd.h>
#include <tuple>
#include <vector>

#include <nlohmann/json.hpp>
#include <torch/custom_class.h>
#include <torch/library.h>

#include "absl/strings/str_cat.h"
#include "ckpt/catalog.h"
#include "ckpt/maintenance.h"
#include "ckpt/object_store.h"
#include "ckpt/object_tier.h"
#include "torch_status.h"

namespace ckpt::torch_ext {
namespace {

// The committed steps of `root`, ascending, and for each the step its delta
// applies to (-1: a full checkpoint; -2: a manifest that does not read back,
// whose base is unknown).
std::tuple<std::vector<int64_t>, std::vector<int64_t>> CheckpointBasesOp(std::string root) {
  auto listed = ListCheckpoints(root);
  ThrowIfError(listed.status(), absl::StrCat("ckpt: list ", root, ": "));
  std::vector<int64_t> steps, bases;
  for (const CheckpointSummary& c : *listed) {
    steps.push_back(c.step);
    bases.push_back(!c.manifest_status.ok() ? -2 : c.kind == CheckpointKind::kDelta ? c.base_step : -1);
  }
  return {std::move(steps), std::move(bases)};
}

void RemoveCheckpointOp(std::string root, int64_t step) {
  ThrowIfError(RemoveCheckpoint(root, step), absl::StrCat("ckpt: remove step ", step, " of ", root, ": "));
}

// The bucket and prefix of `url`, and a store for it.
struct OpenedUrl {
  ObjectUrl url;
  std::shared_ptr<ObjectStore> store;
};
OpenedUrl OpenUrl(const std::string& url, int64_t max_send_bytes_per_second, const std::string& what) {
  auto parsed = ParseObjectUrl(url);
  ThrowIfError(parsed.status(), what);
  ObjectStoreOptions options;
  options.max_send_bytes_per_second = max_send_bytes_per_second;
  auto store = OpenObjectStore(url, options);
  ThrowIfError(store.status(), what);
  return {*parsed, *store};
}

PublishOptions Publishing(int64_t streams, int64_t part_bytes, std::string storage_class) {
  PublishOptions publish;
  publish.storage_class = std::move(storage_class);
  publish.streams = static_cast<int>(streams);
  publish.part_bytes = static_cast<uint64_t>(part_bytes);
  return publish;
}

// Publishes committed step `step` of `root` to the bucket prefix `url`
// (ckpt/object_tier.h), holding the prefix's lease meanwhile: what
// `Checkpointer(root, tier=url)` runs behind the saves. Returns the files and
// bytes sent and whether the step was already there.
std::tuple<int64_t, int64_t, bool> PublishCheckpointOp(std::string root, int64_t step, std::string url,
                                                       int64_t streams, int64_t part_bytes,
                                                       int64_t max_send_bytes_per_second,
                                                       std::string storage_class) {
  const std::string what = absl::StrCat("ckpt: upload of step ", step, " to ", url, ": ");
  OpenedUrl opened = OpenUrl(url, max_send_bytes_per_second, what);
  auto lease = ObjectLease::Acquire(opened.store, opened.url.prefix,
                                    absl::StrCat("ckpt Checkpointer pid ", getpid(), " for ", root),
                                    absl::Hours(1));
  ThrowIfError(lease.status(), what);
  auto stats = PublishCheckpoint(root, step, *opened.store, opened.url.prefix,
                                 Publishing(streams, part_bytes, std::move(storage_class)));
  ThrowIfError(stats.status(), what);
  return {static_cast<int64_t>(stats->files), static_cast<int64_t>(stats->bytes), stats->already_there};
}

// Rank `part`'s files of multi-rank step `step` (PublishOptions::part; with
// `own_copy`, `root` is that rank's own copy: PublishOptions::copy_of), as
// JSON {"files": [{"name", "bytes", "xxh3"}], "bytes", "already_there"} for
// commit_published_parts. Takes no lease: the rank that commits holds it.
std::string PublishPartOp(std::string root, int64_t step, std::string url, int64_t part, int64_t streams,
                          int64_t part_bytes, int64_t max_send_bytes_per_second,
                          std::string storage_class, bool own_copy) {
  const std::string what = absl::StrCat("ckpt: upload of rank ", part, "'s part of step ", step, " to ", url, ": ");
  OpenedUrl opened = OpenUrl(url, max_send_bytes_per_second, what);
  PublishOptions publish = Publishing(streams, part_bytes, std::move(storage_class));
  publish.part = static_cast<int>(part);
  if (own_copy) publish.copy_of = publish.part;
  auto stats = PublishCheckpoint(root, step, *opened.store, opened.url.prefix, publish);
  ThrowIfError(stats.status(), what);
  nlohmann::json files = nlohmann::json::array();
  for (const CommitMarker::File& f : stats->published) {
    files.push_back({{"name", f.name}, {"bytes", f.bytes}, {"xxh3", f.xxh3}});
  }
  return nlohmann::json{{"files", std::move(files)}, {"bytes", stats->bytes},
                        {"already_there", stats->already_there}}
      .dump();
}

// The rest of multi-rank step `step` and its marker (CommitPublishedParts),
// given the ranks' publish_part results' files (a JSON list of them);
// `copy_of` >= 0: `root` is that rank's own copy (PublishOptions::copy_of).
std::tuple<int64_t, int64_t, bool> CommitPublishedPartsOp(std::string root, int64_t step, std::string url,
                                                          std::string published_json, int64_t streams,
                                                          int64_t part_bytes,
                                                          int64_t max_send_bytes_per_second,
                                                          std::string storage_class, int64_t copy_of) {
  const std::string what = absl::StrCat("ckpt: commit of step ", step, " in ", url, ": ");
  const nlohmann::json parsed = nlohmann::json::parse(published_json, nullptr, /*allow_exceptions=*/false);
  TORCH_CHECK_VALUE(parsed.is_array(), what, "the published files are not a JSON list");
  std::vector<CommitMarker::File> published;
  for (const nlohmann::json& f : parsed) {
    TORCH_CHECK_VALUE(f.is_object() && f.contains("name") && f["name"].is_string() && f.contains("bytes") &&
                          f["bytes"].is_number_unsigned() && f.contains("xxh3") && f["xxh3"].is_number_unsigned(),
                      what, "a published file is not {name, bytes, xxh3}: ", f.dump());
    published.push_back(CommitMarker::File{f["name"].get<std::string>(), f["bytes"].get<uint64_t>(),
                                           f["xxh3"].get<uint64_t>()});
  }
  OpenedUrl opened = OpenUrl(url, max_send_bytes_per_second, what);
  PublishOptions publish = Publishing(streams, part_bytes, std::move(storage_class));
  if (copy_of >= 0) publish.copy_of = static_cast<int>(copy_of);
  auto stats = CommitPublishedParts(root, step, *opened.store, opened.url.prefix, published, publish);
  ThrowIfError(stats.status(), what);
  return {static_cast<int64_t>(stats->files), static_cast<int64_t>(stats->bytes), stats->already_there};
}

// Raises (ValueError) unless `storage_class` may be given to uploads
// (CheckStorageClass).
void CheckStorageClassOp(std::string storage_class) {
  const absl::Status s = CheckStorageClass(storage_class);
  TORCH_CHECK_VALUE(s.ok(), s.message());
}

// `torch.classes.ckpt.TierLease(url, owner, seconds)`: the bucket prefix's
// lease (ObjectLease), held until release() or the object goes: what a
// multi-rank upload holds from before its ranks publish until its marker.
class TierLeaseHolder : public torch::CustomClassHolder {
 public:
  TierLeaseHolder(const std::string& url, const std::string& owner, double seconds) {
    const std::string what = absl::StrCat("ckpt: lease of ", url, ": ");
    OpenedUrl opened = OpenUrl(url, 0, what);
    auto lease = ObjectLease::Acquire(opened.store, opened.url.prefix, owner, absl::Seconds(seconds));
    ThrowIfError(lease.status(), what);
    lease_ = std::move(*lease);
  }
  void Release() { lease_.reset(); }

 private:
  std::unique_ptr<ObjectLease> lease_;
};

}  // namespace
}  // namespace ckpt::torch_ext

TORCH_LIBRARY_FRAGMENT(ckpt, m) {
  using namespace ckpt::torch_ext;
  m.def("checkpoint_bases(str root) -> (int[], int[])", CheckpointBasesOp);
  m.def("remove_checkpoint(str root, int step) -> ()", RemoveCheckpointOp);
  m.def("publish_checkpoint(str root, int step, str url, int streams, int part_bytes, "
        "int max_send_bytes_per_second, str storage_class=\"\") -> (int, int, bool)",
        PublishCheckpointOp);
  m.def("publish_part(str root, int step, str url, int part, int streams, int part_bytes, "
        "int max_send_bytes_per_second, str storage_class=\"\", bool own_copy=False) -> str",
        PublishPartOp);
  m.def("commit_published_parts(str root, int step, str url, str published_json, int streams, "
        "int part_bytes, int max_send_bytes_per_second, str storage_class=\"\", int copy_of=-1) -> "
        "(int, int, bool)",
        CommitPublishedPartsOp);
  m.def("check_storage_class(str storage_class) -> ()", CheckStorageClassOp);
  m.class_<TierLeaseHolder>("TierLease")
      .def(torch::init<std::string, std::string, double>())
      .def("release", &TierLeaseHolder::Release);
}
