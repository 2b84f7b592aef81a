#include "object/s3_xml.h"

#include <expat.h>

#include "absl/strings/str_cat.h"

namespace ckpt::internal {
namespace {

constexpr size_t kMaxDepth = 64;
constexpr size_t kMaxBytes = size_t{64} << 20;

struct Builder {
  XmlNode root;
  std::vector<XmlNode*> stack;
  bool too_deep = false;
};

void OnStart(void* user, const XML_Char* name, const XML_Char** /*attributes*/) {
  auto* b = static_cast<Builder*>(user);
  if (b->stack.size() >= kMaxDepth) {
    b->too_deep = true;
    return;
  }
  XmlNode* parent = b->stack.back();
  parent->children.push_back(XmlNode{name, "", {}});
  b->stack.push_back(&parent->children.back());
}

void OnEnd(void* user, const XML_Char* /*name*/) {
  auto* b = static_cast<Builder*>(user);
  if (b->too_deep) return;
  b->stack.pop_back();
}

void OnText(void* user, const XML_Char* text, int size) {
  auto* b = static_cast<Builder*>(user);
  if (b->too_deep) return;
  b->stack.back()->text.append(text, size);
}

}  // namespace

const XmlNode* XmlNode::Child(absl::string_view child) const {
  for (const XmlNode& c : children) {
    if (c.name == child) return &c;
  }
  return nullptr;
}

std::string XmlNode::ChildText(absl::string_view child) const {
  const XmlNode* c = Child(child);
  return c != nullptr ? c->text : std::string();
}

absl::StatusOr<XmlNode> ParseXml(absl::string_view xml, absl::string_view what) {
  if (xml.size() > kMaxBytes) {
    return absl::DataLossError(absl::StrCat(what, ": XML response of ", xml.size(), " bytes"));
  }
  Builder b;
  b.stack.push_back(&b.root);
  XML_Parser parser = XML_ParserCreate("UTF-8");
  XML_SetUserData(parser, &b);
  XML_SetElementHandler(parser, OnStart, OnEnd);
  XML_SetCharacterDataHandler(parser, OnText);
  const XML_Status status = XML_Parse(parser, xml.data(), static_cast<int>(xml.size()), 1);
  std::string error;
  if (status != XML_STATUS_OK) {
    error = absl::StrCat(XML_ErrorString(XML_GetErrorCode(parser)), " at line ",
                         XML_GetCurrentLineNumber(parser));
  }
  XML_ParserFree(parser);
  if (!error.empty()) return absl::DataLossError(absl::StrCat(what, ": malformed XML: ", error));
  if (b.too_deep) return absl::DataLossError(absl::StrCat(what, ": XML nested too deep"));
  if (b.root.children.size() != 1) {
    return absl::DataLossError(absl::StrCat(what, ": XML without one root element"));
  }
  XmlNode top = std::move(b.root.children.front());
  return top;
}

std::string XmlEscape(absl::string_view text) {
  std::string out;
  for (char c : text) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&quot;"; break;
      case '\'': out += "&apos;"; break;
      default: out.push_back(c);
    }
  }
  return out;
}

}  // namespace ckpt::internal
