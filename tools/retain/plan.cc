// tools/retain/plan.cc: the retention plan, from summaries alone (see plan.h).
#include "retain/plan.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace ckpt::tools {
namespace {

bool Intact(const CheckpointSummary* s) { return s != nullptr && s->manifest_status.ok(); }
bool IsDelta(const CheckpointSummary* s) { return Intact(s) && s->kind == CheckpointKind::kDelta; }

}  // namespace

RetentionPlan::RetentionPlan(const std::vector<CheckpointSummary>& listed,
                             std::optional<int64_t> latest, const RetentionPolicy& policy,
                             absl::Time now)
    : policy_(policy) {
  for (const CheckpointSummary& s : listed) by_step_[s.step] = &s;
  KeepByRules(latest, now);
  ResolveChains();
  for (const auto& [step, summary] : by_step_) {
    if (steps_.count(step) != 0) continue;  // compacted
    if (auto k = keep_.find(step); k != keep_.end()) {
      steps_[step] = PlannedStep{Kind::kKeep, k->second, {}};
    } else if (!summary->manifest_status.ok()) {
      steps_[step] = PlannedStep{Kind::kSkipDamaged, std::string(summary->manifest_status.message()), {}};
    }
  }
  // Oldest first: whether a base stays is known before its dependants leave.
  auto stays_hot = [this](int64_t step) {
    auto it = steps_.find(step);
    return it != steps_.end() && (it->second.kind == Kind::kKeep ||
                                  it->second.kind == Kind::kCompact ||
                                  it->second.kind == Kind::kSkipDamaged);
  };
  for (const auto& [step, summary] : by_step_) {
    if (steps_.count(step) == 0) steps_[step] = Leave(step, stays_hot);
  }
}

const CheckpointSummary* RetentionPlan::Find(int64_t step) const {
  auto it = by_step_.find(step);
  return it == by_step_.end() ? nullptr : it->second;
}

void RetentionPlan::KeepByRules(std::optional<int64_t> latest, absl::Time now) {
  std::vector<std::pair<int64_t, std::string>> whole;  // step, why its chain is kept whole
  if (!by_step_.empty()) {
    keep_[by_step_.rbegin()->first] = "newest";
    whole.emplace_back(by_step_.rbegin()->first, "the newest step");
  }
  if (latest.has_value()) {
    keep_.emplace(*latest, "named by LATEST");
    whole.emplace_back(*latest, "the step LATEST names");
  }
  int counted = 0;
  for (auto it = by_step_.rbegin(); it != by_step_.rend(); ++it) {
    const int64_t step = it->first;
    if (counted++ < policy_.keep_last) keep_.emplace(step, absl::StrCat("among the last ", policy_.keep_last));
    if (policy_.keep_every > 0 && step % policy_.keep_every == 0) {
      keep_.emplace(step, absl::StrCat("every ", policy_.keep_every, "th step"));
    }
    if (policy_.keep_newer_than > absl::ZeroDuration() && it->second->manifest_status.ok() &&
        now - absl::FromUnixNanos(it->second->created_unix_ns) < policy_.keep_newer_than) {
      keep_.emplace(step, "newer than " + absl::FormatDuration(policy_.keep_newer_than));
    }
  }
  // The newest step and LATEST's keep their whole chains, uncompacted: the
  // writer's next delta, and any restore of them, may be reading it.
  for (const auto& [top, why] : whole) {
    whole_chain_.emplace(top, why);
    for (const CheckpointSummary* s = Find(top); IsDelta(s); s = Find(s->base_step)) {
      keep_.emplace(s->base_step, absl::StrCat("in the chain of ", why, " ", top, " (kept whole)"));
      whole_chain_.emplace(s->base_step, why);
    }
  }
}

void RetentionPlan::ResolveChains() {
  std::vector<int64_t> kept;
  for (const auto& [step, reason] : keep_) kept.push_back(step);
  // Oldest first: a later kept delta's chain then stops at an earlier one.
  for (int64_t step : kept) {
    const CheckpointSummary* s = Find(step);
    if (whole_chain_.count(step) != 0 || !IsDelta(s)) continue;
    std::vector<int64_t> bases;  // the unkept steps its chain runs through
    uint64_t base_bytes = 0;
    bool intact = true;
    for (int64_t b = s->base_step; keep_.count(b) == 0;) {
      const CheckpointSummary* bs = Find(b);
      if (bs == nullptr) {
        intact = false;  // already missing: nothing to compact from
        break;
      }
      bases.push_back(b);
      base_bytes += bs->file_bytes;
      if (!Intact(bs)) intact = false;
      if (!IsDelta(bs)) break;
      b = bs->base_step;
    }
    if (bases.empty()) continue;
    // Compacting writes the raw tensors and frees the bases and the delta.
    const uint64_t writes = s->tensor_bytes;
    const uint64_t frees = base_bytes + s->file_bytes;
    // (A multi-rank checkpoint is not compacted: ckpt/compact.h.)
    const bool compactable = policy_.compact && s->world_size == 1;
    if (compactable && intact && frees > writes) {
      steps_[step] = PlannedStep{
          Kind::kCompact,
          absl::StrCat(keep_[step], "; rewritten as a full checkpoint (", writes,
                       " bytes) so that its bases ", absl::StrJoin(bases, ", "), " (", base_bytes,
                       " bytes) can go"),
          bases};
      continue;
    }
    std::string why = absl::StrCat("base of kept delta ", step);
    if (!intact) {
      absl::StrAppend(&why, " (its chain is damaged: not compacted)");
    } else if (policy_.compact && !compactable) {
      absl::StrAppend(&why, " (a multi-rank checkpoint: not compacted)");
    } else if (policy_.compact) {
      absl::StrAppend(&why, " (compacting it would write ", writes, " bytes to free ", frees, ")");
    }
    for (int64_t b : bases) keep_.emplace(b, why);
  }
}

PlannedStep RetentionPlan::Leave(int64_t step, const std::function<bool(int64_t)>& stays_hot) const {
  if (policy_.cold_dir.empty()) return PlannedStep{Kind::kDelete, "no rule keeps it", {}};
  const CheckpointSummary* s = Find(step);
  if (IsDelta(s) && Intact(Find(s->base_step)) && stays_hot(s->base_step)) {
    if (policy_.compact && s->world_size == 1) {
      return PlannedStep{Kind::kCompactMove,
                         absl::StrCat("no rule keeps it; its base ", s->base_step,
                                      " stays in ROOT, so it goes to the cold dir as a full checkpoint"),
                         {}};
    }
    return PlannedStep{Kind::kKeep,
                       absl::StrCat("its base ", s->base_step,
                                    " stays in ROOT: moved alone it would not restore from the "
                                    "cold dir (",
                                    s->world_size > 1 ? "a multi-rank checkpoint is not compacted"
                                                      : "compaction is off",
                                    ")"),
                       {}};
  }
  return PlannedStep{Kind::kMove, "no rule keeps it", {}};
}

}  // namespace ckpt::tools
