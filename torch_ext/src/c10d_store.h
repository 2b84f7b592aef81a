// c10d_store.h: ckpt::CoordinationStore over torch.distributed's c10d::Store,
// so that the ranks of a multi-rank checkpoint coordinate through the store
// their process group already has (ckpt/distributed.h) and the library stays
// free of LibTorch.
#ifndef CKPT_TORCH_EXT_C10D_STORE_H_
#define CKPT_TORCH_EXT_C10D_STORE_H_

#include <memory>
#include <string>

#include <torch/csrc/distributed/c10d/Store.hpp>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "ckpt/distributed.h"

namespace ckpt::torch_ext {

// `C10dStore` is a `CoordinationStore` backed by a c10d::Store (a TCPStore,
// FileStore, HashStore, or a PrefixStore over one, as a process group holds).
// No c10 or std exception leaves it: each becomes a status naming the key and
// carrying c10d's message:
//   * a wait that ran out (c10d's "Wait timeout" / "wait timeout after N ms",
//     DistStoreError, or any message saying timeout) -> kDeadlineExceeded;
//   * a store that cannot be reached (DistNetworkError: the process hosting
//     the TCPStore, rank 0, died; a reset or refused connection) -> kUnavailable;
//   * a store without compare-and-set (NotImplementedError) -> kUnimplemented;
//   * anything else -> kUnknown.
//
// Values are stored with a one-byte tag ('v') in front, so no stored value is
// empty: c10d's compareSet(key, "", value) sets `key` when it is absent *or
// holds the empty string*, and the tag keeps `SetIfAbsent` from replacing a
// value some rank set to "". Keys are used as they are (the engine's key
// prefix keeps them apart from the training's own keys).
//
// Thread-safe as far as the c10d store is (TCPStore, FileStore and HashStore
// are), as the engine's threads need.
class C10dStore : public CoordinationStore {
 public:
  explicit C10dStore(c10::intrusive_ptr<c10d::Store> store) : store_(std::move(store)) {}

  absl::Status Set(const std::string& key, const std::string& value) override;
  // c10d's wait({key}, timeout) then get(key). A timeout under 1 ms waits
  // 1 ms (c10d reads 0 as "no timeout"); absl::InfiniteDuration() waits for
  // ever.
  absl::StatusOr<std::string> Get(const std::string& key, absl::Duration timeout) override;
  // c10d's compareSet(key, "", value): sets an absent key, and returns what
  // the key holds afterwards.
  absl::StatusOr<std::string> SetIfAbsent(const std::string& key,
                                          const std::string& value) override;

 private:
  c10::intrusive_ptr<c10d::Store> store_;
};

// `NewC10dStore` wraps a clone of `store` — its own connection to the same
// store, so the engine's background waits never hold the lock of the client
// the training loop uses — or `store` itself when it cannot be cloned.
// Never throws; `store` must not be null.
std::shared_ptr<CoordinationStore> NewC10dStore(const c10::intrusive_ptr<c10d::Store>& store);

// `StoreErrorStatus` is the status for an exception a c10d store call threw
// (see `C10dStore`): `what` says which call ("wait for key \"k\"").
absl::Status StoreErrorStatus(const std::exception& e, const std::string& what);

}  // namespace ckpt::torch_ext

#endif  // CKPT_TORCH_EXT_C10D_STORE_H_
