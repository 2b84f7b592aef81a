"""The GPT sizes the Python benches train, in one place.

Full: ~1.4 GB of state (GPT-2 small's shapes); --quick: ~240 MB; and the
smoke run (CKPT_BENCH_SMOKE=1, set by `bench/run_all.sh --smoke`, which
`tools/test.sh --full` runs): a ~1 MB model that takes seconds. A smoke run
proves a bench still runs end to end; its figures measure nothing.
"""
import os

SMOKE = os.environ.get("CKPT_BENCH_SMOKE") == "1"


def gpt_sizes(quick):
    if SMOKE:
        return dict(vocab=1024, d=64, layers=1, heads=2)
    if quick:
        return dict(vocab=16384, d=384, layers=4, heads=6)
    return dict(vocab=50257, d=768, layers=6, heads=12)
