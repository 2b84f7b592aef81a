"""Hugging Face transformers and tied weights (tools/setup.sh installs
transformers).

The scenario of issue 34: a Llama with tied input/output embeddings, built
from a config (nothing downloaded), trained a few steps and saved with exact
deltas; loaded without `into` (the tie comes back as one tensor) and into a
tied model at a delta step (no checksum fallback logged, ties kept);
exported with --export-hf --max-shard-size into several files and loaded
with from_pretrained: weights bit-identical, ties intact. Also: a checkpoint
of an older writer, which stored both names, loads into a tied model without
the fallback; dtype conversion matches torch's rounding; and
ckpt.hf.CkptCallback saves at the Trainer's save steps and resumes
bit-identically.
"""
import json
import os

import pytest
import torch
import transformers
from safetensors.torch import load_file

import ckpt

FALLBACK = "link by link"


def tiny_llama(seed=0):
    config = transformers.LlamaConfig(vocab_size=96, hidden_size=32, intermediate_size=64,
                                      num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                      max_position_embeddings=64, tie_word_embeddings=True)
    torch.manual_seed(seed)
    return transformers.LlamaForCausalLM(config)


def tied(model):
    return model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()


def train_and_save(root, model, steps=3, full_every=10):
    """Trains `model` a few AdamW steps, saving {"model", "optim"} after each
    with exact deltas; returns the optimizer."""
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    g = torch.Generator().manual_seed(2)
    with ckpt.Checkpointer(root, delta="exact", full_every=full_every) as cp:
        for step in range(1, steps + 1):
            ids = torch.randint(0, 96, (4, 12), generator=g)
            model(input_ids=ids, labels=ids).loss.backward()
            opt.step()
            opt.zero_grad()
            cp.save(step, {"model": model, "optim": opt})
    return opt


@pytest.fixture
def trained(root):
    model = tiny_llama()
    assert tied(model)
    train_and_save(root, model)
    return model


def test_tie_is_stored_once_and_loads_as_one_tensor(root, trained, capfd):
    info = ckpt.describe(root)
    names = [t["name"] for t in info["tensors"]]
    assert "model.model.embed_tokens.weight" in names and "model.lm_head.weight" not in names
    assert info["extras"]["ckpt.python"]["aliases"] == {"model.lm_head.weight": "model.model.embed_tokens.weight"}
    steps, bases = torch.ops.ckpt.checkpoint_bases(root)
    assert bases[-1] != -1, "the newest step should be a delta"

    state = ckpt.load(root)
    sd = state["model"]
    assert sd["lm_head.weight"] is sd["model.embed_tokens.weight"]
    for name, value in trained.state_dict().items():
        assert torch.equal(sd[name], value), name

    fresh = tiny_llama(seed=5)
    ckpt.load(root, into={"model": fresh, "optim": torch.optim.AdamW(fresh.parameters())})
    assert tied(fresh)
    for (name, a), b in zip(trained.state_dict().items(), fresh.state_dict().values()):
        assert torch.equal(a, b), name
    untied = tiny_llama(seed=6)
    untied.lm_head.weight = torch.nn.Parameter(untied.lm_head.weight.detach().clone())
    ckpt.load(root, into={"model": untied}, strict=False)
    assert not tied(untied)
    assert torch.equal(untied.lm_head.weight, trained.lm_head.weight)
    assert FALLBACK not in capfd.readouterr().err


def test_older_writers_two_records_fill_a_tied_model_once(root, capfd):
    """Before aliases, a tie was saved as two records of equal value; loading
    into a tied model applied each delta twice (the XOR cancelled) and the
    link-by-link re-check rescued it. Now the storage is filled once."""
    model = tiny_llama()
    g = torch.Generator().manual_seed(3)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    with ckpt.Checkpointer(root, delta="exact", full_every=4) as cp:
        for step in range(1, 4):
            ids = torch.randint(0, 96, (4, 12), generator=g)
            model(input_ids=ids, labels=ids).loss.backward()
            opt.step()
            opt.zero_grad()
            sd = {k: v.detach().clone() for k, v in model.state_dict().items()}  # two storages
            cp.save(step, {"model": sd})
    assert "model.lm_head.weight" in [t["name"] for t in ckpt.describe(root)["tensors"]]
    fresh = tiny_llama(seed=9)
    ckpt.load(root, into={"model": fresh})
    assert tied(fresh) and torch.equal(fresh.lm_head.weight, model.lm_head.weight)
    assert FALLBACK not in capfd.readouterr().err


