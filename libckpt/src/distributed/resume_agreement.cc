#include "distributed/resume_agreement.h"

#include "distributed/store_value.h"

#include <algorithm>

#include <nlohmann/json.hpp>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace ckpt::internal {
namespace {

using Json = nlohmann::json;

// As in rank_commit.cc: one wait on the store lasts at most a slice, after
// which a waiter checks whether it should stop; a peek waits 1 ms.
constexpr absl::Duration kWaitSlice = absl::Seconds(1);
constexpr absl::Duration kPeek = absl::Milliseconds(1);

std::string Key(const DistributedOptions& options, absl::string_view what) {
  return absl::StrCat(options.key_prefix, "/resume/", what);
}

std::string Seconds(absl::Duration d) { return absl::StrFormat("%.3g s", absl::ToDoubleSeconds(d)); }

// Waits for `key` until `deadline`; after each slice without it, a non-OK
// `interrupt()` ends the wait with that status.
absl::StatusOr<std::string> WaitFor(CoordinationStore& store, const std::string& key,
                                    absl::Time deadline,
                                    const std::function<absl::Status()>& interrupt) {
  while (true) {
    const absl::Duration left = std::max(kPeek, deadline - absl::Now());
    auto value = store.Get(key, std::min(left, kWaitSlice));
    if (value.ok() || !absl::IsDeadlineExceeded(value.status())) return value;
    absl::Status interrupted = interrupt();
    if (!interrupted.ok()) return interrupted;
    if (absl::Now() >= deadline) return value;
  }
}

// What decision `held` means for a rank that claimed `claim`.
absl::Status Interpret(const std::string& held, const std::string& claim) {
  absl::StatusOr<StoreValue> decided = DecodeStoreValue(held, "resume decision");
  if (decided.ok() && decided->verdict == Verdict::kDelta) {
    if (decided->text == claim) return absl::OkStatus();
    return absl::InternalError(absl::StrCat("rank 0 decided on deltas against ", decided->text,
                                            ", but this rank rebuilt from ", claim));
  }
  if (decided.ok() && decided->verdict == Verdict::kFull) return absl::FailedPreconditionError(decided->text);
  return decided.ok() ? absl::InternalError(absl::StrCat(
                            "unreadable resume decision in the coordination store: ", held))
                      : decided.status();
}

// Sets the decision to `decision` unless one was taken; returns what the
// decision that stands means for `claim`.
absl::Status Decide(CoordinationStore& store, const std::string& key, const StoreValue& decision,
                    const std::string& claim) {
  auto held = store.SetIfAbsent(key, EncodeStoreValue(decision));
  if (!held.ok()) {
    return absl::UnavailableError(absl::StrCat("lost the coordination store while deciding: ",
                                               held.status().message()));
  }
  return Interpret(*held, claim);
}

absl::Status LostStore(int rank, const absl::Status& error) {
  return absl::UnavailableError(
      absl::StrCat("rank ", rank, " lost the coordination store: ", error.message()));
}

}  // namespace

absl::Status AgreeOnResume(const DistributedOptions& options,
                           const absl::StatusOr<std::string>& claim,
                           const std::function<bool()>& cancelled) {
  CoordinationStore& store = *options.store;
  const int rank = options.rank;
  const Json mine = claim.ok() ? Json{{"ok", true}, {"claim", *claim}}
                               : Json{{"ok", false}, {"why", std::string(claim.status().message())}};
  absl::Status published = store.Set(Key(options, absl::StrCat("claim/", rank)), mine.dump());
  if (!published.ok()) return LostStore(rank, published);
  const std::string decision_key = Key(options, "decision");
  const absl::Time start = absl::Now();

  if (rank != 0) {
    if (!claim.ok()) {
      return absl::FailedPreconditionError(
          absl::StrCat("rank ", rank, " has no delta reference: ", claim.status().message()));
    }
    // A little longer than rank 0 waits for the claims (see FollowRankZero).
    const absl::Duration patience =
        options.commit_timeout + options.commit_timeout / 10 + absl::Seconds(1);
    bool stopped = false;
    auto decision = WaitFor(store, decision_key, start + patience, [&]() {
      stopped = cancelled();
      return stopped ? absl::CancelledError("closing") : absl::OkStatus();
    });
    if (decision.ok()) return Interpret(*decision, *claim);
    if (!stopped && !absl::IsDeadlineExceeded(decision.status())) return LostStore(rank, decision.status());
    const std::string why = stopped ? absl::StrCat("rank ", rank, " closed before the ranks agreed")
                                    : absl::StrCat("rank ", rank, " had no decision from rank 0 within ",
                                                   Seconds(patience));
    return Decide(store, decision_key, StoreValue::Full(why), *claim);
  }

  if (!claim.ok()) {
    return Decide(store, decision_key,
                  StoreValue::Full(absl::StrCat("rank 0 has no delta reference: ", claim.status().message())),
                  "");
  }
  const absl::Time deadline = start + options.commit_timeout;
  bool decided_elsewhere = false;
  bool stopped = false;
  const auto interrupt = [&]() {
    decided_elsewhere = store.Get(decision_key, kPeek).ok();
    stopped = !decided_elsewhere && cancelled();
    return decided_elsewhere || stopped ? absl::AbortedError("stopped") : absl::OkStatus();
  };
  for (int r = 1; r < options.world_size; ++r) {
    auto got = WaitFor(store, Key(options, absl::StrCat("claim/", r)), deadline, interrupt);
    if (decided_elsewhere) {
      auto held = store.Get(decision_key, kPeek);
      return held.ok() ? Interpret(*held, *claim) : LostStore(0, held.status());
    }
    if (!got.ok() && !stopped && !absl::IsDeadlineExceeded(got.status())) return LostStore(0, got.status());
    std::string why;
    if (stopped) {
      why = "rank 0 closed before the ranks agreed";
    } else if (!got.ok()) {
      why = absl::StrCat("rank ", r, " did not say what it rebuilt within ", Seconds(options.commit_timeout),
                         " (commit_timeout)");
    } else {
      const Json theirs = Json::parse(*got, nullptr, /*allow_exceptions=*/false);
      if (!theirs.is_object() || !theirs.contains("ok") || !theirs["ok"].is_boolean()) {
        why = absl::StrCat("rank ", r, "'s claim is unreadable: ", *got);
      } else if (!theirs["ok"].get<bool>()) {
        why = absl::StrCat("rank ", r, " has no delta reference: ", theirs.value("why", std::string()));
      } else if (theirs.value("claim", std::string()) != *claim) {
        why = absl::StrCat("rank ", r, " rebuilt from ", theirs.value("claim", std::string()),
                           ", rank 0 from ", *claim);
      }
    }
    if (!why.empty()) return Decide(store, decision_key, StoreValue::Full(why), *claim);
  }
  return Decide(store, decision_key, StoreValue::Delta(*claim), *claim);
}

}  // namespace ckpt::internal
