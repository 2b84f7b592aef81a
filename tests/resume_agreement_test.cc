// AgreeOnResume (distributed/resume_agreement.h) on its own, with ranks as
// threads over an in-process store: the cases an engine test cannot stage
// cheaply — a rank that never answers, rank 0 never answering, an unreadable
// claim, a rank closing while it waits, a store that is gone. Every rank's
// answer is awaited with a deadline, and every "full" names why.
#include "distributed/resume_agreement.h"
#include "distributed/store_value.h"

#include <atomic>
#include <chrono>
#include <functional>
#include <future>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "ckpt/distributed.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace ckpt::internal {
namespace {

using ::testing::HasSubstr;

constexpr absl::Duration kCommitTimeout = absl::Milliseconds(300);
// Longest any rank may take here: a follower's patience is commit_timeout
// + 10% + 1 s, and each wait ends on a 1 s slice.
constexpr auto kAnswerDeadline = std::chrono::seconds(10);
constexpr char kPrefix[] = "run";

DistributedOptions Options(std::shared_ptr<CoordinationStore> store, int rank, int world) {
  DistributedOptions options;
  options.rank = rank;
  options.world_size = world;
  options.store = std::move(store);
  options.key_prefix = kPrefix;
  options.commit_timeout = kCommitTimeout;
  return options;
}

// Runs rank `rank`'s side on its own thread.
std::future<absl::Status> StartRank(std::shared_ptr<CoordinationStore> store, int rank, int world,
                                    absl::StatusOr<std::string> claim,
                                    std::function<bool()> cancelled = [] { return false; }) {
  return std::async(std::launch::async, [=] {
    return AgreeOnResume(Options(store, rank, world), claim, cancelled);
  });
}

absl::Status Await(std::future<absl::Status>& answer) {
  if (answer.wait_for(kAnswerDeadline) != std::future_status::ready) {
    ADD_FAILURE() << "no answer within the deadline";
    return absl::DeadlineExceededError("test deadline");
  }
  return answer.get();
}

TEST(ResumeAgreement, EveryRankClaimingTheSameAgreesOnDeltas) {
  auto store = NewInProcessStore();
  std::vector<std::future<absl::Status>> answers;
  for (int r = 0; r < 3; ++r) answers.push_back(StartRank(store, r, 3, std::string("step 7 #ab12")));
  for (auto& a : answers) EXPECT_TRUE(Await(a).ok());
  auto decision = store->Get(absl::StrCat(kPrefix, "/resume/decision"), absl::Milliseconds(1));
  ASSERT_TRUE(decision.ok());
  auto decided = DecodeStoreValue(*decision, "resume decision");
  ASSERT_TRUE(decided.ok()) << decided.status();
  EXPECT_EQ(decided->verdict, Verdict::kDelta);
  EXPECT_EQ(decided->text, "step 7 #ab12");
}

TEST(ResumeAgreement, DifferentClaimsMakeItFullOnEveryRankNamingBoth) {
  auto store = NewInProcessStore();
  auto zero = StartRank(store, 0, 2, std::string("step 7 #ab12"));
  auto one = StartRank(store, 1, 2, std::string("step 6 #cd34"));
  const absl::Status at_zero = Await(zero);
  const absl::Status at_one = Await(one);
  EXPECT_TRUE(absl::IsFailedPrecondition(at_zero)) << at_zero;
  EXPECT_THAT(at_zero.message(), HasSubstr("rank 1 rebuilt from step 6 #cd34, rank 0 from step 7 #ab12"));
  EXPECT_EQ(at_one, at_zero);
}

TEST(ResumeAgreement, ARankWithoutAReferenceMakesItFullAtOnce) {
  auto store = NewInProcessStore();
  const absl::Time start = absl::Now();
  auto one = StartRank(store, 1, 2, absl::DataLossError("shard 3 fails its checksum"));
  const absl::Status at_one = Await(one);
  EXPECT_TRUE(absl::IsFailedPrecondition(at_one)) << at_one;
  EXPECT_THAT(at_one.message(), HasSubstr("rank 1 has no delta reference: shard 3 fails its checksum"));
  auto zero = StartRank(store, 0, 2, std::string("step 7 #ab12"));
  const absl::Status at_zero = Await(zero);
  EXPECT_THAT(at_zero.message(), HasSubstr("rank 1 has no delta reference: shard 3 fails its checksum"));
  // Neither waited out a timeout.
  EXPECT_LT(absl::Now() - start, kCommitTimeout);
}

TEST(ResumeAgreement, RankZeroWithoutAReferenceDecidesFullForAll) {
  auto store = NewInProcessStore();
  auto zero = StartRank(store, 0, 2, absl::NotFoundError("no checkpoint to rebuild from"));
  auto one = StartRank(store, 1, 2, std::string("step 7 #ab12"));
  EXPECT_THAT(Await(zero).message(), HasSubstr("rank 0 has no delta reference"));
  const absl::Status at_one = Await(one);
  EXPECT_TRUE(absl::IsFailedPrecondition(at_one)) << at_one;
  EXPECT_THAT(at_one.message(), HasSubstr("rank 0 has no delta reference: no checkpoint to rebuild from"));
}

TEST(ResumeAgreement, ARankThatNeverAnswersMakesItFullAfterTheCommitTimeout) {
  auto store = NewInProcessStore();
  const absl::Time start = absl::Now();
  // Rank 2 of 3 never opens.
  auto zero = StartRank(store, 0, 3, std::string("step 7 #ab12"));
  auto one = StartRank(store, 1, 3, std::string("step 7 #ab12"));
  const absl::Status at_zero = Await(zero);
  EXPECT_TRUE(absl::IsFailedPrecondition(at_zero)) << at_zero;
  EXPECT_THAT(at_zero.message(), HasSubstr("rank 2 did not say what it rebuilt within"));
  EXPECT_THAT(at_zero.message(), HasSubstr("commit_timeout"));
  EXPECT_GE(absl::Now() - start, kCommitTimeout);
  // Rank 1 reads rank 0's verdict, not one of its own.
  EXPECT_EQ(Await(one), at_zero);
  // A latecomer reads the same.
  auto two = StartRank(store, 2, 3, std::string("step 7 #ab12"));
  EXPECT_EQ(Await(two), at_zero);
}

TEST(ResumeAgreement, WithoutRankZeroTheOthersDecideFullThemselvesAndRankZeroFollows) {
  auto store = NewInProcessStore();
  const absl::Time start = absl::Now();
  auto one = StartRank(store, 1, 2, std::string("step 7 #ab12"));
  const absl::Status at_one = Await(one);
  EXPECT_TRUE(absl::IsFailedPrecondition(at_one)) << at_one;
  EXPECT_THAT(at_one.message(), HasSubstr("rank 1 had no decision from rank 0 within"));
  EXPECT_GE(absl::Now() - start, kCommitTimeout + absl::Seconds(1));
  // Rank 0, late, sees every claim agree, yet the decision was taken: the
  // first save is full on both.
  auto zero = StartRank(store, 0, 2, std::string("step 7 #ab12"));
  EXPECT_EQ(Await(zero), at_one);
}

// Rank `rank`'s answer (of 2 ranks, claiming "step 7 #ab12") with `value`
// planted under the key `what` of the agreement.
absl::Status AnswerWithPlanted(absl::string_view what, const std::string& value, int rank) {
  auto store = NewInProcessStore();
  EXPECT_TRUE(store->Set(absl::StrCat(kPrefix, "/resume/", what), value).ok());
  auto answer = StartRank(store, rank, 2, std::string("step 7 #ab12"));
  return Await(answer);
}

TEST(ResumeAgreement, AnUnreadableClaimMakesItFull) {
  const absl::Status at_zero = AnswerWithPlanted("claim/1", "{not json", 0);
  EXPECT_TRUE(absl::IsFailedPrecondition(at_zero)) << at_zero;
  EXPECT_THAT(at_zero.message(), HasSubstr("rank 1's claim is unreadable: {not json"));
}

TEST(ResumeAgreement, AnUnreadableDecisionIsAnError) {
  const absl::Status at_one = AnswerWithPlanted("decision", "maybe", 1);
  EXPECT_TRUE(absl::IsInternal(at_one)) << at_one;
  EXPECT_THAT(at_one.message(), HasSubstr("unreadable resume decision"));
}

TEST(ResumeAgreement, ClosingWhileWaitingEndsTheWaitWithinASlice) {
  auto store = NewInProcessStore();
  std::atomic<bool> closing{false};
  DistributedOptions options = Options(store, 0, 2);
  // A commit timeout long enough that only the close can end the wait.
  options.commit_timeout = absl::Seconds(60);
  // Rank 0 asks whether it is closing only after a slice of waiting for
  // rank 1's claim: the first question is the proof that it waits.
  std::promise<void> waiting;
  std::atomic<bool> asked{false};
  auto zero = std::async(std::launch::async, [&] {
    return AgreeOnResume(options, std::string("step 7 #ab12"), [&] {
      if (!asked.exchange(true)) waiting.set_value();
      return closing.load();
    });
  });
  ASSERT_EQ(waiting.get_future().wait_for(kAnswerDeadline), std::future_status::ready)
      << "rank 0 never waited for rank 1";
  const absl::Time closed = absl::Now();
  closing = true;
  const absl::Status at_zero = Await(zero);
  EXPECT_LT(absl::Now() - closed, absl::Seconds(3));
  EXPECT_TRUE(absl::IsFailedPrecondition(at_zero)) << at_zero;
  EXPECT_THAT(at_zero.message(), HasSubstr("rank 0 closed before the ranks agreed"));
}

// A store whose host died: every call is refused.
class DeadStore final : public CoordinationStore {
 public:
  absl::Status Set(const std::string&, const std::string&) override { return Gone(); }
  absl::StatusOr<std::string> Get(const std::string&, absl::Duration) override { return Gone(); }
  absl::StatusOr<std::string> SetIfAbsent(const std::string&, const std::string&) override {
    return Gone();
  }

 private:
  static absl::Status Gone() { return absl::UnavailableError("connection reset by peer"); }
};

TEST(ResumeAgreement, ALostStoreIsUnavailableNamingTheRank) {
  auto store = std::make_shared<DeadStore>();
  for (int r = 0; r < 2; ++r) {
    auto answer = StartRank(store, r, 2, std::string("step 7 #ab12"));
    const absl::Status status = Await(answer);
    EXPECT_TRUE(absl::IsUnavailable(status)) << status;
    EXPECT_THAT(status.message(), HasSubstr(absl::StrCat("rank ", r, " lost the coordination store")));
    EXPECT_THAT(status.message(), HasSubstr("connection reset by peer"));
  }
}

}  // namespace
}  // namespace ckpt::internal