def test_export_hf_shards_and_from_pretrained_keeps_ties(root, trained, tmp_path):
    config_dir = tmp_path / "config"
    trained.config.save_pretrained(config_dir)
    out = tmp_path / "hf"
    ckpt.export_hf(root, out, strip_prefix="model.", max_shard_size="20KB",
                   copy=[config_dir / "config.json"])
    files = sorted(os.listdir(out))
    shards = [f for f in files if f.endswith(".safetensors")]
    assert len(shards) > 2 and "model.safetensors.index.json" in files and "config.json" in files
    index = json.load(open(out / "model.safetensors.index.json"))
    assert set(index["weight_map"].values()) == set(shards)
    assert "lm_head.weight" not in index["weight_map"]  # written once, as transformers writes it
    assert index["metadata"]["total_size"] == sum(
        t.numel() * t.element_size() for n, t in trained.state_dict().items() if n != "lm_head.weight")
    for shard in shards:
        assert os.path.getsize(out / shard) < 20_000 + 4096 or len(load_file(out / shard)) == 1
        load_file(out / shard)  # the safetensors library reads each
    loaded = transformers.LlamaForCausalLM.from_pretrained(out)
    assert tied(loaded)
    for (name, a), b in zip(trained.state_dict().items(), loaded.state_dict().values()):
        assert a.dtype == b.dtype and torch.equal(a, b), name


def test_export_hf_single_file_and_dtype_conversion_round_as_torch(root, tmp_path):
    specials = torch.tensor([0.0, -0.0, 1.0, -2.5, 65504.0, 65520.0, 1e-8, 6e-8, 3e-5, 1.0009765625,
                             1.00048828125, 3.4e38, float("inf"), float("-inf"), float("nan"),
                             1e-40, 2.0 ** -24, 2.0 ** -25, 2.0 ** -14 * 1.5])
    g = torch.Generator().manual_seed(4)
    state = {"net": {"f32": torch.cat([specials, torch.randn(4000, generator=g) * 1e3]),
                     "f64": torch.randn(300, generator=g, dtype=torch.float64) * 1e5,
                     "bf16": torch.randn(300, generator=g).to(torch.bfloat16),
                     "ids": torch.arange(10)}}
    with ckpt.Checkpointer(root) as cp:
        cp.save(1, state)
    for dtype in (torch.float16, torch.bfloat16, torch.float32):
        out = tmp_path / str(dtype)
        ckpt.export_hf(root, out, strip_prefix="net.", dtype=dtype)
        assert os.listdir(out) == ["model.safetensors"]
        got = load_file(out / "model.safetensors")
        for name, value in state["net"].items():
            want = value.to(dtype) if value.is_floating_point() else value
            assert got[name].dtype == want.dtype, name
            assert torch.equal(got[name].view(torch.uint8), want.contiguous().view(torch.uint8)) or \
                (want.isnan().any() and torch.equal(got[name].isnan(), want.isnan()) and
                 torch.equal(got[name].nan_to_num(), want.nan_to_num())), (name, dtype)


def test_export_hf_refusals(root, trained, tmp_path, ckpt_restore):
    with pytest.raises(FileExistsError):
        ckpt.export_hf(root, tmp_path)
    with pytest.raises(ckpt.CheckpointError, match="no tensor name starts with"):
        ckpt.export_hf(root, tmp_path / "a", strip_prefix="nothing.")
    with pytest.raises(ckpt.CheckpointError, match="not a shard size"):
        ckpt.export_hf(root, tmp_path / "b", max_shard_size="5 parsecs")
    with pytest.raises(ckpt.CheckpointError, match="--dtype"):
        ckpt.export_hf(root, tmp_path / "c", dtype="int8")
    assert not [p for p in os.listdir(tmp_path) if p != "ckpts"]  # nothing left behind


def trainer_run(tmp_path, name, callbacks, model, max_steps=12, **arguments):
    g = torch.Generator().manual_seed(7)
    data = [{"input_ids": ids, "labels": ids} for ids in torch.randint(0, 96, (16, 12), generator=g)]
    args = transformers.TrainingArguments(**{
        "output_dir": str(tmp_path / name), "per_device_train_batch_size": 4, "max_steps": max_steps,
        "save_strategy": "steps", "save_steps": 3, "learning_rate": 5e-3, "lr_scheduler_type": "linear",
        "warmup_steps": 2, "report_to": [], "logging_strategy": "no", "use_cpu": True, "seed": 0,
        "dataloader_num_workers": 0, "disable_tqdm": True, **arguments})
    return transformers.Trainer(model=model, args=args, train_dataset=data, callbacks=callbacks,
                                eval_dataset=data[:4] if "eval_strategy" in arguments else None)


