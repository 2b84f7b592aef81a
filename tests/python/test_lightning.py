"""ckpt.lightning.CkptCheckpointIO under a real Lightning Trainer (both the
`lightning` and the `pytorch_lightning` packages, >= 2; tools/setup.sh
installs them).

The scenario of issue 34: ModelCheckpoint(save_top_k=2, save_last=True),
AdamW and ReduceLROnPlateau, 3 epochs with the plugin saving exact deltas,
then a new Trainer resumes with ckpt_path="last" to 6 epochs: its weights are
bit-identical to an uninterrupted 6-epoch run; every checkpoint Lightning
kept reads back leaf for leaf, type included; every one it removed is gone
from disk, and every step left in the root verifies (no chain broken) and is
needed by a kept one. A SIGTERM mid-run (Lightning's own handling) leaves
only pointers to durable steps. With the saves held back: a pointer appears
only once its step is durable, one removed in flight never does, and a
failed save is raised by teardown().
"""
import collections
import importlib
import json
import math
import os
import signal
import subprocess
import sys

import pytest
import torch

import ckpt
import ckpt.lightning
from ckpt.lightning import CkptCheckpointIO

PACKAGES = ["lightning", "pytorch_lightning"]
LONG_KEY = "Probe{" + ", ".join(f"'option_{i}': {i}" for i in range(40)) + "}"


def lightning_api(package):
    """(the Trainer's package, its callbacks) of `lightning` or `pytorch_lightning`."""
    L = importlib.import_module("lightning.pytorch" if package == "lightning" else package)
    return L, importlib.import_module(f"{L.__name__}.callbacks")


def make_module(L, seed=0):
    class Regressor(L.LightningModule):
        def __init__(self):
            super().__init__()
            torch.manual_seed(seed)
            self.net = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))

        def training_step(self, batch, _):
            x, y = batch
            return torch.nn.functional.mse_loss(self.net(x), y)

        def validation_step(self, batch, _):
            x, y = batch
            self.log("val_loss", torch.nn.functional.mse_loss(self.net(x), y))

        def configure_optimizers(self):
            opt = torch.optim.AdamW(self.parameters(), lr=0.05, weight_decay=0.01)
            sched = torch.optim.lr_scheduler.ReduceLROnPlateau(opt, factor=0.5, patience=0)
            return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "monitor": "val_loss"}}

        def on_save_checkpoint(self, checkpoint):
            checkpoint["probe"] = {"inf": math.inf, "ninf": -math.inf, "nan": math.nan, "neg0": -0.0,
                                   "big": 2 ** 70, "pair": (1, "a", (2.5, None)), "flag": True,
                                   "nested": [{"k": [1, 2, {3: "three"}]}], "empty": (),
                                   "odict": collections.OrderedDict([("z", 1), ("a", 2)])}

    return Regressor()


def make_probe_callback(L):
    class Probe(L.Callback):
        """A callback whose state is keyed by a long string, as Lightning's own are."""

        @property
        def state_key(self):
            return LONG_KEY

        def state_dict(self):
            return {"seen": 7, "ratio": 0.1, "when": ("epoch", 3), "none": None}

        def load_state_dict(self, state):
            self.loaded = state

    return Probe()


def loaders():
    g = torch.Generator().manual_seed(1)
    x = torch.randn(96, 8, generator=g)
    y = (x[:, :4].sum(1, keepdim=True) - x[:, 4:].prod(1, keepdim=True)).tanh()
    data = torch.utils.data.TensorDataset(x, y)
    return (torch.utils.data.DataLoader(data, batch_size=16),
            torch.utils.data.DataLoader(torch.utils.data.Subset(data, range(48)), batch_size=16))


def trainer(L, epochs, **kwargs):
    return L.Trainer(max_epochs=epochs, logger=False, enable_progress_bar=False,
                     enable_model_summary=False, deterministic=True, accelerator="cpu", **kwargs)


class RecordingIO(CkptCheckpointIO):
    """Records a deep copy of every checkpoint Lightning hands over, by path."""

    def __init__(self, root, saved, removed, **options):
        super().__init__(root, **options)
        self.saved, self.removed = saved, removed

    def save_checkpoint(self, checkpoint, path, storage_options=None):
        self.saved[os.path.abspath(path)] = _deep_copy(checkpoint)
        super().save_checkpoint(checkpoint, path, storage_options)

    def remove_checkpoint(self, path):
        self.removed.append(os.path.abspath(path))
        super().remove_checkpoint(path)


def _deep_copy(x):
    if isinstance(x, torch.Tensor):
        return x.detach().clone()
    if isinstance(x, dict):
        out = type(x)((k, _deep_copy(v)) for k, v in x.items())
        if hasattr(x, "_metadata"):
            out._metadata = _deep_copy(x._metadata)
        return out
    if isinstance(x, (list, tuple)):
        return type(x)(_deep_copy(v) for v in x)
    return x


