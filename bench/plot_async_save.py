#!/usr/bin/python3
"""Draws the async_save bench: blocked time per save, ckpt vs torch.save.

Usage: plot_async_save.py RESULTS.jsonl OUT_DIR
Writes OUT_DIR/async_save.png and OUT_DIR/async_save.md.
"""
import json
import os
import sys


def main() -> int:
    src, out = sys.argv[1], sys.argv[2]
    os.makedirs(out, exist_ok=True)
    lines = [json.loads(l) for l in open(src) if l.strip()]
    main_line = next(l for l in lines if l.get("bench") == "async_save" and "case" not in l)
    small = next((l for l in lines if l.get("case") == "small_tensors"), None)
    rows = [
        ("state", f"{main_line['bytes'] / 1e9:.2f} GB, {main_line['tensors']} tensors"),
        ("SaveAsync blocked (steady, median)", f"{main_line['blocked_s']:.3f} s"),
        ("SaveAsync blocked (first, cold pool)", f"{main_line['cold_blocked_s']:.3f} s"),
        ("memcpy of the same bytes (timed before each save, median)", f"{main_line['memcpy_s']:.3f} s"),
        ("blocked / memcpy (median of per-save ratios)", f"{main_line['blocked_over_memcpy']:.2f}"),
        ("same, writes overlapping the copy", f"{main_line.get('overlapped_blocked_over_memcpy')}"),
        ("torch.save (median)", f"{main_line['torch_save_s']} s"),
        ("torch.save / blocked", f"{main_line['torch_save_over_blocked']}"),
        ("SaveAsync blocked, lazy mode (median)", f"{main_line.get('lazy_blocked_s', 0) * 1000:.2f} ms"),
        ("torch.save / lazy blocked", f"{main_line.get('torch_save_over_lazy_blocked')}"),
        (f"lazy, loop held per save (SaveAsync + WaitStaged after {main_line.get('lazy_compute_s')} s compute)",
         f"{main_line.get('lazy_loop_blocked_s', 0) * 1000:.2f} ms"),
        ("torch.save / lazy loop held", f"{main_line.get('torch_save_over_lazy_loop_blocked')}"),
        ("durable throughput", f"{main_line['persist_gbps']:.2f} GB/s"),
        ("fio O_DIRECT write", f"{main_line['fio_write_gbps']} GB/s"),
        ("durable / fio (median of per-save ratios)", f"{main_line['persist_over_fio']}"),
        ("same, writes overlapping the copy", f"{main_line.get('overlapped_persist_over_fio')}"),
        ("same, lazy mode", f"{main_line.get('lazy_persist_over_fio')}"),
    ]
    if small:
        rows.append(("10k small tensors: per-byte cost / 150 large", f"{small['per_byte_cost_over_large']}"))
    with open(os.path.join(out, "async_save.md"), "w") as f:
        f.write("| measure | value |\n|---|---|\n")
        for k, v in rows:
            f.write(f"| {k} | {v} |\n")
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib missing: table only", file=sys.stderr)
        return 0
    ckpt_s = main_line["blocked_series_s"]
    torch_s = main_line.get("torch_save_series_s") or []
    fig, ax = plt.subplots(figsize=(7, 4))
    ax.bar([f"ckpt #{i + 1}" for i in range(len(ckpt_s))], ckpt_s, color="tab:blue", label="ckpt SaveAsync (blocked)")
    if main_line.get("lazy_blocked_s"):
        ax.bar(["ckpt lazy"], [main_line["lazy_blocked_s"]], color="tab:green", label="ckpt SaveAsync, lazy (blocked)")
    if main_line.get("lazy_loop_blocked_s"):
        ax.bar(["ckpt lazy loop"], [main_line["lazy_loop_blocked_s"]], color="tab:olive",
               label="ckpt lazy: SaveAsync + WaitStaged after compute")
    ax.bar([f"torch #{i + 1}" for i in range(len(torch_s))], torch_s, color="tab:red", label="torch.save")
    ax.set_yscale("log")
    ax.set_ylabel("seconds the training loop waits (log)")
    ax.set_title(f"Blocked time per save, {main_line['bytes'] / 1e9:.2f} GB state")
    ax.legend(loc="lower left", fontsize=8)
    plt.xticks(rotation=45, ha="right")
    fig.tight_layout()
    fig.savefig(os.path.join(out, "async_save.png"), dpi=100)
    print(f"wrote {out}/async_save.png and async_save.md", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
