// tools/common/cli_flags.h: the command-line flags of ckpt-restore and ckpt-retain.
//
// `FlagSet` holds a tool's flags, each under its documented dashed name
// ("keep-last"), and parses argv the way users type it:
//
//   --keep-last=5   --keep-last 5   --keep_last 5   -keep-last 5
//   --dry-run   --dry-run=true   --dry-run=false   --no-dry-run   --nodry_run
//   --  (everything after it is a positional argument)
//
// Underscores and dashes in a name are interchangeable, so the underscore
// spellings of earlier releases keep working. Values are parsed by Abseil's
// flag marshalling (`absl::ParseFlag`), as they were when the tools used
// absl flags: integers, `absl::Duration` ("24h", "90m"), booleans
// (true/false, 1/0, yes/no), `std::optional<T>` (empty means unset).
//
// Errors are one line that names the flag as the user typed it and ends with
// "(see --help)"; the tools exit with status 2 on them. Nothing here exits or
// prints.
#ifndef CKPT_TOOLS_COMMON_CLI_FLAGS_H_
#define CKPT_TOOLS_COMMON_CLI_FLAGS_H_

#include <functional>
#include <optional>
#include <string>
#include <type_traits>
#include <vector>

#include "absl/flags/marshalling.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace ckpt::tools {

class FlagSet {
 public:
  // A boolean flag: `--name` sets it, `--name=false`, `--no-name` and
  // `--noname` clear it.
  void AddBool(absl::string_view name, bool* value, absl::string_view help);

  // A flag that takes a value, shown in the help as `--name VALUE_NAME`.
  // `T` is any type `absl::ParseFlag` parses. `*value` keeps its default
  // unless the flag is given; given twice, the last one wins.
  template <typename T>
  void Add(absl::string_view name, absl::string_view value_name, T* value,
           absl::string_view help) {
    AddFlag(name, value_name, help, [value](absl::string_view text, std::string* error) {
      if (absl::ParseFlag(text, value, error)) return true;
      if (error->empty()) *error = Expected(value);
      return false;
    });
  }

  // Parses `argv[1..argc)`. Returns the positional arguments in order (the
  // ones after "--" included), or kInvalidArgument naming the first problem:
  // an unknown flag, a missing or malformed value, or a value given to a
  // negated boolean. Flags parsed before the problem keep their new values.
  absl::StatusOr<std::vector<std::string>> Parse(int argc, const char* const* argv) const;

  // One entry per flag, in the order they were added, then --help:
  //   "  --name VALUE\n" and the help text wrapped to 80 columns, indented 6.
  std::string Help() const;

  // The dashed names of the flags, in the order they were added.
  std::vector<std::string> Names() const;

 private:
  using ParseFn = std::function<bool(absl::string_view text, std::string* error)>;
  struct Flag {
    std::string name;        // dashed
    std::string value_name;  // "" for a boolean
    std::string help;
    bool is_bool = false;
    ParseFn parse;
  };

  // What a malformed value should have been, for the error message.
  template <typename T>
  static std::string Expected(const T*) {
    if constexpr (std::is_same_v<T, bool>) return "expected true or false";
    if constexpr (std::is_integral_v<T>) return "expected an integer";
    if constexpr (std::is_same_v<T, absl::Duration>) {
      return "expected a duration such as 24h, 90m, 1h30m or 45s";
    }
    return "";
  }
  template <typename T>
  static std::string Expected(const std::optional<T>*) {
    return Expected(static_cast<const T*>(nullptr));
  }

  void AddFlag(absl::string_view name, absl::string_view value_name, absl::string_view help,
               ParseFn parse, bool is_bool = false);
  // The flag spelled `name` (dashes or underscores), or nullptr.
  const Flag* Find(absl::string_view name) const;

  std::vector<Flag> flags_;
};

// Whether the arguments before any "--" ask for help: -h, --help, -help,
// --helpfull or --helpshort.
bool WantsHelp(int argc, const char* const* argv);

// Appends `text` to `out` wrapped at `width` columns, each line indented by
// `indent` spaces.
void AppendWrapped(absl::string_view text, size_t indent, size_t width, std::string* out);

}  // namespace ckpt::tools

#endif  // CKPT_TOOLS_COMMON_CLI_FLAGS_H_
