#!/usr/bin/python3
"""Draws the peers bench: ckpt vs torch.save and DCP, per saver.

Usage: plot_peers.py RESULTS.jsonl OUT_DIR
Writes OUT_DIR/peers.png (stall per save and time to durable, one bar each per
saver) and OUT_DIR/peers.md (the table docs/tuning.md carries).
"""
import json
import os
import sys

SAVERS = [("torch_save", "torch.save + fsync"), ("dcp_save", "dcp.save"),
          ("dcp_save_threads", "dcp.save, {t} writer threads"), ("dcp_async", "dcp.async_save (default stager)"),
          ("dcp_async_sync_stager", "dcp.async_save, reused sync stager"),
          ("dcp_async_async_stager", "dcp.async_save, async staging"), ("ckpt", "ckpt eager"),
          ("ckpt_lazy", "ckpt lazy")]


def fmt(x, unit="", digits=2):
    return "—" if x is None else f"{x:.{digits}f}{unit}"


def main() -> int:
    src, out = sys.argv[1], sys.argv[2]
    os.makedirs(out, exist_ok=True)
    line = next(json.loads(l) for l in open(src) if l.strip() and json.loads(l).get("bench") == "peers")
    names = [(k, label.format(t=line.get("dcp_threads"))) for k, label in SAVERS if f"{k}_stall_s" in line]
    rows = ["| saver | stall per save (s) | first save stall (s) | time to durable (s) | on disk (GB) "
            "| extra peak RSS (GB) |", "|---|---|---|---|---|---|"]
    for k, label in names:
        rows.append(f"| {label} | {fmt(line[f'{k}_stall_s'], digits=3)} | {fmt(line[f'{k}_first_stall_s'], digits=3)} "
                    f"| {fmt(line[f'{k}_durable_s'])} | {fmt(line[f'{k}_disk_bytes'] / 1e9, digits=3)} "
                    f"| {fmt(line[f'{k}_peak_rss_extra_bytes'] / 1e9, digits=3)} |")
    rows += ["", "| cold restore | s |", "|---|---|"]
    for k, label in [("torch_load", "torch.load"), ("dcp_load", "dcp.load (in place)"),
                     ("ckpt_load", "ckpt.load (fresh tensors)"), ("ckpt_load_into", "ckpt.load(into=)")]:
        if f"{k}_s" in line:
            rows.append(f"| {label} | {fmt(line[f'{k}_s'])} |")
    rows += ["", "| ratio | value | goal |", "|---|---|---|"]
    for k, goal in [("ckpt_blocked_over_dcp_async", "≤ 0.5"), ("ckpt_blocked_over_dcp_async_default_stager", ""),
                    ("ckpt_blocked_over_dcp_async_sync_stager", ""),
                    ("ckpt_lazy_blocked_over_dcp_async", "≤ 0.5"),
                    ("durable_over_dcp_save", "≤ 0.67"), ("restore_speedup_over_dcp_load", "≥ 2"),
                    ("rss_over_dcp_async", "≤ 1"), ("ckpt_blocked_over_torch_save", ""),
                    ("fresh_restore_speedup_over_torch_load", ""), ("disk_over_dcp_save", "")]:
        rows.append(f"| {k} | {fmt(line.get(k))} | {goal} |")
    with open(os.path.join(out, "peers.md"), "w") as f:
        f.write(f"State: {line['bytes'] / 1e9:.2f} GB in {line['tensors']} tensors; torch {line['torch_version']}\n\n")
        f.write("\n".join(rows) + "\n")
    print("\n".join(rows), file=sys.stderr)

    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5))
    labels = [label for _, label in names]
    for ax, key, title in [(axes[0], "stall_s", "loop stall per save (s, median)"),
                           (axes[1], "durable_s", "save call to durable (s, median)")]:
        vals = [line[f"{k}_{key}"] for k, _ in names]
        colors = ["tab:green" if k.startswith("ckpt") else "tab:gray" for k, _ in names]
        ax.barh(labels, vals, color=colors)
        ax.invert_yaxis()
        ax.set_title(title)
        for y, v in enumerate(vals):
            ax.text(v, y, f" {v:.3f}" if v < 1 else f" {v:.2f}", va="center", fontsize=8)
    fig.suptitle(f"ckpt vs peers: {line['bytes'] / 1e9:.2f} GB GPT + AdamW state, torch {line['torch_version']}")
    fig.tight_layout()
    fig.savefig(os.path.join(out, "peers.png"), dpi=110)
    return 0


if __name__ == "__main__":
    sys.exit(main())
