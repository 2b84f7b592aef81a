#include "engine/metrics.h"

#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "format/json_forms.h"
#include "absl/strings/str_format.h"
#include "io/small_file.h"
#include "util/status_macros.h"

namespace ckpt::internal {

std::string SaveMetricsLine(const SaveStats& s, const absl::Status& status) {
  nlohmann::ordered_json j;
  j["outcome"] = s.skipped ? "skipped" : status.ok() ? "committed" : "failed";
  if (!status.ok()) j["error"] = std::string(status.ToString());
  j.update(SaveStatsObject(s));
  return DumpJson(j);
}

std::string PrometheusText(const EngineStats& s, const std::string& root) {
  std::string label = root;
  std::string escaped;
  for (char c : label) {
    if (c == '\\' || c == '"') escaped.push_back('\\');
    if (c == '\n') { escaped += "\\n"; continue; }
    escaped.push_back(c);
  }
  const std::string l = absl::StrCat("{root=\"", escaped, "\"}");
  std::string out;
  auto metric = [&](const char* name, const char* type, const char* help, double value) {
    absl::StrAppend(&out, "# HELP ckpt_", name, " ", help, "\n# TYPE ckpt_", name, " ", type,
                    "\nckpt_", name, l, " ", absl::StrFormat("%.9g", value), "\n");
  };
  metric("saves_started_total", "counter", "Saves started.", s.saves_started);
  metric("saves_committed_total", "counter", "Saves durably committed.", s.saves_committed);
  metric("saves_failed_total", "counter", "Saves that failed.", s.saves_failed);
  metric("saves_skipped_total", "counter", "Saves skipped because staging memory was busy.", s.saves_skipped);
  metric("bytes_committed_total", "counter", "Shard bytes of committed saves.", s.bytes_committed);
  metric("watchdog_stalls_total", "counter", "Saves that made no progress for the watchdog timeout.", s.watchdog_stalls);
  metric("saves_given_up_total", "counter", "Saves failed after making no progress for the stall timeout.", s.saves_given_up);
  metric("saves_in_flight", "gauge", "Saves started and not finished.", s.saves_in_flight);
  metric("staging_bytes", "gauge", "Size of the staging pool.", s.staging_bytes);
  metric("last_save_step", "gauge", "Step of the last finished save.", s.last.step);
  metric("last_save_blocked_seconds", "gauge", "Time the last save blocked its caller.", s.last.blocked_s);
  metric("last_save_persist_seconds", "gauge", "Time the last save took to reach disk.", s.last.persist_s);
  metric("last_save_persist_gbps", "gauge", "Durable throughput of the last save (1e9 B/s).", s.last.persist_gbps);
  return out;
}

absl::Status MetricsSink::AppendJsonLine(const std::string& line) {
  if (jsonl_ == nullptr) {
    OpenOptions options;
    options.write = true;
    options.create = true;
    CKPT_ASSIGN_OR_RETURN(jsonl_, fs_->Open(jsonl_path_, options));
    CKPT_ASSIGN_OR_RETURN(jsonl_offset_, jsonl_->Size());
  }
  std::string text = line + "\n";
  CKPT_RETURN_IF_ERROR(jsonl_->WriteAt(jsonl_offset_, std::span<const char>(text)));
  jsonl_offset_ += text.size();
  return absl::OkStatus();
}

absl::Status MetricsSink::WritePrometheus(const std::string& text) {
  const std::string temp = prom_path_ + ".tmp";
  (void)fs_->RemoveFile(temp);
  CKPT_RETURN_IF_ERROR(WriteFileDurably(*fs_, temp, text));
  return fs_->Rename(temp, prom_path_, RenameMode::kReplace);
}

}  // namespace ckpt::internal
