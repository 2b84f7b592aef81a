"""Training state and rank bodies of tests/python/test_dcp.py (DCP through ckpt).

The state is what a torchtitan-style loop checkpoints through DCP: a small
GPT-style model (embedding, two transformer blocks, tied-free head), AdamW
after a few steps (exp_avg, exp_avg_sq, step), an LR scheduler and
non-tensor items (ints, a string, a BytesIO), wrapped in one Stateful that
goes through torch.distributed.checkpoint.state_dict's get/set_state_dict.
`fingerprint` hashes every byte of it (full tensors, gathered from DTensors),
so two states compare bit for bit.
"""
import hashlib
import io
import os

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint.state_dict import (StateDictOptions, get_state_dict,
                                                     set_state_dict)
from torch.distributed.checkpoint.stateful import Stateful

import ckpt.dcp

VOCAB, DIM, SEQ = 96, 32, 12


class TinyGPT(nn.Module):
    def __init__(self):
        super().__init__()
        self.tok = nn.Embedding(VOCAB, DIM)
        self.pos = nn.Parameter(torch.zeros(SEQ, DIM))
        self.blocks = nn.ModuleList(
            nn.TransformerEncoderLayer(DIM, 4, 2 * DIM, dropout=0.0, batch_first=True)
            for _ in range(2))
        self.norm = nn.LayerNorm(DIM)
        self.head = nn.Linear(DIM, VOCAB, bias=False)

    def forward(self, x):
        h = self.tok(x) + self.pos[: x.shape[1]]
        for block in self.blocks:
            h = block(h)
        return self.head(self.norm(h))


def batch(step, n=4):
    g = torch.Generator().manual_seed(1000 + step)
    return torch.randint(0, VOCAB, (n, SEQ), generator=g)


class Trainer:
    """Model, AdamW and LR scheduler; `train(k)` takes k steps."""

    def __init__(self, seed, shard_world=None):
        torch.manual_seed(seed)
        self.model = TinyGPT()
        if shard_world:
            from torch.distributed.device_mesh import init_device_mesh
            from torch.distributed.fsdp import fully_shard
            mesh = init_device_mesh("cpu", (shard_world,))
            for block in self.model.blocks:
                fully_shard(block, mesh=mesh)
            fully_shard(self.model, mesh=mesh)
        self.optim = torch.optim.AdamW(self.model.parameters(), lr=3e-3, weight_decay=0.05)
        self.sched = torch.optim.lr_scheduler.StepLR(self.optim, step_size=2, gamma=0.5)
        self.steps = 0

    def train(self, k):
        for _ in range(k):
            self.steps += 1
            x = batch(self.steps)
            loss = nn.functional.cross_entropy(self.model(x[:, :-1]).flatten(0, 1),
                                               x[:, 1:].flatten())
            loss.backward()
            self.optim.step()
            self.optim.zero_grad()
            self.sched.step()
        return self


class AppState(Stateful):
    """What dcp.save/dcp.load see: the DCP tutorial's and torchtitan's shape."""

    def __init__(self, trainer, extra=None):
        self.t = trainer
        self.extra = extra if extra is not None else {}

    def state_dict(self):
        model_sd, optim_sd = get_state_dict(self.t.model, self.t.optim)
        return {"model": model_sd, "optim": optim_sd, "sched": self.t.sched.state_dict(),
                "extra": self.extra}

    def load_state_dict(self, state):
        set_state_dict(self.t.model, self.t.optim, model_state_dict=state["model"],
                       optim_state_dict=state["optim"])
        self.t.sched.load_state_dict(state["sched"])
        self.extra = state["extra"]


def extra_items(step):
    return {"step": step, "note": f"run-a step {step}", "blob": io.BytesIO(b"\x00rng" * 50 + bytes([step]))}


def _digest(h, value):
    if isinstance(value, torch.Tensor):
        if hasattr(value, "full_tensor"):
            value = value.full_tensor()
        value = value.detach().cpu().contiguous()
        h.update(f"T{value.dtype}{tuple(value.shape)}".encode())
        h.update(value.reshape(-1).view(torch.uint8).numpy().tobytes() if value.numel() else b"")
    elif isinstance(value, io.BytesIO):
        h.update(b"B" + value.getvalue())
    elif isinstance(value, dict):
        for k in sorted(value, key=str):
            h.update(f"K{k!r}".encode())
            _digest(h, value[k])
    elif isinstance(value, (list, tuple)):
        h.update(f"L{len(value)}".encode())
        for v in value:
            _digest(h, v)
    else:
        h.update(f"V{value!r}".encode())


