"""ckpt.hf: Hugging Face transformers' Trainer saving through ckpt.

    from ckpt.hf import CkptCallback

    callback = CkptCallback("/ckpt/run1", delta="exact")
    trainer = transformers.Trainer(model, args, ..., callbacks=[callback])
    trainer.train()
    # after a stop: a Trainer-format directory of the newest step, then the
    # Trainer's own resumption
    trainer.train(resume_from_checkpoint=CkptCallback.resume_dir("/ckpt/run1"))

At each of the Trainer's save steps (args.save_strategy / save_steps) the
callback hands model, optimizer, LR scheduler, RNG states and the
TrainerState to ckpt asynchronously, as step `state.global_step`, and (with
replace_trainer_save, the default) tells the Trainer not to write its own
checkpoint-N directory. See docs/integrations.md.

Why resumption goes through a directory: the Trainer decides where a
resumed run starts (epochs done, batches to skip, when to restore the RNG)
from `resume_from_checkpoint`, a directory, before any callback runs; a
callback cannot move the training loop without patching transformers. So
`resume_dir` writes, once, what the Trainer reads there (the weights as
model.safetensors, trainer_state.json, optimizer.pt, scheduler.pt,
rng_state.pth) from the ckpt step, and the Trainer's own code resumes.
"""
import dataclasses
import json
import os
import random
import tempfile
import warnings

import numpy as np
import torch
import transformers

from . import exporting
from .checkpointer import Checkpointer
from .loading import list_steps as ckpt_steps
from .loading import load


def _rng_state():
    """The RNG states the Trainer saves (python, numpy, torch CPU and CUDA), as
    values a checkpoint holds (numpy's key array as a tensor)."""
    kind, keys, pos, has_gauss, cached = np.random.get_state()
    state = {"python": random.getstate(),
             "numpy": (kind, torch.from_numpy(keys.astype(np.int64)), int(pos), int(has_gauss), float(cached)),
             "cpu": torch.random.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.random.get_rng_state()
    return state


def _trainer_rng_state(saved):
    """`_rng_state()` as the Trainer's rng_state.pth holds it."""
    kind, keys, pos, has_gauss, cached = saved["numpy"]
    out = {"python": saved["python"],
           "numpy": (kind, keys.numpy().astype(np.uint32), pos, has_gauss, cached),
           "cpu": saved["cpu"]}
    if "cuda" in saved:
        out["cuda"] = saved["cuda"]
    return out


class CkptCallback(transformers.TrainerCallback):
    """Saves the Trainer's training state through ckpt at its save steps.

    root: the ckpt checkpoint root.
    replace_trainer_save: True (default): the Trainer writes no checkpoint-N
        directory of its own at those steps (control.should_save is cleared);
        False: it writes its own as well.
    options: ckpt.Checkpointer's (delta="exact", full_every=..., ...).

    The state saved at step N: {"model": model (its state_dict; tied weights
    stored once), "optimizer", "scheduler", "rng", "trainer_state" (the
    TrainerState as JSON text)}. Only the main process saves (as the Trainer
    saves the model); the save returns once the tensors are staged.

    With load_best_model_at_end, the model ends training holding the step of
    the best metric, read from the ckpt root (the Trainer looks for it in a
    checkpoint-N directory, which is not written): every process loads it
    once the main process's saves are durable. save_strategy="best" is
    refused (the Trainer decides those saves after every callback has run),
    and save_total_limit is the Trainer's rotation of its own directories:
    ckpt-retain keeps the ckpt root's steps.
    """

    def __init__(self, root, replace_trainer_save=True, **options):
        self.root = os.fspath(root)
        self.replace_trainer_save = replace_trainer_save
        self._options = options
        self._checkpointer = None

    def on_train_begin(self, args, state, control, **kwargs):
        if str(getattr(args.save_strategy, "value", args.save_strategy)) == "best":
            raise ValueError("ckpt.hf.CkptCallback: save_strategy='best' is decided by the Trainer "
                             "after its callbacks have run, so the callback cannot save those steps; "
                             "use save_strategy='steps' (or 'epoch') with load_best_model_at_end=True")
        if args.save_total_limit and self.replace_trainer_save:
            warnings.warn("ckpt.hf.CkptCallback: save_total_limit rotates the Trainer's checkpoint-N "
                          "directories, which the callback replaces; the ckpt root keeps every step "
                          "(run ckpt-retain to keep the last N)", stacklevel=2)
        return control

    def on_step_end(self, args, state, control, **kwargs):
        return self._maybe_save(state, control, **kwargs)

    def on_epoch_end(self, args, state, control, **kwargs):
        return self._maybe_save(state, control, **kwargs)

    def on_train_end(self, args, state, control, model=None, **kwargs):
        self.close()
        if args.load_best_model_at_end and self.replace_trainer_save and model is not None:
            self._load_best(state, model)

    def _load_best(self, state, model):
        """Loads the model of step `state.best_global_step` into `model`, on
        every process, after the main process's saves are durable."""
        dist = torch.distributed
        if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
            dist.barrier()  # (the main process closed its checkpointer: every save is durable)
        best = state.best_global_step
        if not best:
            return
        if best not in set(ckpt_steps(self.root)):
            warnings.warn(f"ckpt.hf.CkptCallback: the best metric was at step {best}, which was not "
                          "saved (eval_steps and save_steps differ); the model is the last step's",
                          stacklevel=2)
            return
        load(self.root, step=best, into={"model": model})
        state.best_model_checkpoint = f"{self.root} (ckpt step {best})"

    def _maybe_save(self, state, control, model=None, optimizer=None, lr_scheduler=None, **_):
        if not control.should_save:
            return control
        if state.is_world_process_zero:
            if self._checkpointer is None:
                self._checkpointer = Checkpointer(self.root, **self._options)
            trainer_state = dataclasses.asdict(state)
            trainer_state["stateful_callbacks"] = {**(trainer_state.get("stateful_callbacks") or {}),
                                                   "TrainerControl": control.state()}
            self._checkpointer.save_async(state.global_step, {
                "model": model, "optimizer": optimizer, "scheduler": lr_scheduler, "rng": _rng_state(),
                "trainer_state": json.dumps(trainer_state, sort_keys=True)})
        if self.replace_trainer_save:
            control.should_save = False
        return control

    def wait(self):
        """Waits until every save so far is durable (raises a save's error)."""
        if self._checkpointer is not None:
            self._checkpointer.wait()

    def close(self):
        """Waits for the saves in flight and closes the engine (a later save opens it again)."""
        cp, self._checkpointer = self._checkpointer, None
        if cp is not None:
            cp.close()

    @staticmethod
    def resume_dir(root, dest=None, step=None):
        """Writes step `step` of `root` (None: the newest that reads back) as the
        directory the Trainer resumes from, `dest` (must not exist; None: a new
        temporary directory), and returns its path: pass it as
        trainer.train(resume_from_checkpoint=...)."""
        step, saved = load(root, step, with_step=True)
        if dest is None:
            dest = os.path.join(tempfile.mkdtemp(prefix="ckpt-hf-resume-"), f"checkpoint-{step}")
        dest = os.fspath(dest)
        exporting.export_hf(root, dest, step=step, strip_prefix="model.")
        with open(os.path.join(dest, "trainer_state.json"), "w", encoding="utf-8") as f:
            f.write(saved["trainer_state"])
        torch.save(saved["optimizer"], os.path.join(dest, "optimizer.pt"))
        torch.save(saved["scheduler"], os.path.join(dest, "scheduler.pt"))
        torch.save(_trainer_rng_state(saved["rng"]), os.path.join(dest, "rng_state.pth"))
        return dest
