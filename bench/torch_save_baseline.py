#!/usr/bin/env python3
"""torch.save baseline for the async_save bench.

Builds the same tensors as the C++ bench (shapes and dtypes from a JSON spec
file), warms up once, then times `torch.save` of the whole state dict to a
fresh file on the same directory, `--reps` times. torch.save blocks the caller
for the whole serialize+write (and does not fsync); that wall time is what a
training loop waits. Prints one JSON object: {"torch_save_s": [...], ...}.
Run with the python3 that has torch (the PyPI build).
"""
import argparse
import json
import os
import sys
import time


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--spec", required=True, help="JSON: [{name, dtype, shape}]")
    parser.add_argument("--dir", required=True)
    parser.add_argument("--reps", type=int, default=3)
    args = parser.parse_args()
    try:
        import torch
    except ImportError as e:  # reported, not fatal: the bench prints null
        print(json.dumps({"torch_save_s": None, "skipped": f"no torch: {e}"}))
        return 0
    dtypes = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16,
              "float64": torch.float64, "int64": torch.int64, "int32": torch.int32,
              "uint8": torch.uint8, "int8": torch.int8, "bool": torch.bool}
    with open(args.spec) as f:
        spec = json.load(f)
    torch.manual_seed(0)
    state = {}
    for t in spec:
        x = torch.empty(t["shape"], dtype=dtypes[t["dtype"]])
        x.view(-1)[:].fill_(1) if x.numel() else None  # touch every page once
        state[t["name"]] = x
    os.makedirs(args.dir, exist_ok=True)
    path = os.path.join(args.dir, "torch_save.pt")
    torch.save(state, path)  # warm-up (page cache, allocator)
    os.remove(path)
    times = []
    for _ in range(args.reps):
        start = time.perf_counter()
        torch.save(state, path)
        times.append(time.perf_counter() - start)
        os.remove(path)
    print(json.dumps({"torch_save_s": times, "torch_version": torch.__version__}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