def fingerprint(trainer, extra):
    """sha256 of the full state: model, optimizer (full tensors), scheduler, extra."""
    model_sd, optim_sd = get_state_dict(trainer.model, trainer.optim,
                                        options=StateDictOptions(full_state_dict=True))
    parts = {}
    for key, value in (("model", model_sd), ("optim", optim_sd),
                       ("sched", trainer.sched.state_dict()), ("extra", extra)):
        h = hashlib.sha256()
        _digest(h, value)
        parts[key] = h.hexdigest()
    return parts


# -- rank bodies (distributed_workers.run_world) ------------------------------

def save_sharded(ctx):
    """FSDP2 over the group: train, dcp.save step 3 (and async_save step 5)
    through ckpt; returns the fingerprints of what was saved."""
    t = Trainer(0, shard_world=ctx.world).train(3)
    writer = ckpt.dcp.StorageWriter(ctx.root, commit_timeout_s=60, **ctx.writer_options)
    out = {}
    state = AppState(t, extra_items(3))
    dcp.save({"app": state}, storage_writer=writer, checkpoint_id=3)
    out["3"] = fingerprint(t, state.extra)
    t.train(2)
    state = AppState(t, extra_items(5))
    kind = ctx.async_type
    if kind:
        from torch.distributed.checkpoint.state_dict_saver import AsyncCheckpointerType
        future = dcp.async_save({"app": state}, storage_writer=writer, checkpoint_id=5,
                                async_checkpointer_type=AsyncCheckpointerType[kind])
        getattr(future, "upload_completion", future).result()
    else:
        dcp.save({"app": state}, storage_writer=writer, checkpoint_id=5)
    out["5"] = fingerprint(t, state.extra)
    ckpt.dcp.close_all()
    return out


def load_sharded(ctx):
    """A fresh trainer (other weights), sharded over this group (or plain on
    a group of one), loads step `ctx.step` through ckpt; returns its fingerprint."""
    t = Trainer(7, shard_world=ctx.world if ctx.world > 1 else None).train(1)
    state = AppState(t, {"step": 0, "note": "", "blob": io.BytesIO()})
    reader = ckpt.dcp.StorageReader(ctx.root, step=ctx.step) if ctx.step is not None else \
        ckpt.dcp.StorageReader(ctx.root)
    dcp.load({"app": state}, storage_reader=reader)
    return fingerprint(t, state.extra)


def save_with_dcp_fs(ctx):
    """DCP's own FileSystemWriter, FSDP2 over the group (or plain on one);
    returns the saved fingerprint."""
    t = Trainer(0, shard_world=ctx.world if ctx.world > 1 else None).train(3)
    state = AppState(t, extra_items(3))
    dcp.save({"app": state}, storage_writer=dcp.FileSystemWriter(ctx.dcp_dir))
    return fingerprint(t, state.extra)


def async_round_trip(ctx):
    """dcp.async_save of steps 2 and 4 through ckpt on this group, with the
    checkpointer type `ctx.kind` (THREAD, PROCESS) and, with
    ctx.shared_memory, DCP's DefaultStager staging into shared memory;
    returns the fingerprints of what was saved."""
    from torch.distributed.checkpoint.staging import DefaultStager, StagingOptions
    from torch.distributed.checkpoint.state_dict_saver import AsyncCheckpointerType
    writer = ckpt.dcp.StorageWriter(ctx.root, commit_timeout_s=60)
    kwargs = {"async_checkpointer_type": AsyncCheckpointerType[ctx.kind]}
    if ctx.shared_memory:  # (pinned memory and async staging need CUDA)
        kwargs["async_stager"] = DefaultStager(StagingOptions(False, True, False, False))
    t = Trainer(0, shard_world=ctx.world if ctx.world > 1 else None)
    wants = {}
    for step in (2, 4):
        t.train(2)
        state = AppState(t, extra_items(step))
        response = dcp.async_save({"app": state}, storage_writer=writer, checkpoint_id=step,
                                  **kwargs)
        staged = getattr(response, "staging_completion", None)
        if staged is not None:
            staged.result(timeout=120)
        wants[str(step)] = fingerprint(t, state.extra)
        getattr(response, "upload_completion", response).result(timeout=180)
    if "async_stager" in kwargs:
        kwargs["async_stager"].close()
    ckpt.dcp.close_all()
    return wants


def fresh_state():
    """A trainer with other weights and an empty extra: what a restart builds."""
    return AppState(Trainer(7).train(1), {"step": 0, "note": "", "blob": io.BytesIO()})


def saved_state(step=3):
    """A trainer after `step` steps and the AppState a save hands to DCP."""
    t = Trainer(0).train(step)
    return t, AppState(t, extra_items(step))


def load_fingerprint(reader):
    """dcp.load through `reader` into a fresh state; its fingerprint."""
    state = fresh_state()
    dcp.load({"app": state}, storage_reader=reader)
    return fingerprint(state.t, state.extra)
