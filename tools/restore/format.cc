// tools/restore/format.cc: text helpers for ckpt-restore's human-readable output.
#include "restore/format.h"

#include <ctime>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace ckpt::tools {

std::string FormatUtc(int64_t unix_ns) {
  if (unix_ns == 0) return "-";
  const time_t seconds = static_cast<time_t>(unix_ns / 1'000'000'000);
  struct tm tm;
  if (gmtime_r(&seconds, &tm) == nullptr) return absl::StrCat(unix_ns, "ns");
  char text[32];
  if (strftime(text, sizeof(text), "%Y-%m-%d %H:%M:%SZ", &tm) == 0) {
    return absl::StrCat(unix_ns, "ns");
  }
  return text;
}

std::string FormatShape(std::span<const int64_t> shape) {
  return absl::StrCat("[", absl::StrJoin(shape, ", "), "]");
}

std::string StatusText(const absl::Status& status) {
  std::string text = absl::StrCat(absl::StatusCodeToString(status.code()), ": ", status.message());
  for (char& c : text) {
    if (c == '\n' || c == '\r') c = ' ';
  }
  return text;
}

Table::Table(std::vector<std::string> header, std::vector<bool> right_align)
    : right_align_(std::move(right_align)) {
  right_align_.resize(header.size(), false);
  rows_.push_back(std::move(header));
}

void Table::AddRow(std::vector<std::string> row) {
  row.resize(rows_[0].size());
  rows_.push_back(std::move(row));
}

void Table::Print(std::ostream& out) const {
  const size_t columns = rows_[0].size();
  std::vector<size_t> width(columns, 0);
  for (const auto& row : rows_) {
    for (size_t i = 0; i < columns; ++i) width[i] = std::max(width[i], row[i].size());
  }
  for (const auto& row : rows_) {
    std::string line;
    for (size_t i = 0; i < columns; ++i) {
      const bool last = i + 1 == columns;
      const std::string pad(width[i] - row[i].size(), ' ');
      if (right_align_[i]) {
        absl::StrAppend(&line, pad, row[i]);
      } else {
        absl::StrAppend(&line, row[i], last ? "" : pad);
      }
      if (!last) line += "  ";
    }
    out << line << "\n";
  }
}

}  // namespace ckpt::tools
