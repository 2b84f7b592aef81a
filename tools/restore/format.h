// tools/restore/format.h: text helpers for ckpt-restore's human-readable output.
#ifndef CKPT_TOOLS_RESTORE_FORMAT_H_
#define CKPT_TOOLS_RESTORE_FORMAT_H_

#include <cstdint>
#include <ostream>
#include <span>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "ckpt/maintenance.h"  // HumanBytes: "512 B", "1.5 KiB", "3.2 GiB"

namespace ckpt::tools {

using ckpt::HumanBytes;

// `FormatUtc` spells a time since the epoch as "2024-05-01 12:00:00Z", or "-"
// for 0 (unknown).
std::string FormatUtc(int64_t unix_ns);

// `FormatShape` spells a shape as "[4, 8]"; a scalar is "[]".
std::string FormatShape(std::span<const int64_t> shape);

// `StatusText` is "DATA_LOSS: <message>" on one line (newlines in the message
// become spaces), so that every failure prints as exactly one line.
std::string StatusText(const absl::Status& status);

// `Table` prints rows in aligned columns, two spaces apart. The last column is
// never padded, so a long status message does not widen the table.
class Table {
 public:
  // `right_align[i]` right-aligns column i (numbers); missing entries are false.
  explicit Table(std::vector<std::string> header, std::vector<bool> right_align = {});

  // REQUIRES: `row` has as many cells as the header.
  void AddRow(std::vector<std::string> row);
  void Print(std::ostream& out) const;

 private:
  std::vector<std::vector<std::string>> rows_;  // rows_[0] is the header
  std::vector<bool> right_align_;
};

}  // namespace ckpt::tools

#endif  // CKPT_TOOLS_RESTORE_FORMAT_H_
