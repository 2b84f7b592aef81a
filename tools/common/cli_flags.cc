// tools/common/cli_flags.cc: parsing the tools' command lines (see cli_flags.h).
#include "common/cli_flags.h"

#include <utility>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"

namespace ckpt::tools {
namespace {

// `name` with every underscore turned into a dash: the one spelling flags
// are looked up by.
std::string Dashed(absl::string_view name) { return absl::StrReplaceAll(name, {{"_", "-"}}); }

absl::Status UsageError(absl::string_view message) {
  return absl::InvalidArgumentError(absl::StrCat(message, " (see --help)"));
}

}  // namespace

void FlagSet::AddBool(absl::string_view name, bool* value, absl::string_view help) {
  AddFlag(
      name, "", help,
      [value](absl::string_view text, std::string* error) {
        if (absl::ParseFlag(text, value, error)) return true;
        if (error->empty()) *error = Expected(value);
        return false;
      },
      /*is_bool=*/true);
}

void FlagSet::AddFlag(absl::string_view name, absl::string_view value_name,
                      absl::string_view help, ParseFn parse, bool is_bool) {
  flags_.push_back(Flag{Dashed(name), std::string(value_name), std::string(help), is_bool,
                        std::move(parse)});
}

const FlagSet::Flag* FlagSet::Find(absl::string_view name) const {
  const std::string dashed = Dashed(name);
  for (const Flag& flag : flags_) {
    if (flag.name == dashed) return &flag;
  }
  return nullptr;
}

absl::StatusOr<std::vector<std::string>> FlagSet::Parse(int argc,
                                                        const char* const* argv) const {
  std::vector<std::string> positional;
  for (int i = 1; i < argc; ++i) {
    absl::string_view arg = argv[i];
    if (arg == "--") {
      for (++i; i < argc; ++i) positional.emplace_back(argv[i]);
      break;
    }
    if (arg.size() < 2 || arg[0] != '-') {
      positional.emplace_back(arg);
      continue;
    }
    arg.remove_prefix(arg[1] == '-' ? 2 : 1);
    absl::string_view name = arg;
    absl::string_view value;
    const size_t eq = arg.find('=');
    const bool has_value = eq != absl::string_view::npos;
    if (has_value) {
      name = arg.substr(0, eq);
      value = arg.substr(eq + 1);
    }
    const Flag* flag = Find(name);
    bool negated = false;
    if (flag == nullptr && absl::StartsWith(name, "no")) {
      // --noname, --no-name, --no_name
      absl::string_view rest = name.substr(2);
      if (!rest.empty() && (rest[0] == '-' || rest[0] == '_')) rest.remove_prefix(1);
      const Flag* base = Find(rest);
      if (base != nullptr && base->is_bool) {
        flag = base;
        negated = true;
      }
    }
    if (flag == nullptr) return UsageError(absl::StrFormat("unknown flag --%s", name));
    if (flag->is_bool) {
      if (negated && has_value) return UsageError(absl::StrFormat("--%s takes no value", name));
      if (!has_value) value = negated ? "false" : "true";
    } else if (!has_value) {
      if (i + 1 >= argc) {
        return UsageError(absl::StrFormat("--%s needs a value", name));
      }
      value = argv[++i];
    }
    std::string error;
    if (!flag->parse(value, &error)) {
      return UsageError(absl::StrFormat("bad value '%s' for --%s%s%s", value, name,
                                        error.empty() ? "" : ": ", error));
    }
  }
  return positional;
}

std::string FlagSet::Help() const {
  std::string text;
  for (const Flag& flag : flags_) {
    absl::StrAppendFormat(&text, "  --%s%s%s\n", flag.name, flag.value_name.empty() ? "" : " ",
                          flag.value_name);
    AppendWrapped(flag.help, 6, 80, &text);
  }
  text += "  --help\n      Print this text and exit 0 (also -h).\n";
  return text;
}

std::vector<std::string> FlagSet::Names() const {
  std::vector<std::string> names;
  for (const Flag& flag : flags_) names.push_back(flag.name);
  return names;
}

bool WantsHelp(int argc, const char* const* argv) {
  for (int i = 1; i < argc; ++i) {
    const absl::string_view arg = argv[i];
    if (arg == "--") return false;
    if (arg == "-h" || arg == "--help" || arg == "-help" || arg == "--helpfull" ||
        arg == "--helpshort") {
      return true;
    }
  }
  return false;
}

void AppendWrapped(absl::string_view text, size_t indent, size_t width, std::string* out) {
  const std::string pad(indent, ' ');
  std::string line;
  for (absl::string_view word : absl::StrSplit(text, ' ', absl::SkipEmpty())) {
    if (!line.empty() && pad.size() + line.size() + 1 + word.size() > width) {
      absl::StrAppendFormat(out, "%s%s\n", pad, line);
      line.clear();
    }
    if (!line.empty()) line += ' ';
    line.append(word.data(), word.size());
  }
  if (!line.empty()) absl::StrAppendFormat(out, "%s%s\n", pad, line);
}

}  // namespace ckpt::tools
