// ckpt-restore on multi-rank checkpoints (ranks are threads of this
// process, one Engine each, one in-process store): listed, verified, shown
// and exported as one unit, whole or one rank's part (--rank); sharded
// tensors shown and exported whole.
#include <string>
#include <vector>

#include "ckpt_restore_fixture.h"

namespace ckpt::restore_test {
namespace {

// Two ranks, each a thread with its own Engine on the same root, sharing an
// in-process store: step 1 full, step 2 an exact delta of it. Each rank saves
// replicated tensors (identical everywhere, written once), a rank-local one
// (same name, other contents on each rank) and one only it has.

constexpr int kWorld = 2;
constexpr absl::Duration kRankDeadline = absl::Seconds(60);

bool IsReplicated(const std::string& name) { return absl::StartsWith(name, "model."); }

// `line` with each run of spaces made one and the ends trimmed: a table row
// whatever its column widths.
std::string Squeeze(const std::string& line) {
  std::vector<std::string> words = absl::StrSplit(line, ' ', absl::SkipEmpty());
  return absl::StrJoin(words, " ");
}

// Rank `rank`'s state at `step`.
std::vector<OwnedTensor> RankState(int rank, int64_t step) {
  const uint64_t seed = static_cast<uint64_t>(step) * 64;
  std::vector<OwnedTensor> state = {
      RandomTensor("model.w", DType::kFloat32, {32, 16}, seed + 1),
      RandomTensor("model.b", DType::kBFloat16, {16}, seed + 2),
      RandomTensor("rng.state", DType::kUInt8, {96}, seed + 10 + rank),
      RandomTensor(absl::StrCat("shard.", rank, ".w"), DType::kFloat32, {8, 16}, seed + 20 + rank),
  };
  if (step > 1) {
    // A delta of step 1: a few elements of every tensor changed (the same
    // ones on every rank for the replicated tensors).
    std::vector<OwnedTensor> changed = RankState(rank, 1);
    for (size_t i = 0; i < changed.size(); ++i) {
      std::vector<uint8_t>& bytes = changed[i].bytes;
      for (size_t at = 0; at < bytes.size(); at += bytes.size() / 3 + 1) {
        bytes[at] ^= static_cast<uint8_t>(step + (IsReplicated(changed[i].name) ? 0 : rank + 1));
      }
    }
    return changed;
  }
  return state;
}

// The whole checkpoint as the Reader shows it: replicated tensors under their
// names, the others as "rank<r>/<name>", each with the bytes saved.
std::map<std::string, std::vector<uint8_t>> WholeCheckpoint(int64_t step) {
  std::map<std::string, std::vector<uint8_t>> whole;
  for (int r = 0; r < kWorld; ++r) {
    for (const OwnedTensor& t : RankState(r, step)) {
      whole[IsReplicated(t.name) ? t.name : absl::StrCat("rank", r, "/", t.name)] = t.bytes;
    }
  }
  return whole;
}

std::map<std::string, std::vector<uint8_t>> RankPart(int rank, int64_t step) {
  std::map<std::string, std::vector<uint8_t>> part;
  for (const OwnedTensor& t : RankState(rank, step)) part[t.name] = t.bytes;
  return part;
}

// The tensors of a safetensors file, by name, read with the format's spec
// alone (8-byte little-endian header length, JSON header, data).
std::map<std::string, std::vector<uint8_t>> ReadSafetensors(const std::string& path,
                                                            Json* metadata) {
  std::map<std::string, std::vector<uint8_t>> tensors;
  const std::string file = ReadFile(path);
  EXPECT_GE(file.size(), 8u) << path;
  if (file.size() < 8) return tensors;
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | static_cast<unsigned char>(file[i]);
  EXPECT_LE(8 + n, file.size()) << path;
  if (8 + n > file.size()) return tensors;
  const Json header = Json::parse(file.substr(8, n));
  for (const auto& [name, entry] : header.items()) {
    if (name == "__metadata__") {
      if (metadata != nullptr) *metadata = entry;
      continue;
    }
    const uint64_t begin = entry["data_offsets"][0], end = entry["data_offsets"][1];
    EXPECT_LE(8 + n + end, file.size()) << name;
    const char* data = file.data() + 8 + n;
    tensors[name] = std::vector<uint8_t>(data + begin, data + std::min<uint64_t>(end, file.size() - 8 - n));
  }
  return tensors;
}

std::vector<std::string> Names(const std::map<std::string, std::vector<uint8_t>>& tensors) {
  std::vector<std::string> names;
  for (const auto& [name, bytes] : tensors) names.push_back(name);
  return names;
}

class CkptRestoreMultiRankTest : public CkptRestoreTest {
 protected:
  // Saves steps 1 (full) and 2 (exact delta) of `kWorld` ranks under `root`
  // (with `shared_root` false, each rank in `root/rank-<5 digits>`).
  static void SaveRanks(const std::string& root, bool shared_root = true) {
    std::shared_ptr<CoordinationStore> store = NewInProcessStore();
    std::vector<absl::Status> results(kWorld);
    testing::RunOrDie(
        [&] {
          std::vector<std::thread> threads;
          for (int r = 0; r < kWorld; ++r) {
            threads.emplace_back([&, r] { results[r] = SaveAsRank(root, store, r, shared_root); });
          }
          for (std::thread& t : threads) t.join();
        },
        kRankDeadline, "saving a 2-rank checkpoint");
    for (int r = 0; r < kWorld; ++r) ASSERT_TRUE(results[r].ok()) << "rank " << r << ": " << results[r];
  }

