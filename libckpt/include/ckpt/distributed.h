// ckpt/distributed.h: one checkpoint written by many processes (ranks).
//
// Each rank opens its own `Engine` on the same ROOT (on a file system every
// rank sees: NFS, Lustre, CephFS, or a local one for ranks on one machine)
// with the same `DistributedOptions::world_size`, its own `rank`, and a
// `CoordinationStore` all ranks share. Every rank writes its own shard files
// and its own manifest into one temp directory, in parallel; rank 0 then
// writes the checkpoint's manifest, which lists every rank's, and renames the
// directory into place once. The checkpoint commits for all ranks or for
// none. See docs/distributed.md.
//
//   ckpt::EngineOptions options;
//   options.distributed.rank = rank;
//   options.distributed.world_size = world;
//   options.distributed.store = store;  // torch: c10d::Store (torch_ext)
//   options.distributed.key_prefix = "ckpt/run1";
//   auto engine = ckpt::Engine::Open("/shared/ckpt/run1", options);
//
// The coordination runs on the engine's background thread, through the
// store alone: it never issues a collective of a process group the training
// loop uses.
#ifndef CKPT_DISTRIBUTED_H_
#define CKPT_DISTRIBUTED_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace ckpt {

// The few key-value operations a multi-rank commit needs: what
// torch.distributed's c10d::Store offers. Keys and values are byte strings.
// An implementation is used from the engine's background threads -- the
// persister, and with a tier (ckpt/tier.h) the uploader, which may call at
// the same time -- while the training loop may use its own store.
class CoordinationStore {
 public:
  virtual ~CoordinationStore() = default;
  // Sets `key` to `value`, replacing any value it had.
  virtual absl::Status Set(const std::string& key, const std::string& value) = 0;
  // Waits until `key` exists and returns its value. kDeadlineExceeded when it
  // did not appear within `timeout` (the engine asks for at most 1 s at a
  // time and at least 1 ms); kUnavailable when the store cannot be reached
  // (its host process died).
  virtual absl::StatusOr<std::string> Get(const std::string& key, absl::Duration timeout) = 0;
  // Atomically sets `key` to `value` if it does not exist; returns the value
  // the key holds afterwards (`value`, or the one another rank set first).
  virtual absl::StatusOr<std::string> SetIfAbsent(const std::string& key,
                                                  const std::string& value) = 0;
};

// A store inside one process, for ranks that are threads (tests, tools).
std::shared_ptr<CoordinationStore> NewInProcessStore();

struct DistributedOptions {
  // This process's rank, 0 <= rank < world_size. Rank 0 commits.
  int rank = 0;
  // 1: a single-process engine (every other field is ignored).
  int world_size = 1;
  // Shared by all ranks; required when world_size > 1.
  std::shared_ptr<CoordinationStore> store;
  // Namespace of this engine's keys in `store`: the same on every rank, and
  // unique per root and per opening of it (torch_ext derives it from the
  // root and a count of the engines this process opened on it).
  std::string key_prefix = "ckpt";
  // How long a rank that has written its part waits for the others (rank 0:
  // for every rank's report; the others: for rank 0's decision). When it
  // passes, the save fails on every rank, naming the ranks that did not
  // report, and nothing is committed. Also bounds `Engine::Open`'s
  // handshake, which waits for every rank to open.
  absl::Duration commit_timeout = absl::Seconds(300);
  // Whether every rank opens the same directory, on a file system they all
  // share (the default). false: ranks on machines that share no file system
  // (node-local NVMe). Each rank then opens a directory of its own (two
  // ranks on one machine: two directories), takes its own writer lock, and
  // commits a local copy of each step that holds the checkpoint's manifest
  // and only its own part; rank 0 reads the other ranks' manifests from
  // their reports in `store` instead of the shared directory. The
  // checkpoint is whole only once every rank published its part to a
  // bucket (`PublishOptions::part`, then `CommitPublishedParts`;
  // docs/distributed.md, "Ranks that share no file system"). Every rank
  // must set the same value (checked at Open).
  bool shared_root = true;
};

// How a tensor of a multi-rank save is placed (`TensorView::placement`).
// Ignored by single-process engines.
enum class TensorPlacement : uint8_t {
  // The rank's own. The same name saved by two ranks must hold the same
  // dtype, shape and bytes, or the save fails naming both ranks.
  kDefault,
  // Identical on every rank (e.g. DDP parameters): written once, by one rank
  // (spread over the ranks by size). Every rank must declare the same names
  // with the same dtypes and shapes; the contents are not compared.
  kReplicated,
  // This rank's own, and other ranks may save the same name with other
  // contents (an RNG state, a data-loader position).
  kRankLocal,
  // One chunk of a global tensor (a DTensor's local shard): the view's
  // `global_shape` and `global_offset` say where it lies. Every rank saves
  // its own chunk under the global tensor's name; the chunks of one name
  // must agree on dtype and global shape, lie inside it, not overlap and
  // together cover it, or the save fails naming the tensor. A reader shows
  // the global tensor, and reads any region of it from the chunks that
  // overlap it (ckpt/reader.h, `ReadRegions`). A single-process engine
  // takes only a chunk that is its whole global tensor.
  kSharded,
};

// "default", "replicated", "rank_local": the names manifests use.
absl::string_view TensorPlacementName(TensorPlacement placement);
std::optional<TensorPlacement> ParseTensorPlacement(absl::string_view name);

}  // namespace ckpt

#endif  // CKPT_DISTRIBUTED_H_
