// ckpt-restore's command line: every flag in every spelling, usage errors
// and exit codes, --help.
#include <string>
#include <vector>

#include "ckpt_restore_fixture.h"

namespace ckpt::restore_test {
namespace {

TEST_F(CkptRestoreTest, PositionalRootIsAccepted) {
  Save({100});
  const RunResult r = Run({root_, "--latest", "--verify"});
  EXPECT_EQ(r.exit_code, 0) << r;
  EXPECT_TRUE(Contains(r.out, "step 100"));
}

TEST_F(CkptRestoreTest, UsageErrorsExit2) {
  Save({100});
  ExpectError({}, 2, "--root");
  ExpectError({"--list"}, 2, "--root DIR is required");
  ExpectError({"--root", root_}, 2, "nothing to do");
  ExpectError({"--root", root_, "--step", "100", "--latest"}, 2, "--step and --latest");
  ExpectError({"--root", root_, "--verify", "--all", "--step", "100"}, 2, "--all");
  ExpectError({"--root", root_, "--verify", "--all", "--latest"}, 2, "--all");
  ExpectError({"--root", root_, "--list", "--verify", "--step", "100"}, 2, "--list");
  ExpectError({"--root", root_, "--list", "--verify", "--latest"}, 2, "--list");
  ExpectError({"--root", root_, "--verify", "--progress=sometimes"}, 2,
              "--progress must be auto, always or never");
  ExpectError({"--root", root_, "--verify", "--progress"}, 2, "--progress needs a value");
  ExpectError({"--root", root_, "--list", "--step", "100"}, 2, "--list");
  ExpectError({"--root", root_, "--all"}, 2, "--all needs an action");
  ExpectError({"--root", root_, "--bogus"}, 2, "unknown flag --bogus");
  ExpectError({"--root", root_, "--step", "abc"}, 2, "--step");
  ExpectError({"--root", root_, "--step=-5"}, 2, "--step must be");
  ExpectError({"--root", root_, "--step"}, 2, "--step needs a value");
  ExpectError({"--root", root_, "--nolist=1"}, 2, "takes no value");
  ExpectError({"--root", root_, root_ + "x", "--list"}, 2, "ROOT given twice");
  ExpectError({root_, root_, "--list"}, 2, "unexpected argument");
  ExpectError({"--root", root_, "--step", "100", "--rank=-1"}, 2, "--rank must be a rank number >= 0");
  ExpectError({"--root", root_, "--step", "100", "--rank", "x"}, 2,
              "bad value 'x' for --rank: expected an integer");
  ExpectError({"--root", root_, "--rank", "0"}, 2, "--rank needs --step N or --latest");
  ExpectError({"--root", root_, "--list", "--rank", "0"}, 2, "--list and --verify always cover");
  ExpectError({"--root", root_, "--verify", "--rank", "0"}, 2, "drop --rank");
  ExpectError({"--root", root_, "--latest", "--verify", "--rank", "0"}, 2, "drop --rank");
  ExpectError({"--root", root_, "--verify", "--all", "--rank", "0"}, 2, "drop --rank");
  const std::string hf = scratch_.Join("hf");
  ExpectError({"--root", root_, "--latest", "--strip-prefix", "model."}, 2, "go with --export-hf DIR");
  ExpectError({"--root", root_, "--latest", "--export-hf", hf, "--out", hf}, 2, "give one");
  ExpectError({"--root", root_, "--export-hf", hf}, 2, "--export-hf needs --step N or --latest");
  ExpectError({"--root", root_, "--verify", "--export-hf", hf}, 2, "--export-hf exports one checkpoint");
  ExpectError({"--root", root_, "--latest", "--export-hf", hf, "--max-shard-size", "5 parsecs"}, 2,
              "not a shard size");
  ExpectError({"--root", root_, "--latest", "--export-hf", hf, "--max-shard-size", "0"}, 2, "not a shard size");
  ExpectError({"--root", root_, "--latest", "--export-hf", hf, "--dtype", "int8"}, 2,
              "--dtype must be float16, bfloat16, float32 or float64");
  ExpectError({"--root", root_, "--latest", "--export-hf", hf, "--strip-prefix", "nothing."}, 2,
              "no tensor name starts with \"nothing.\"");
  ExpectError({"--root", root_, "--latest", "--export-hf", hf, "--copy", scratch_.Join("missing.json")}, 2,
              "missing.json");
  ExpectError({"--root", root_, "--latest", "--export-hf", scratch_.path()}, 2, "exists; not overwriting it");
  struct stat st;
  EXPECT_NE(stat(hf.c_str(), &st), 0) << "a failed export left " << hf;
}

TEST_F(CkptRestoreTest, MissingThingsExit3) {
  ExpectError({"--root", scratch_.Join("nope"), "--list"}, 3, "does not exist");
  { std::ofstream(scratch_.Join("file")) << "x"; }
  ExpectError({"--root", scratch_.Join("file"), "--list"}, 3, "not a directory");
  ASSERT_EQ(mkdir(root_.c_str(), 0755), 0);
  ExpectError({"--root", root_, "--list"}, 3, "no committed checkpoints");
  ExpectError({"--root", root_, "--latest", "--verify"}, 3, "no committed checkpoints");
  Save({100, 200});
  ExpectError({"--root", root_, "--step", "999"}, 3, "no checkpoint at step 999");
  ExpectError({"--root", root_, "--verify", "--step", "150"}, 3, "it has steps 100, 200");
}

// Every flag of ckpt-restore, in --help's order.
const std::vector<std::string> kRestoreFlags = {
    "root",   "list",      "verify",       "step",           "latest", "all",  "rank",    "json",
    "out",    "filter",    "export-hf",    "strip-prefix",   "max-shard-size", "dtype", "copy", "progress"};

// Every flag works in each way it may be spelled: --flag VALUE, --flag=VALUE,
// -flag VALUE, a boolean as --flag or --flag=true. ckpt-restore's flag names
// are single words, so their dashed and underscore spellings are the same
// string; ckpt-retain's two-word flags are tested both ways in
// retention_test.cc. "{OUT}" stands for a fresh output path.
TEST_F(CkptRestoreTest, EveryFlagWorksInEverySpelling) {
  Save({100, 200, 300});
  struct Case {
    std::string flag;
    std::vector<std::vector<std::string>> spellings;  // after --root ROOT (but for "root")
    std::string out;  // stdout shows the flag took effect
    std::string err;  // ... or stderr does
  };
  const std::vector<Case> cases = {
      {"root",
       {{"--root", root_, "--list"},
        {"--root=" + root_, "--list"},
        {"-root", root_, "--list"},
        {root_, "--list"},
        {"--list", "--", root_}},
       "300*", ""},
      {"list", {{"--list"}, {"--list=true"}, {"-list"}, {"--list=1"}}, "300*", ""},
      {"verify", {{"--verify"}, {"--verify=true"}, {"--verify=yes"}}, "step 200: ok", ""},
      {"step", {{"--step", "200"}, {"--step=200"}, {"-step", "200"}, {"-step=200"}},
       "step 200  ", ""},
      {"latest", {{"--latest"}, {"--latest=true"}, {"-latest"}}, "step 300  ", ""},
      {"all", {{"--verify", "--all"}, {"--verify", "--all=true"}, {"--verify", "-all"}},
       "step 100: ok", ""},
      {"rank",
       {{"--step", "200", "--rank", "0"},
        {"--step", "200", "--rank=0"},
        {"--step", "200", "-rank", "0"},
        {"--step=200", "-rank=0"}},
       "step 200  ", ""},
      {"json", {{"--list", "--json"}, {"--list", "--json=true"}, {"--list", "-json"}},
       "\"step\":100", ""},
      {"out",
       {{"--step", "200", "--out", "{OUT}"},
        {"--step", "200", "--out={OUT}"},
        {"--step", "200", "-out", "{OUT}"}},
       ": step 200, 4 tensors,", ""},
      {"filter",
       {{"--step", "200", "--out", "{OUT}", "--filter", "optim."},
        {"--step", "200", "--out", "{OUT}", "--filter=optim."},
        {"--step", "200", "--out", "{OUT}", "-filter", "optim."}},
       ": step 200, 1 tensors,", ""},
      {"export-hf",
       {{"--step", "200", "--export-hf", "{OUT}"},
        {"--step", "200", "--export-hf={OUT}"},
        {"--step", "200", "-export-hf", "{OUT}"}},
       ": step 200, 4 tensors in 1 safetensors file, 792 bytes of tensors\n", ""},
      {"strip-prefix",
       {{"--step", "200", "--export-hf", "{OUT}", "--strip-prefix", "optim."},
        {"--step", "200", "--export-hf", "{OUT}", "--strip-prefix=optim."},
        {"--step", "200", "--export-hf", "{OUT}", "-strip_prefix", "optim."}},
       ": step 200, 1 tensors in 1 safetensors file, 8 bytes", ""},
      {"max-shard-size",
       {{"--step", "200", "--export-hf", "{OUT}", "--max-shard-size", "300"},
        {"--step", "200", "--export-hf", "{OUT}", "--max-shard-size=1KiB"},
        {"--step", "200", "--export-hf", "{OUT}", "-max_shard_size", "300B"}},
       "4 tensors in ", ""},
      {"dtype",
       {{"--step", "200", "--export-hf", "{OUT}", "--dtype", "float16"},
        {"--step", "200", "--export-hf", "{OUT}", "--dtype=float16"},
        {"--step", "200", "--export-hf", "{OUT}", "-dtype", "float16"}},
       "4 tensors in 1 safetensors file, 408 bytes of tensors\n", ""},
      {"copy",
       {{"--step", "200", "--export-hf", "{OUT}", "--copy", "{CONFIG}"},
        {"--step", "200", "--export-hf", "{OUT}", "--copy={CONFIG}"},
        {"--step", "200", "--export-hf", "{OUT}", "-copy", "{CONFIG}"}},
       ", 1 file copied\n", ""},
      {"progress",
       {{"--verify", "--progress", "always"},
        {"--verify", "--progress=always"},
        {"--verify", "-progress", "always"}},
       "step 300: ok", "verifying"},
  };
  const std::string config = scratch_.Join("config.json");
  { std::ofstream(config) << "{}"; }
  std::vector<std::string> covered;
  int outputs = 0;
  for (const Case& c : cases) {
    covered.push_back(c.flag);
    std::string first;
    for (const std::vector<std::string>& spelling : c.spellings) {
      std::vector<std::string> args;
      if (c.flag != "root") args = {"--root", root_};
      bool writes = false;
      for (std::string arg : spelling) {
        arg = absl::StrReplaceAll(arg, {{"{CONFIG}", config}});
        if (absl::StrContains(arg, "{OUT}")) {
          arg = absl::StrReplaceAll(
              arg, {{"{OUT}", scratch_.Join(absl::StrCat("out", ++outputs, ".safetensors"))}});
          writes = true;
        }
        args.push_back(arg);
      }
      SCOPED_TRACE(absl::StrJoin(args, " "));
      const RunResult r = Run(args);
      ASSERT_EQ(r.exit_code, 0) << r;
      EXPECT_TRUE(Contains(r.out, c.out));
      if (!c.err.empty()) EXPECT_TRUE(Contains(r.err, c.err));
      if (writes) continue;  // stdout names the file
      if (first.empty()) {
        first = r.out;
      } else {
        EXPECT_EQ(r.out, first);
      }
    }
  }
  EXPECT_EQ(covered, kRestoreFlags);  // every flag, nothing more
}

TEST_F(CkptRestoreTest, UnknownOrMalformedFlagsExit2NamingTheFlag) {
  Save({100});
  const RunResult r = Run({"--root", root_, "--list", "--keep-last", "5"});
  EXPECT_EQ(r.exit_code, 2) << r;
  EXPECT_EQ(r.out, "");
  EXPECT_EQ(r.err, "ckpt-restore: unknown flag --keep-last (see --help)\n");
  ExpectError({"--root", root_, "--lst"}, 2, "unknown flag --lst (see --help)");
  ExpectError({"--root", root_, "--list", "--no-json=true"}, 2, "--no-json takes no value");
  ExpectError({"--root", root_, "--step=abc"}, 2,
              "bad value 'abc' for --step: expected an integer (see --help)");
  ExpectError({"--root", root_, "--step", "1.5"}, 2, "bad value '1.5' for --step");
  ExpectError({"--root", root_, "--list=maybe"}, 2, "bad value 'maybe' for --list");
  ExpectError({"--root", root_, "--list", "--json=2"}, 2, "bad value '2' for --json");
  ExpectError({"--root", root_, "--latest", "--out"}, 2, "--out needs a value (see --help)");
  ExpectError({"--root", root_, "--verify", "--progress=sometimes"}, 2, "(see --help)");
  // Negated booleans, as absl flags took them: --nojson, --no-json.
  RunResult plain = Run({"--root", root_, "--list", "--json", "--nojson"});
  EXPECT_EQ(plain.exit_code, 0) << plain;
  EXPECT_TRUE(Contains(plain.out, "STEP"));
  plain = Run({"--root", root_, "--list", "--json", "--no-json"});
  EXPECT_EQ(plain.exit_code, 0) << plain;
  EXPECT_TRUE(Contains(plain.out, "STEP"));
}

TEST_F(CkptRestoreTest, HelpDescribesEveryFlagAndExitCode) {
  const RunResult r = Run({"--help"});
  ASSERT_EQ(r.exit_code, 0) << r;
  // Every flag of the tool, each on its own line, followed by its help text.
  for (const char* flag : {"--root DIR", "--list", "--verify", "--step N", "--latest", "--all",
                           "--rank R", "--json", "--out FILE", "--filter PREFIX", "--progress WHEN",
                           "--help"}) {
    const std::string line = absl::StrCat("\n  ", flag, "\n      ");
    EXPECT_TRUE(Contains(r.out, line)) << flag;
  }
  for (const std::string& flag : kRestoreFlags) {
    EXPECT_TRUE(Contains(r.out, absl::StrCat("\n  --", flag))) << flag;
  }
  // -h, and --help after other flags, print the same text and exit 0.
  for (const std::vector<std::string>& args :
       std::vector<std::vector<std::string>>{{"-h"}, {"--root", root_, "--list", "--help"}}) {
    const RunResult again = Run(args);
    EXPECT_EQ(again.exit_code, 0) << again;
    EXPECT_EQ(again.out, r.out);
    EXPECT_EQ(again.err, "");
  }
  EXPECT_TRUE(Contains(r.out, "--list --verify"));
  EXPECT_TRUE(Contains(r.out, "auto"));
  EXPECT_TRUE(Contains(r.out, "Exit codes:"));
  for (const char* code : {"\n  0  ", "\n  1  ", "\n  2  ", "\n  3  ", "\n  4  "}) {
    EXPECT_TRUE(Contains(r.out, code));
  }
}

}  // namespace
}  // namespace ckpt::restore_test