  // One rank's engine: opens, saves steps 1 and 2, closes.
  static absl::Status SaveAsRank(const std::string& root, const std::shared_ptr<CoordinationStore>& store,
                                 int rank, bool shared_root) {
    EngineOptions options;
    options.shard_min_bytes = 1;  // one shard per module
    options.delta.mode = DeltaOptions::Mode::kExact;
    // These tests are about chains of deltas: each against the one before.
    options.delta.base = DeltaOptions::Base::kChained;
    options.delta.max_restore_read_factor = 0;
    options.delta.full_every = 10;
    options.distributed.rank = rank;
    options.distributed.world_size = kWorld;
    options.distributed.store = store;
    options.distributed.key_prefix = "ckpt/restore-test";
    options.distributed.commit_timeout = absl::Seconds(30);
    options.distributed.shared_root = shared_root;
    auto engine = Engine::Open(shared_root ? root : absl::StrFormat("%s/rank-%05d", root, rank), options);
    if (!engine.ok()) return engine.status();
    for (int64_t step : {1, 2}) {
      const std::vector<OwnedTensor> state = RankState(rank, step);
      std::vector<TensorView> views = Views(state);
      for (TensorView& v : views) {
        if (IsReplicated(v.name)) v.placement = TensorPlacement::kReplicated;
        if (v.name == "rng.state") v.placement = TensorPlacement::kRankLocal;
      }
      auto handle = (*engine)->SaveAsync(step, views, absl::StrFormat(R"({"epoch": %d})", step));
      if (!handle.ok()) return handle.status();
      absl::Status saved = testing::WaitOrDie(**handle, kRankDeadline,
                                              absl::StrCat("rank ", rank, " step ", step));
      if (!saved.ok()) return saved;
    }
    return (*engine)->Close();
  }

  // Where tensor `name` of rank `rank`'s part of `step` lies.
  TensorInfo LocateInRank(int64_t step, int rank, const std::string& name) {
    return Locate(step, name, rank);
  }

  static uint64_t TotalBytes(const std::map<std::string, std::vector<uint8_t>>& tensors) {
    uint64_t total = 0;
    for (const auto& [name, bytes] : tensors) total += bytes.size();
    return total;
  }