class StopAt(transformers.TrainerCallback):
    def __init__(self, step):
        self.step = step

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step == self.step:
            control.should_training_stop = True
        return control


def test_trainer_callback_saves_async_and_resumes_bit_identically(tmp_path):
    from ckpt.hf import CkptCallback
    root = str(tmp_path / "ckpt-root")
    straight = tiny_llama()
    trainer_run(tmp_path, "straight", [], straight).train()

    stopped = tiny_llama()
    callback = CkptCallback(root, delta="exact")
    trainer_run(tmp_path, "first", [callback, StopAt(6)], stopped).train()  # stops mid-epoch 1
    assert ckpt.list_steps(root) == [3, 6]
    assert not [d for d in os.listdir(tmp_path / "first") if d.startswith("checkpoint-")], \
        "the Trainer wrote its own checkpoint although the callback replaces it"
    saved = ckpt.load(root)
    assert saved["model"]["lm_head.weight"] is saved["model"]["model.embed_tokens.weight"]
    assert json.loads(saved["trainer_state"])["global_step"] == 6

    resumed = tiny_llama(seed=11)
    resume_from = CkptCallback.resume_dir(root, tmp_path / "resume")
    trainer_run(tmp_path, "second", [CkptCallback(root, delta="exact")], resumed).train(
        resume_from_checkpoint=resume_from)
    assert ckpt.list_steps(root) == [3, 6, 9, 12]
    assert tied(resumed)
    for (name, a), b in zip(straight.state_dict().items(), resumed.state_dict().values()):
        assert torch.equal(a, b), f"{name} differs from the uninterrupted run"


class ScoreAt(transformers.TrainerCallback):
    """Puts a made-up eval_score into each evaluation's metrics (before the
    Trainer picks its best), so the best step is known: 6 of 3, 6, 9, 12;
    and keeps a copy of the model's weights at each."""
    SCORES = {3: 1.0, 6: 5.0, 9: 2.0, 12: 0.5}

    def __init__(self):
        self.weights = {}

    def on_evaluate(self, args, state, control, metrics=None, model=None, **kwargs):
        metrics["eval_score"] = self.SCORES[state.global_step]
        self.weights[state.global_step] = {n: t.detach().clone() for n, t in model.state_dict().items()}


def test_load_best_model_at_end_loads_the_best_step_from_the_ckpt_root(tmp_path):
    # The Trainer looks for the best model in a checkpoint-N directory, which
    # the callback replaces: it had silently ended with the last step's model.
    from ckpt.hf import CkptCallback
    root = str(tmp_path / "ckpt-root")
    model = tiny_llama()
    scores = ScoreAt()
    trainer = trainer_run(tmp_path, "best", [CkptCallback(root), scores], model,
                          eval_strategy="steps", eval_steps=3, load_best_model_at_end=True,
                          metric_for_best_model="score", greater_is_better=True)
    trainer.train()
    assert ckpt.list_steps(root) == [3, 6, 9, 12]
    assert trainer.state.best_global_step == 6
    best, last = scores.weights[6], scores.weights[12]
    for name, value in model.state_dict().items():
        assert torch.equal(value, best[name]), f"{name} is not the weights the model had at step 6"
    assert any(not torch.equal(best[n], last[n]) for n in best), "steps 6 and 12 hold one model"
    assert tied(model)


def test_save_strategy_best_is_refused_and_save_total_limit_warns(tmp_path):
    from ckpt.hf import CkptCallback
    trainer = trainer_run(tmp_path, "s", [CkptCallback(str(tmp_path / "r"))], tiny_llama(), save_strategy="best",
                          eval_strategy="steps", eval_steps=3, metric_for_best_model="loss")
    with pytest.raises(ValueError, match="save_strategy='best'"):
        trainer.train()
    trainer = trainer_run(tmp_path, "t", [CkptCallback(str(tmp_path / "r2"))], tiny_llama(), max_steps=3,
                          save_total_limit=1)
    with pytest.warns(UserWarning, match="ckpt-retain"):
        trainer.train()
