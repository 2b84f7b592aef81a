"""Once staging_completion is done, the caller may change its tensors: the
checkpoint keeps the values they had when save_async was called."""
import gc

import pytest
import torch

import ckpt

MB = 1 << 20


def big_state(seed):
    g = torch.Generator().manual_seed(seed)
    return {"layers": [{"w": torch.randn(4 * MB // 4, generator=g),  # 4 MiB each
                        "b": torch.randn(1000, generator=g)} for _ in range(8)],
            "emb": torch.randn(2048, 1024, generator=g).to(torch.bfloat16),
            "step": seed}


def clone(state):
    return {"layers": [{k: v.clone() for k, v in layer.items()} for layer in state["layers"]],
            "emb": state["emb"].clone(), "step": state["step"]}


def mutate(state):
    for layer in state["layers"]:
        layer["w"].add_(1.0)
        layer["b"].zero_()
    state["emb"].mul_(-2)


def assert_equal(a, b):
    for la, lb in zip(a["layers"], b["layers"]):
        for k in la:
            assert torch.equal(la[k], lb[k]), k
    assert torch.equal(a["emb"], b["emb"])
    assert a["step"] == b["step"]


@pytest.mark.parametrize("lazy", [False, True], ids=["eager", "lazy"])
def test_mutation_after_staging_never_leaks(root, lazy):
    with ckpt.Checkpointer(root, lazy=lazy) as cp:
        responses = []
        expected = {}
        state = big_state(1)
        for step in range(1, 5):
            expected[step] = clone(state)
            resp = cp.save_async(step, state)
            resp.staging_completion.result()
            if not lazy:
                assert resp.staging_completion.done()  # eager: staged on return
            mutate(state)  # the next optimizer step, while the save is persisting
            responses.append(resp)
        for resp in responses:
            stats = resp.result()
            assert stats["tensor_count"] == 17 and not stats["skipped"]
    for step, want in expected.items():
        assert_equal(ckpt.load(root, step=step), want)


def test_lazy_save_keeps_temporaries_alive(root):
    """A non-contiguous tensor is saved through a contiguous copy that only the
    save holds; dropping every Python reference must not free it early."""
    base = torch.randn(2048, 2048)
    expected = base.t().contiguous()
    with ckpt.Checkpointer(root, lazy=True) as cp:
        resp = cp.save_async(1, {"x": base.t()})
        del base
        gc.collect()
        resp.result()
    assert torch.equal(ckpt.load(root)["x"], expected)
