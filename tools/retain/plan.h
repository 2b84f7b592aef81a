// tools/retain/plan.h: what retention does with each checkpoint of a root,
// decided from their summaries alone (no I/O), so that a dry run and a real
// run agree.
#ifndef CKPT_TOOLS_RETAIN_PLAN_H_
#define CKPT_TOOLS_RETAIN_PLAN_H_

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "ckpt/catalog.h"
#include "retain/retention.h"

namespace ckpt::tools {

struct PlannedStep {
  RetentionAction::Kind kind = RetentionAction::Kind::kKeep;
  std::string reason;
  // kCompact: the bases the compaction lets go; kept instead if it fails.
  std::vector<int64_t> frees;
};

class RetentionPlan {
 public:
  // `listed`: every committed checkpoint of ROOT (ascending); `latest`: the
  // step ROOT/LATEST names, if any.
  RetentionPlan(const std::vector<CheckpointSummary>& listed, std::optional<int64_t> latest,
                const RetentionPolicy& policy, absl::Time now);

  // Every listed step's fate, ascending: kKeep, kCompact, kSkipDamaged,
  // kDelete, or (with a cold dir) kMove, kCompactMove or kKeep (see `Leave`).
  std::map<int64_t, PlannedStep>& steps() { return steps_; }

  // How step `step`, which no rule keeps, leaves ROOT, given which steps stay
  // in ROOT: kDelete without a cold dir; kMove; kCompactMove for an intact
  // delta whose intact base stays hot (moved as is it would not restore in
  // the cold tier); kKeep for such a delta when compaction is off.
  PlannedStep Leave(int64_t step, const std::function<bool(int64_t)>& stays_hot) const;

  const CheckpointSummary* Find(int64_t step) const;

 private:
  using Kind = RetentionAction::Kind;
  // Keeps the newest step and LATEST's with their whole chains.
  void KeepByRules(std::optional<int64_t> latest, absl::Time now);
  // For a kept delta outside those chains whose chain reaches unkept steps:
  // compact it, or keep those steps.
  void ResolveChains();

  const RetentionPolicy& policy_;
  std::map<int64_t, const CheckpointSummary*> by_step_;
  std::map<int64_t, std::string> keep_;  // step -> why
  std::map<int64_t, std::string> whole_chain_;  // never compacted -> why
  std::map<int64_t, PlannedStep> steps_;
};

}  // namespace ckpt::tools

#endif  // CKPT_TOOLS_RETAIN_PLAN_H_