def assert_same_leaves(got, want, where="checkpoint"):
    assert type(got) is type(want), f"{where}: {type(got).__name__} != {type(want).__name__}"
    if isinstance(want, torch.Tensor):
        assert got.dtype == want.dtype and got.shape == want.shape, where
        assert torch.equal(got, want), where
    elif isinstance(want, dict):
        assert list(got.keys()) == list(want.keys()), where
        for k in want:
            assert type(k) is type(next(g for g in got if g == k)), f"{where}: key {k!r}"
            assert_same_leaves(got[k], want[k], f"{where}[{k!r}]")
    elif isinstance(want, (list, tuple)):
        assert len(got) == len(want), where
        for i, (g, w) in enumerate(zip(got, want)):
            assert_same_leaves(g, w, f"{where}[{i}]")
    elif isinstance(want, float):
        assert (math.isnan(got) and math.isnan(want)) or \
            (got == want and math.copysign(1, got) == math.copysign(1, want)), where
    else:
        assert got == want, where


def needed_steps(root, kept_steps):
    """The steps the kept ones and the newest need: their delta chains."""
    steps, bases = torch.ops.ckpt.checkpoint_bases(root)
    base_of = dict(zip(steps, bases))
    needed = set()
    for step in list(kept_steps) + [max(steps)]:
        while step in base_of and step not in needed:
            needed.add(step)
            step = base_of[step]
    return needed


@pytest.mark.parametrize("package", PACKAGES)
def test_trainer_resumes_bit_identically_and_keeps_chains_whole(package, tmp_path):
    L, callbacks = lightning_api(package)
    train, val = loaders()
    # The uninterrupted run.
    straight = make_module(L)
    trainer(L, 6, enable_checkpointing=False).fit(straight, train, val)

    root, dirpath = str(tmp_path / "ckpt-root"), str(tmp_path / "lightning")
    saved, removed = {}, []

    def checkpointing():
        return [callbacks.ModelCheckpoint(dirpath=dirpath, monitor="val_loss", save_top_k=2, save_last=True),
                make_probe_callback(L)]

    first = trainer(L, 3, plugins=[RecordingIO(root, saved, removed, delta="exact", full_every=4)],
                    callbacks=checkpointing())
    first.fit(make_module(L), train, val)
    assert removed, "top-k removed nothing: the scenario does not exercise remove_checkpoint"
    resumed_module = make_module(L, seed=123)  # other initial weights: all must come from the checkpoint
    second = trainer(L, 6, plugins=[RecordingIO(root, saved, removed, delta="exact", full_every=4)],
                     callbacks=checkpointing())
    second.fit(resumed_module, train, val, ckpt_path="last")
    assert second.current_epoch == 6 and second.global_step == straight.trainer.global_step

    for (name, a), (_, b) in zip(straight.state_dict().items(), resumed_module.state_dict().items()):
        assert torch.equal(a, b), f"{name} differs from the uninterrupted run"

    kept = sorted(os.path.join(dirpath, f) for f in os.listdir(dirpath) if f.endswith(".ckpt"))
    assert os.path.join(dirpath, "last.ckpt") in kept and len(kept) == 3  # top 2 + last
    io = CkptCheckpointIO(root)
    for path in kept:
        loaded = io.load_checkpoint(path)
        assert_same_leaves(loaded, saved[path], os.path.basename(path))
        assert loaded["callbacks"][LONG_KEY]["when"] == ("epoch", 3)
    for path in set(removed) - set(kept):
        assert not os.path.lexists(path), f"{path} was removed by Lightning but is still there"

    kept_steps = {CkptCheckpointIO.step_of(p) for p in kept}
    left = set(ckpt.list_steps(root))
    assert left == needed_steps(root, kept_steps), "a step nothing needs is left, or a needed one gone"
    for step in left:
        ckpt.verify(root, step)  # every chain whole
    assert len(saved) > len(kept)  # (some saves were removed and their steps freed)


@pytest.mark.parametrize("package", PACKAGES)
def test_load_from_checkpoint_reads_the_step_a_pointer_names(package, tmp_path):
    # LightningModule.load_from_checkpoint reads the file with torch.load,
    # not through the trainer's CheckpointIO: a pointer used to fail there
    # with an UnpicklingError. Now it loads the step the pointer names.
    L, callbacks = lightning_api(package)
    train, val = loaders()
    dirpath = str(tmp_path / "lightning")
    best = callbacks.ModelCheckpoint(dirpath=dirpath, monitor="val_loss", save_top_k=1)
    model = make_module(L)
    trainer(L, 2, plugins=[CkptCheckpointIO(str(tmp_path / "root"))], callbacks=[best]).fit(model, train, val)
    assert ckpt.lightning.read_pointer(best.best_model_path) is not None
    for map_location in (None, "cpu", {"cpu": "cpu"}, lambda storage, location: storage):
        restored = type(model).load_from_checkpoint(best.best_model_path, map_location=map_location)
        assert type(restored) is type(model)
        for (name, a), (_, b) in zip(model.state_dict().items(), restored.state_dict().items()):
            assert torch.equal(a, b), f"{name} differs from the trained model's"
    saving = importlib.import_module(f"{L.__name__}.core.saving")
    assert saving.pl_load.__wrapped__ is not None  # what every other file goes to


