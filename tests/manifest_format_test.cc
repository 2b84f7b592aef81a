// Which format a manifest is in is read from its "format_version" member,
// not from how its text starts (format/global_manifest.h).
#include <gtest/gtest.h>

#include "format/global_manifest.h"
#include "format/manifest.h"

namespace ckpt::internal {
namespace {

TEST(ManifestFormatTest, VersionIsFoundWhereverItStands) {
  EXPECT_EQ(ManifestFormatVersion(R"({"format_version": 2, "step": 1})"), 2);
  EXPECT_EQ(ManifestFormatVersion("{\n\n   \"format_version\"  :\t1 }"), 1);
  // Not first, after nested members that hold a "format_version" of their own.
  EXPECT_EQ(ManifestFormatVersion(
                R"({"extras": {"format_version": 7, "list": [1, {"format_version": 9}]}, "format_version": 2})"),
            2);
  EXPECT_TRUE(IsGlobalManifest(R"({"step": 3, "format_version": 2})"));
  EXPECT_FALSE(IsGlobalManifest(R"({"step": 3, "format_version": 1})"));
}

TEST(ManifestFormatTest, NoIntegerVersionIsNone) {
  for (const char* text : {"", "[]", "not json", R"({"format_version": "2"})", R"({"format_version": 2.5})",
                           R"({"format_version": null})", R"({"step": 2})", R"([{"format_version": 2}])",
                           R"({"format_version": {"v": 2}})"}) {
    EXPECT_FALSE(ManifestFormatVersion(text).has_value()) << text;
    EXPECT_FALSE(IsGlobalManifest(text)) << text;
  }
}

TEST(ManifestFormatTest, WrittenManifestsAreTold) {
  GlobalManifest global;
  global.step = 5;
  global.world_size = 1;
  global.ranks.resize(1);
  global.ranks[0].manifest = "rank-00000.MANIFEST.json";
  auto global_text = SerializeGlobalManifest(&global);
  ASSERT_TRUE(global_text.ok()) << global_text.status();
  EXPECT_TRUE(IsGlobalManifest(*global_text));
  Manifest single;
  single.step = 5;
  auto single_text = SerializeManifest(&single);
  ASSERT_TRUE(single_text.ok()) << single_text.status();
  EXPECT_FALSE(IsGlobalManifest(*single_text));
  EXPECT_EQ(ManifestFormatVersion(*single_text), single.format_version);
}

}  // namespace
}  // namespace ckpt::internal
