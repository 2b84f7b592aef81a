// Save metrics as JSON lines and as a Prometheus textfile.
#ifndef CKPT_ENGINE_METRICS_H_
#define CKPT_ENGINE_METRICS_H_

#include <memory>
#include <string>

#include "absl/status/status.h"
#include "ckpt/engine.h"
#include "ckpt/file_system.h"

namespace ckpt::internal {

// One JSON object (no newline) describing a finished save: "outcome"
// ("committed", "failed" or "skipped"), "error" when it failed, then the
// members of `SaveStatsJson` (ckpt/stats_json.h).
std::string SaveMetricsLine(const SaveStats& stats, const absl::Status& status);

// The engine's figures in the Prometheus text exposition format, metric
// names prefixed `ckpt_`, labelled with the root.
std::string PrometheusText(const EngineStats& stats, const std::string& root);

// Writes metrics through the file-system seam. Used by one thread.
class MetricsSink {
 public:
  MetricsSink(FileSystem* fs, std::string jsonl_path, std::string prom_path)
      : fs_(fs), jsonl_path_(std::move(jsonl_path)), prom_path_(std::move(prom_path)) {}

  // Appends `line` and a newline to the JSON-lines file (created if needed).
  absl::Status AppendJsonLine(const std::string& line);
  // Replaces the Prometheus file atomically (temp file + rename).
  absl::Status WritePrometheus(const std::string& text);

  bool has_jsonl() const { return !jsonl_path_.empty(); }
  bool has_prometheus() const { return !prom_path_.empty(); }

 private:
  FileSystem* const fs_;
  const std::string jsonl_path_;
  const std::string prom_path_;
  std::unique_ptr<File> jsonl_;
  uint64_t jsonl_offset_ = 0;
};

}  // namespace ckpt::internal

#endif  // CKPT_ENGINE_METRICS_H_