def test_pointer_of_a_plain_file_falls_back_to_torch_load(tmp_path):
    path = tmp_path / "old.ckpt"
    torch.save({"epoch": 1, "state_dict": {"w": torch.ones(2)}}, path)
    loaded = CkptCheckpointIO(str(tmp_path / "root")).load_checkpoint(str(path), weights_only=True)
    assert loaded["epoch"] == 1 and torch.equal(loaded["state_dict"]["w"], torch.ones(2))


def test_unsavable_value_is_refused_naming_its_place(tmp_path):
    io = CkptCheckpointIO(str(tmp_path / "root"))
    with pytest.raises(TypeError, match=r"state\['hyper_parameters'\]\['obj'\]"):
        io.save_checkpoint({"epoch": 0, "hyper_parameters": {"obj": object()}}, str(tmp_path / "a.ckpt"))
    io.teardown()
    assert not os.path.exists(tmp_path / "a.ckpt")


SIGTERM_WORKER = r"""
import os, signal, sys
sys.path[:0] = {paths!r}
import test_lightning as t
L, callbacks = t.lightning_api("lightning")
train, val = t.loaders()

class Stop(L.Callback):
    def on_train_batch_end(self, trainer, *args):
        # A save of epoch 1 is in flight (or just committed) when the signal comes.
        if trainer.current_epoch == 2 and trainer.global_step == 13:
            os.kill(os.getpid(), signal.SIGTERM)

io = t.CkptCheckpointIO({root!r}, delta="exact")
tr = t.trainer(L, 6, plugins=[io], callbacks=[
    callbacks.ModelCheckpoint(dirpath={dirpath!r}, monitor="val_loss", save_top_k=2, save_last=True), Stop()])
tr.fit(t.make_module(L), train, val)
print("fit returned", tr.current_epoch, flush=True)
"""


def test_sigterm_under_lightnings_handling_leaves_only_durable_pointers(tmp_path):
    root, dirpath = str(tmp_path / "root"), str(tmp_path / "lightning")
    here = os.path.dirname(os.path.abspath(__file__))
    code = SIGTERM_WORKER.format(paths=[here] + sys.path[:1], root=root, dirpath=dirpath)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    assert done.returncode != -signal.SIGTERM, "the process died of SIGTERM instead of stopping"
    assert "fit returned" not in done.stdout, "Lightning went on training after SIGTERM"
    pointers = sorted(f for f in os.listdir(dirpath) if f.endswith(".ckpt"))
    assert "last.ckpt" in pointers, done.stderr[-3000:]
    io = CkptCheckpointIO(root)
    last = io.load_checkpoint(os.path.join(dirpath, "last.ckpt"))
    assert last["epoch"] == 1 and last["global_step"] == 12  # the save of epoch 1, durable
    for name in pointers:
        io.load_checkpoint(os.path.join(dirpath, name))
    assert not [e for e in os.listdir(root) if e.startswith(".tmp-")]
    registry = json.load(open(os.path.join(root, ckpt.lightning.REGISTRY_NAME)))
    assert set(registry["pointers"]) == {os.path.join(dirpath, p) for p in pointers}


def test_pointer_appears_once_durable_and_removed_in_flight_never(tmp_path, monkeypatch):
    from held_saves import HeldSaves
    root, d = str(tmp_path / "root"), tmp_path / "lightning"
    io = CkptCheckpointIO(root)
    state = {"epoch": 0, "global_step": 1, "state_dict": {"w": torch.ones(4)}}
    with HeldSaves(monkeypatch, hold_staging=False, fail_steps=(4,)) as held:
        io.save_checkpoint(state, str(d / "a.ckpt"))  # step 1: returns while its save is held
        assert not os.path.exists(d / "a.ckpt"), "a pointer before its step is durable"
        io.save_checkpoint(state, str(d / "b.ckpt"))  # step 2
        io.remove_checkpoint(str(d / "b.ckpt"))  # while in flight
        held.release_all()
        io.wait()
        assert os.path.exists(d / "a.ckpt") and not os.path.exists(d / "b.ckpt")
        assert CkptCheckpointIO.step_of(str(d / "a.ckpt")) == 1
        assert ckpt.list_steps(root) == [1, 2]  # step 2: the newest, which the next save may need
        io.save_checkpoint(state, str(d / "c.ckpt"))  # step 3
        io.wait()
        assert ckpt.list_steps(root) == [1, 3]  # step 2 freed: nothing needs it now
        io.save_checkpoint(state, str(d / "d.ckpt"))  # step 4: fails as the plugin sees it
        with pytest.raises(Exception, match="injected failure"):
            io.teardown()
    assert not os.path.exists(d / "d.ckpt")
    assert io.load_checkpoint(str(d / "c.ckpt"))["global_step"] == 1
