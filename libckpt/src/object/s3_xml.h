// The XML of S3 responses, parsed with expat into a small tree.
#ifndef CKPT_OBJECT_S3_XML_H_
#define CKPT_OBJECT_S3_XML_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace ckpt::internal {

struct XmlNode {
  std::string name;  // as written, without namespace handling
  std::string text;  // character data directly inside
  std::vector<XmlNode> children;

  // The first child named `name`, or nullptr.
  const XmlNode* Child(absl::string_view child) const;
  // Its text, or "" if there is no such child.
  std::string ChildText(absl::string_view child) const;
};

// kDataLoss (naming `what`) for malformed XML, more than 64 levels deep,
// or over 64 MiB.
absl::StatusOr<XmlNode> ParseXml(absl::string_view xml, absl::string_view what);

// XML-escapes `text` (&, <, >, ", ').
std::string XmlEscape(absl::string_view text);

}  // namespace ckpt::internal

#endif  // CKPT_OBJECT_S3_XML_H_
