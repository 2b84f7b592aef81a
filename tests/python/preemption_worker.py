"""A training process that handles preemption (run by test_preemption.py).

    python3 preemption_worker.py ROOT DIR PAD_MB

Trains the model of training.py, saving asynchronously every 3 steps, with
cp.handle_preemption(grace_s=20). After the save of step 9 is started it
writes DIR/ready (the parent then sends SIGTERM). At the first step boundary
where cp.preempted is True it writes DIR/draining, takes a final synchronous
save of that step, writes DIR/result.json and exits 0.
"""
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch  # noqa: E402

import ckpt  # noqa: E402
from training import make_model, state_of, train_step  # noqa: E402


def main():
    root, out, pad_mb = sys.argv[1], sys.argv[2], int(sys.argv[3])
    torch.set_num_threads(1)
    model, optimizer = make_model(seed=0)
    pad = torch.zeros(pad_mb << 18)  # float32: pad_mb MB, so that saves take a while
    cp = ckpt.Checkpointer(root, delta="exact", full_every=4)
    cp.handle_preemption(grace_s=20)
    in_flight = None
    result = {"final": None}
    for step in range(1, 10_000):
        train_step(model, optimizer, step)
        if cp.preempted:
            with open(os.path.join(out, "draining"), "w"):
                pass
            result["in_flight_step"] = in_flight.step if in_flight is not None else None
            result["in_flight_done_at_signal"] = in_flight.done() if in_flight is not None else None
            cp.save(step, {**state_of(model, optimizer, step), "pad": pad})
            result["final"] = step
            break
        if step % 3 == 0:
            pad[step] = step  # the pad changes a little, as weights do
            in_flight = cp.save_async(step, {**state_of(model, optimizer, step), "pad": pad})
            if step == 9:
                with open(os.path.join(out, "ready"), "w"):
                    pass
        time.sleep(0.005)
    cp.close()
    with open(os.path.join(out, "result.json"), "w") as f:
        json.dump(result, f)


if __name__ == "__main__":
    main()