  void SetUp() override {
    CkptRestoreTest::SetUp();
    SaveRanks(root_);
  }
};

TEST_F(CkptRestoreMultiRankTest, ListShowsTheRanksAndTheWholeCheckpointsTotals) {
  RunResult r = Run({"--root", root_, "--list"});
  ASSERT_EQ(r.exit_code, 0) << r;
  std::vector<std::string> lines = Lines(r.out);
  ASSERT_GE(lines.size(), 4u) << r;
  EXPECT_TRUE(absl::StartsWith(Squeeze(lines[0]), "STEP KIND RANKS EXACT SIZE TENSORS")) << r;
  EXPECT_TRUE(absl::StartsWith(Squeeze(lines[1]), "1 full 2 exact ")) << r;
  EXPECT_TRUE(absl::StartsWith(Squeeze(lines[2]), "2* delta of 1 2 exact ")) << r;
  EXPECT_TRUE(Contains(Squeeze(lines[1]), " 6 ")) << r;  // tensors: every rank's
  EXPECT_EQ(r.err, "");

  r = Run({"--root", root_, "--list", "--json"});
  ASSERT_EQ(r.exit_code, 0) << r;
  lines = Lines(r.out);
  ASSERT_EQ(lines.size(), 2u) << r;
  for (int64_t step : {1, 2}) {
    const Json row = Json::parse(lines[step - 1]);
    EXPECT_EQ(row["step"], step);
    EXPECT_EQ(row["world_size"], kWorld);
    EXPECT_EQ(row["kind"], step == 1 ? "full" : "delta");
    EXPECT_EQ(row["base_step"], step == 1 ? Json(nullptr) : Json(1));
    EXPECT_EQ(row["exact"], true);
    // The parts add up: the replicated tensors once, every rank's own.
    EXPECT_EQ(row["tensor_count"], WholeCheckpoint(step).size());
    EXPECT_EQ(row["tensor_bytes"], TotalBytes(WholeCheckpoint(step)));
    EXPECT_GE(row["shard_count"].get<int>(), kWorld);
    EXPECT_EQ(row["ok"], true);
    EXPECT_EQ(row["latest"], step == 2);
  }
}

TEST_F(CkptRestoreMultiRankTest, VerifyCoversEveryRanksPart) {
  RunResult r = Run({"--root", root_, "--verify"});
  ASSERT_EQ(r.exit_code, 0) << r;
  ASSERT_EQ(Lines(r.out).size(), 2u) << r;
  for (const std::string& line : Lines(r.out)) {
    EXPECT_TRUE(Contains(line, ": ok (6 tensors, "));
    EXPECT_TRUE(absl::EndsWith(line, " shards, 2 ranks)")) << line;
  }
  EXPECT_EQ(r.err, "");

  r = Run({"--root", root_, "--verify", "--json"});
  ASSERT_EQ(r.exit_code, 0) << r;
  ASSERT_EQ(Lines(r.out).size(), 2u) << r;
  for (const std::string& line : Lines(r.out)) {
    const Json row = Json::parse(line);
    EXPECT_EQ(row["ok"], true) << line;
    EXPECT_EQ(row["world_size"], kWorld) << line;
    EXPECT_EQ(row["tensor_count"], 6) << line;
  }
  r = Run({"--root", root_, "--list", "--verify", "--json"});
  ASSERT_EQ(r.exit_code, 0) << r;
  for (const std::string& line : Lines(r.out)) EXPECT_EQ(Json::parse(line)["verified"], true) << line;
  r = Run({"--root", root_, "--latest", "--verify"});
  ASSERT_EQ(r.exit_code, 0) << r;
  EXPECT_TRUE(Contains(r.out, "newest checkpoint that verifies: step 2"));
  ExpectSameResultsWithProgress({"--root", root_, "--verify", "--all"});
}

// A flipped byte in one rank's shard fails the checkpoint, naming that rank's
// file; --latest falls back for every rank, even one whose own part is intact.
TEST_F(CkptRestoreMultiRankTest, DamageInOneRanksShardNamesTheRanksFile) {
  const TensorInfo info = LocateInRank(2, 1, "shard.1.w");
  ASSERT_TRUE(absl::StartsWith(info.shard, "rank-00001.")) << info.shard;
  FlipByte(StepDir(2) + "/" + info.shard, info.offset + info.stored_bytes / 2);

  RunResult r = Run({"--root", root_, "--verify", "--all"});
  EXPECT_EQ(r.exit_code, 1) << r;
  EXPECT_TRUE(Contains(r.out, "step 1: ok"));
  std::string failure;
  for (const std::string& line : Lines(r.out)) {
    if (absl::StartsWith(line, "step 2: FAILED: DATA_LOSS: ")) failure = line;
  }
  ASSERT_NE(failure, "") << r;
  EXPECT_TRUE(Contains(failure, StepDir(2) + "/" + info.shard)) << r;
  EXPECT_TRUE(Contains(failure, "\"shard.1.w\"")) << r;
  EXPECT_EQ(r.err, "ckpt-restore: verification failed for 1 of 2 checkpoints: step 2\n");
  ExpectSameResultsWithProgress({"--root", root_, "--verify", "--all"});

  r = Run({"--root", root_, "--list", "--verify", "--json"});
  EXPECT_EQ(r.exit_code, 1) << r;
  ASSERT_EQ(Lines(r.out).size(), 2u) << r;
  const Json bad = Json::parse(Lines(r.out)[1]);
  EXPECT_EQ(bad["ok"], true);  // the manifests are sound
  EXPECT_EQ(bad["verified"], false);
  EXPECT_TRUE(Contains(bad["error"].get<std::string>(), info.shard));

  r = Run({"--root", root_, "--latest", "--verify"});
  EXPECT_EQ(r.exit_code, 0) << r;
  EXPECT_TRUE(Contains(r.err, "skipped step 2: DATA_LOSS")) << r;
  EXPECT_TRUE(Contains(r.out, "newest checkpoint that verifies: step 1")) << r;
  // Rank 0 never reads rank 1's own tensors, yet restores step 1 too: every
  // rank picks the step whose every part verifies.
  const std::string path = scratch_.Join("rank0.safetensors");
  r = Run({"--root", root_, "--latest", "--rank", "0", "--out", path});
  ASSERT_EQ(r.exit_code, 0) << r;
  EXPECT_TRUE(Contains(r.err, "fell back to step 1")) << r;
  EXPECT_EQ(r.out, absl::StrFormat("wrote %s: step 1, rank 0's part, 4 tensors, %d bytes\n", path,
                                   ReadFile(path).size()));
  EXPECT_EQ(ReadSafetensors(path, nullptr), RankPart(0, 1));
  // --step 2 --out reads the damaged record: data loss, no file.
  const std::string whole = scratch_.Join("whole.safetensors");
  r = Run({"--root", root_, "--step", "2", "--out", whole});
  EXPECT_EQ(r.exit_code, 1) << r;
  EXPECT_TRUE(Contains(r.err, info.shard)) << r;
  EXPECT_NE(access(whole.c_str(), F_OK), 0);
}

// A rank's manifest that is missing, or a MANIFEST.json that was edited,
// damages the checkpoint as a whole: every rank's part of it.
TEST_F(CkptRestoreMultiRankTest, AMissingRankManifestIsDataLossNamingIt) {
  const std::string manifest = StepDir(2) + "/rank-00001.MANIFEST.json";
  ASSERT_EQ(unlink(manifest.c_str()), 0) << manifest;

  RunResult r = Run({"--root", root_, "--verify", "--all"});
  EXPECT_EQ(r.exit_code, 1) << r;
  EXPECT_TRUE(Contains(r.out, "step 1: ok"));
  EXPECT_TRUE(Contains(r.out, "step 2: FAILED: DATA_LOSS: rank 1's part of " + StepDir(2) +
                                  ": manifest " + manifest + " is missing"))
      << r;
  r = Run({"--root", root_, "--list"});
  EXPECT_EQ(r.exit_code, 0) << r;  // listing is informational
  EXPECT_TRUE(Contains(r.out, "DAMAGED: DATA_LOSS: rank 1's part")) << r;
  r = Run({"--root", root_, "--list", "--json"});
  ASSERT_EQ(Lines(r.out).size(), 2u) << r;
  const Json bad = Json::parse(Lines(r.out)[1]);
  EXPECT_EQ(bad["ok"], false);
  EXPECT_EQ(bad["world_size"], 0);
  EXPECT_TRUE(Contains(bad["error"].get<std::string>(), "rank-00001.MANIFEST.json"));
  for (const std::vector<std::string>& args :
       {std::vector<std::string>{"--step", "2"}, std::vector<std::string>{"--step", "2", "--rank", "0"}}) {
    std::vector<std::string> full = {"--root", root_};
    full.insert(full.end(), args.begin(), args.end());
    ExpectError(full, 1, "step 2: DATA_LOSS: rank 1's part");
  }
  r = Run({"--root", root_, "--latest", "--rank", "1", "--json"});
  ASSERT_EQ(r.exit_code, 0) << r;
  EXPECT_TRUE(Contains(r.err, "skipped step 2: DATA_LOSS")) << r;
  EXPECT_EQ(Json::parse(r.out)["step"], 1) << r;
}

// Ranks that share no file system: a rank's directory holds its copy of
// each step (the manifest and its part only). ckpt-restore says so and
// where the whole checkpoint is, for every action, instead of listing
// damaged steps.
TEST_F(CkptRestoreMultiRankTest, ARanksOwnCopyIsNamedAndPointsToTheBucket) {
  const std::string node_local = scratch_.Join("node-local");
  ASSERT_EQ(mkdir(node_local.c_str(), 0755), 0);
  SaveRanks(node_local, /*shared_root=*/false);
  const std::string copy = node_local + "/rank-00001";
  for (const std::vector<std::string>& args :
       {std::vector<std::string>{"--list"}, std::vector<std::string>{"--verify"},
        std::vector<std::string>{"--latest", "--json"}, std::vector<std::string>{"--step", "2", "--rank", "1"}}) {
    std::vector<std::string> full = {"--root", copy};
    full.insert(full.end(), args.begin(), args.end());
    ExpectError(full, 3, "is rank 1's own copy");
    ExpectError(full, 3, "bucket");
  }
}

TEST_F(CkptRestoreMultiRankTest, AnEditedGlobalManifestIsDataLoss) {
  const std::string manifest = StepDir(2) + "/MANIFEST.json";
  std::string text = ReadFile(manifest);
  const std::string epoch = R"("epoch": 2)";
  ASSERT_TRUE(Contains(text, epoch));
  text.replace(text.find(epoch), epoch.size(), R"("epoch": 3)");
  { std::ofstream(manifest, std::ios::binary | std::ios::trunc) << text; }

  RunResult r = Run({"--root", root_, "--verify", "--step", "2"});
  EXPECT_EQ(r.exit_code, 1) << r;
  EXPECT_TRUE(Contains(r.out, "step 2: FAILED: DATA_LOSS: manifest " + manifest)) << r;
  EXPECT_TRUE(Contains(r.out, "checksum mismatch")) << r;
  r = Run({"--root", root_, "--list", "--verify"});
  EXPECT_EQ(r.exit_code, 1) << r;
  EXPECT_TRUE(Contains(Squeeze(r.out), " DAMAGED FAILED: DATA_LOSS: manifest " + manifest)) << r;
  ExpectError({"--root", root_, "--step", "2", "--rank", "1"}, 1, "MANIFEST.json");
  r = Run({"--root", root_, "--latest", "--verify"});
  EXPECT_EQ(r.exit_code, 0) << r;
  EXPECT_TRUE(Contains(r.out, "newest checkpoint that verifies: step 1")) << r;
}

// Without --rank, show and export cover the whole checkpoint under the names
// the Reader gives it: replicated tensors bare, every rank's others
// "rank<r>/<name>".
TEST_F(CkptRestoreMultiRankTest, ShowAndExportTheWholeCheckpoint) {
  RunResult r = Run({"--root", root_, "--step", "2"});
  ASSERT_EQ(r.exit_code, 0) << r;
  EXPECT_TRUE(absl::StartsWith(r.out, "step 2  " + StepDir(2) + "\nranks: 2; the whole checkpoint"))
      << r;
  EXPECT_TRUE(Contains(r.out, "\nextras: {\"epoch\":2}\n")) << r;
  EXPECT_TRUE(Contains(r.out, "PLACEMENT   RANK  SHARD")) << r;
  for (const std::string& name : Names(WholeCheckpoint(2))) {
    std::string row;
    for (const std::string& line : Lines(r.out)) {
      if (absl::StartsWith(line, name + " ")) row = line;
    }
    ASSERT_NE(row, "") << name << "\n" << r;
    const std::string placement = IsReplicated(name)                    ? " replicated "
                                  : absl::EndsWith(name, "/rng.state") ? " rank_local "
                                                                        : " default ";
    EXPECT_TRUE(Contains(row, placement)) << row;
  }
  EXPECT_TRUE(Contains(r.out, "6 tensors, ")) << r;

  r = Run({"--root", root_, "--step", "2", "--json"});
  ASSERT_EQ(r.exit_code, 0) << r;
  const Json shown = Json::parse(r.out);
  EXPECT_EQ(shown["world_size"], kWorld);
  EXPECT_TRUE(shown["rank"].is_null());
  std::vector<std::string> names;
  for (const Json& t : shown["tensors"]) {
    names.push_back(t["name"]);
    if (absl::StartsWith(t["name"].get<std::string>(), "rank1/")) EXPECT_EQ(t["rank"], 1) << t;
  }
  std::sort(names.begin(), names.end());
  EXPECT_EQ(names, Names(WholeCheckpoint(2)));

  for (int64_t step : {1, 2}) {
    const std::string path = scratch_.Join(absl::StrCat("whole", step, ".safetensors"));
    r = Run({"--root", root_, "--step", absl::StrCat(step), "--out", path});
    ASSERT_EQ(r.exit_code, 0) << r;
    EXPECT_TRUE(Contains(r.out, absl::StrFormat(": step %d, 6 tensors, ", step))) << r;
    Json metadata;
    EXPECT_EQ(ReadSafetensors(path, &metadata), WholeCheckpoint(step)) << "step " << step;
    EXPECT_EQ(metadata["ckpt_step"], absl::StrCat(step));
  }
  // --filter on the names shown: "rank1/" is rank 1's own tensors.
  const std::string part = scratch_.Join("rank1-own.safetensors");
  r = Run({"--root", root_, "--latest", "--out", part, "--filter", "rank1/"});
  ASSERT_EQ(r.exit_code, 0) << r;
  EXPECT_EQ(Names(ReadSafetensors(part, nullptr)),
            (std::vector<std::string>{"rank1/rng.state", "rank1/shard.1.w"}));
}

// --rank R shows and exports rank R's part: its own tensors and the
// replicated ones, under the names it saved.
TEST_F(CkptRestoreMultiRankTest, RankRestoresOneRanksPart) {
  for (int rank = 0; rank < kWorld; ++rank) {
    for (int64_t step : {1, 2}) {
      SCOPED_TRACE(absl::StrCat("rank ", rank, " step ", step));
      const std::string path = scratch_.Join(absl::StrCat("r", rank, "s", step, ".safetensors"));
      const RunResult r = Run({"--root", root_, "--step", absl::StrCat(step), "--rank",
                               absl::StrCat(rank), "--out", path});
      ASSERT_EQ(r.exit_code, 0) << r;
      EXPECT_EQ(r.out, absl::StrFormat("wrote %s: step %d, rank %d's part, 4 tensors, %d bytes\n",
                                       path, step, rank, ReadFile(path).size()));
      EXPECT_EQ(ReadSafetensors(path, nullptr), RankPart(rank, step));
    }
  }
  RunResult r = Run({"--root", root_, "--latest", "--rank", "1"});
  ASSERT_EQ(r.exit_code, 0) << r;
  EXPECT_TRUE(Contains(r.out, "ranks: 2; rank 1's part")) << r;
  EXPECT_TRUE(Contains(r.out, "\nshard.1.w ")) << r;
  EXPECT_FALSE(Contains(r.out, "shard.0.w")) << r;
  EXPECT_FALSE(Contains(r.out, "rank1/")) << r;
  EXPECT_TRUE(Contains(r.out, "; every checksum verified\n")) << r;

  r = Run({"--root", root_, "--latest", "--rank", "0", "--json"});
  ASSERT_EQ(r.exit_code, 0) << r;
  const Json shown = Json::parse(r.out);
  EXPECT_EQ(shown["step"], 2);
  EXPECT_EQ(shown["rank"], 0);
  EXPECT_EQ(shown["world_size"], kWorld);
  EXPECT_EQ(shown["verified"], true);
  std::vector<std::string> names;
  for (const Json& t : shown["tensors"]) names.push_back(t["name"]);
  std::sort(names.begin(), names.end());
  EXPECT_EQ(names, Names(RankPart(0, 2)));

  // --filter applies to the part's own names.
  const std::string model = scratch_.Join("model.safetensors");
  r = Run({"--root", root_, "--step", "2", "--rank", "1", "--out", model, "--filter", "model."});
  ASSERT_EQ(r.exit_code, 0) << r;
  EXPECT_EQ(Names(ReadSafetensors(model, nullptr)), (std::vector<std::string>{"model.b", "model.w"}));

  ExpectError({"--root", root_, "--step", "2", "--rank", "2"}, 3, "not rank 2");
  ExpectError({"--root", root_, "--latest", "--rank", "7", "--json"}, 3, "not rank 7");
}

// A sharded tensor (two ranks' chunks of one global tensor) is listed,
// verified and exported as the global tensor.
TEST_F(CkptRestoreTest, ShardedTensorsAreShownAndExportedWhole) {
  const OwnedTensor global = RandomTensor("embed.weight", DType::kFloat32, {9, 5}, 77);
  std::shared_ptr<CoordinationStore> store = NewInProcessStore();
  std::vector<absl::Status> results(kWorld);
  auto save_as = [&](int rank) -> absl::Status {
    EngineOptions options;
    options.distributed.rank = rank;
    options.distributed.world_size = kWorld;
    options.distributed.store = store;
    options.distributed.commit_timeout = absl::Seconds(30);
    auto engine = Engine::Open(root_, options);
    if (!engine.ok()) return engine.status();
    const int64_t rows = rank == 0 ? 5 : 4;  // Shard(0) of 9 rows
    TensorView v{global.name, global.dtype, {rows, 5}, global.bytes.data() + rank * 5 * 5 * 4,
                 static_cast<size_t>(rows * 5 * 4)};
    v.placement = TensorPlacement::kSharded;
    v.global_shape = global.shape;
    v.global_offset = {rank * 5, 0};
    auto handle = (*engine)->SaveAsync(3, {&v, 1});
    if (!handle.ok()) return handle.status();
    absl::Status saved = testing::WaitOrDie(**handle, kRankDeadline, absl::StrCat("rank ", rank));
    if (!saved.ok()) return saved;
    return (*engine)->Close();
  };
  testing::RunOrDie(
      [&] {
        std::vector<std::thread> threads;
        for (int r = 0; r < kWorld; ++r) threads.emplace_back([&, r] { results[r] = save_as(r); });
        for (std::thread& t : threads) t.join();
      },
      kRankDeadline, "saving a sharded checkpoint");
  for (int r = 0; r < kWorld; ++r) ASSERT_TRUE(results[r].ok()) << "rank " << r << ": " << results[r];

  RunResult r = Run({"--root", root_, "--step", "3"});
  ASSERT_EQ(r.exit_code, 0) << r;
  std::string row;
  for (const std::string& line : Lines(r.out)) {
    if (absl::StartsWith(line, "embed.weight ")) row = line;
  }
  EXPECT_TRUE(Contains(row, "[9, 5]") && Contains(row, " sharded ") && Contains(row, " 0-1 ") &&
              Contains(row, "2 chunks")) << r;
  EXPECT_TRUE(Contains(r.out, "1 tensors, 180 B in 2 shards")) << r;
  r = Run({"--root", root_, "--step", "3", "--json"});
  ASSERT_EQ(r.exit_code, 0) << r;
  const Json shown = Json::parse(r.out)["tensors"][0];
  EXPECT_EQ(shown["placement"], "sharded");
  ASSERT_EQ(shown["chunks"].size(), 2u);
  EXPECT_EQ(shown["chunks"][1]["offset"], Json::array({5, 0}));
  EXPECT_EQ(shown["chunks"][1]["shape"], Json::array({4, 5}));
  r = Run({"--root", root_, "--verify", "--step", "3"});
  EXPECT_EQ(r.exit_code, 0) << r;
  const std::string path = scratch_.Join("sharded.safetensors");
  r = Run({"--root", root_, "--latest", "--out", path});
  ASSERT_EQ(r.exit_code, 0) << r;
  const auto exported = ReadSafetensors(path, nullptr);
  ASSERT_EQ(exported.size(), 1u);
  EXPECT_EQ(exported.begin()->second, global.bytes);
}

TEST_F(CkptRestoreTest, RankOnASingleProcessCheckpointIsRankZeroAlone) {
  Save({100, 200});
  const RunResult plain = Run({"--root", root_, "--step", "200"});
  ASSERT_EQ(plain.exit_code, 0) << plain;
  RunResult r = Run({"--root", root_, "--step", "200", "--rank", "0"});
  ASSERT_EQ(r.exit_code, 0) << r;
  EXPECT_EQ(r.out, plain.out);
  r = Run({"--root", root_, "--latest", "--rank", "0", "--json"});
  ASSERT_EQ(r.exit_code, 0) << r;
  EXPECT_EQ(Json::parse(r.out)["world_size"], 1);
  EXPECT_EQ(Json::parse(r.out)["rank"], 0);
  const std::string path = scratch_.Join("rank0.safetensors");
  r = Run({"--root", root_, "--latest", "--rank", "0", "--out", path});
  ASSERT_EQ(r.exit_code, 0) << r;
  EXPECT_TRUE(Contains(r.out, ": step 200, rank 0's part, 4 tensors, ")) << r;
  EXPECT_EQ(ReadSafetensors(path, nullptr).size(), 4u);
  ExpectError({"--root", root_, "--step", "200", "--rank", "1"}, 3,
              "was written by one process: it has no rank 1 (only rank 0)");
  ExpectError({"--root", root_, "--latest", "--rank", "3", "--out", scratch_.Join("x.st")}, 3,
              "no rank 3");
  EXPECT_NE(access(scratch_.Join("x.st").c_str(), F_OK), 0);
}


}  // namespace
}  // namespace ckpt::restore_test
