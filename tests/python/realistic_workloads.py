"""Real torch.nn models at small sizes but real shapes, trained for real, for
the realistic-state tests (test_realistic_states.py) and bench/real_state_bench.py.

Every workload has `state()` (what a training loop checkpoints: model and
optimizer state dicts, the step, the RNG), `forward_backward()`, `step()`
(optimizer.step(), plus whatever else a real loop updates after it) and
`sparse_change(gen)` (a few elements of a few tensors change, nothing else).
"""

import torch
import torch.nn.functional as F
from torch import nn


# -- GPT ----------------------------------------------------------------------

class Block(nn.Module):
    """A pre-norm transformer block (nanoGPT's layout: c_attn, c_proj, mlp)."""

    def __init__(self, d, heads):
        super().__init__()
        self.heads = heads
        self.ln_1 = nn.LayerNorm(d)
        self.c_attn = nn.Linear(d, 3 * d)
        self.c_proj = nn.Linear(d, d)
        self.ln_2 = nn.LayerNorm(d)
        self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))

    def forward(self, x):
        dtype = self.ln_1.weight.dtype  # a block may be bf16 inside an fp32 model
        out_dtype = x.dtype
        x = x.to(dtype)
        b, t, d = x.shape
        q, k, v = self.c_attn(self.ln_1(x)).split(d, dim=2)
        q, k, v = (z.view(b, t, self.heads, d // self.heads).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)  # any device
        x = x + self.c_proj(y.transpose(1, 2).reshape(b, t, d))
        x = x + self.mlp(self.ln_2(x))
        return x.to(out_dtype)


class GPT(nn.Module):
    """nanoGPT's shape; also the model of cuda_workers.py and bench/gpu_torch_bench.py."""

    def __init__(self, vocab, d, layers, heads, seq):
        super().__init__()
        self.tok_emb = nn.Embedding(vocab, d)
        self.pos_emb = nn.Parameter(torch.zeros(seq, d))
        self.blocks = nn.ModuleList(Block(d, heads) for _ in range(layers))
        self.ln_f = nn.LayerNorm(d)
        self.head = nn.Linear(d, vocab, bias=False)  # untied

    def forward(self, idx):
        x = self.tok_emb(idx) + self.pos_emb[: idx.shape[1]]
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln_f(x))


class Workload:
    """A model, its optimizer and a batch source; `seed` fixes all of them."""

    def __init__(self, model, optimizer, seed):
        self.model = model
        self.optimizer = optimizer
        self.gen = torch.Generator().manual_seed(seed + 1)
        self.steps = 0

    def state(self):
        return {"model": self.model.state_dict(), "optim": self.optimizer.state_dict(),
                "step": self.steps, "rng": torch.get_rng_state()}

    def forward_backward(self):
        self.optimizer.zero_grad(set_to_none=True)
        loss = self.loss()
        loss.backward()
        return loss.item()

    def step(self):
        self.optimizer.step()
        self.steps += 1

    def train(self, steps):
        for _ in range(steps):
            self.forward_backward()
            self.step()

    def sparse_change(self, gen, tensors=3, fraction=0.002):
        """Changes `fraction` of the elements of `tensors` float parameters."""
        params = [p for p in self.model.parameters() if p.is_floating_point()]
        picks = torch.randperm(len(params), generator=gen)[:tensors].tolist()
        with torch.no_grad():
            for i in picks:
                flat = params[i].view(-1)
                n = max(1, int(flat.numel() * fraction))
                idx = torch.randint(flat.numel(), (n,), generator=gen)
                flat[idx] += (0.01 * torch.randn(n, generator=gen)).to(flat.dtype)


class GptWorkload(Workload):
    """GPT trained with AdamW: exp_avg, exp_avg_sq and 0-d step tensors.
    mixed=True: odd blocks in bf16 (so is their optimizer state) and an fp16
    EMA of the token embedding kept as a buffer, updated after every step."""

    def __init__(self, seed=0, vocab=8192, d=128, layers=4, heads=4, seq=16, batch=4, mixed=False):
        torch.manual_seed(seed)
        model = GPT(vocab, d, layers, heads, seq)
        if mixed:
            for i, block in enumerate(model.blocks):
                if i % 2:
                    block.to(torch.bfloat16)
            model.register_buffer("ema_tok_emb", model.tok_emb.weight.detach().to(torch.float16))
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.1)
        super().__init__(model, optimizer, seed)
        self.vocab, self.seq, self.batch, self.mixed = vocab, seq, batch, mixed

    def loss(self):
        tokens = torch.randint(self.vocab, (self.batch, self.seq + 1), generator=self.gen)
        logits = self.model(tokens[:, :-1])
        return F.cross_entropy(logits.reshape(-1, self.vocab).float(), tokens[:, 1:].reshape(-1))

    def step(self):
        super().step()
        if self.mixed:
            with torch.no_grad():
                ema = self.model.ema_tok_emb
                ema.mul_(0.99).add_(self.model.tok_emb.weight.to(torch.float16), alpha=0.01)


# -- ResNet -------------------------------------------------------------------

class BasicBlock(nn.Module):
    def __init__(self, cin, cout, stride):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.downsample = None
        if stride != 1 or cin != cout:
            self.downsample = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False),
                                            nn.BatchNorm2d(cout))

    def forward(self, x):
        out = F.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return F.relu(out + (x if self.downsample is None else self.downsample(x)))


class ResNetWorkload(Workload):
    """A small ResNet (BatchNorm: running stats, int64 num_batches_tracked)
    trained with SGD + momentum."""

    def __init__(self, seed=0, widths=(16, 32, 64), blocks=2, batch=8, size=16, classes=10):
        torch.manual_seed(seed)
        layers = [nn.Conv2d(3, widths[0], 3, 1, 1, bias=False), nn.BatchNorm2d(widths[0]), nn.ReLU()]
        cin = widths[0]
        for i, w in enumerate(widths):
            for j in range(blocks):
                layers.append(BasicBlock(cin, w, 2 if (j == 0 and i > 0) else 1))
                cin = w
        layers += [nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(cin, classes)]
        model = nn.Sequential(*layers)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, weight_decay=5e-4)
        super().__init__(model, optimizer, seed)
        self.batch, self.size, self.classes = batch, size, classes

    def loss(self):
        x = torch.randn(self.batch, 3, self.size, self.size, generator=self.gen)
        y = torch.randint(self.classes, (self.batch,), generator=self.gen)
        return F.cross_entropy(self.model(x), y)


# -- many tiny tensors ----------------------------------------------------------

class TinyTensorsWorkload(Workload):
    """`layers` Linear(4, 4) side by side, trained with Adam: 2 * layers model
    tensors and 6 * layers optimizer tensors (1250 layers: 10,000 tensors)."""

    def __init__(self, seed=0, layers=1250, batch=4):
        torch.manual_seed(seed)
        model = nn.ModuleList(nn.Linear(4, 4) for _ in range(layers))
        optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
        super().__init__(model, optimizer, seed)
        self.batch = batch

    def loss(self):
        x = torch.randn(self.batch, 4, generator=self.gen)
        y = torch.stack([layer(x) for layer in self.model]).sum(0)
        return y.square().mean()


# -- one tensor larger than the staging memory ------------------------------------

class BigTensorWorkload(Workload):
    """An embedding table of `rows` x `d` fp32 (16 MiB by default) and a small
    classifier, trained with SGD + momentum (a second table-sized tensor)."""

    def __init__(self, seed=0, rows=32768, d=128, batch=64, classes=16):
        torch.manual_seed(seed)
        model = nn.ModuleDict({"table": nn.Embedding(rows, d), "cls": nn.Linear(d, classes)})
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        super().__init__(model, optimizer, seed)
        self.rows, self.batch, self.classes = rows, batch, classes

    def loss(self):
        idx = torch.randint(self.rows, (self.batch,), generator=self.gen)
        y = torch.randint(self.classes, (self.batch,), generator=self.gen)
        return F.cross_entropy(self.model["cls"](self.model["table"](idx)), y)


def make(kind, seed=0, **sizes):
    """A workload by name (the names the tests and the bench use)."""
    if kind == "gpt":
        return GptWorkload(seed, **sizes)
    if kind == "gpt_mixed":
        return GptWorkload(seed, mixed=True, **sizes)
    if kind == "gpt_shards":  # ~165 MB of state in 10 shard files (16 MiB at least each)
        return GptWorkload(seed, **{"vocab": 8192, "d": 256, "layers": 12, "seq": 8, "batch": 2, **sizes})
    if kind == "resnet":
        return ResNetWorkload(seed, **sizes)
    if kind == "tiny10k":
        return TinyTensorsWorkload(seed, **sizes)
    if kind == "bigtensor":
        return BigTensorWorkload(seed, **sizes)
    raise ValueError(f"unknown workload {kind!r}")


# -- state trees ------------------------------------------------------------------

def tensors_of(tree):
    """Every tensor in a nested state, in order."""
    if isinstance(tree, torch.Tensor):
        yield tree
    elif isinstance(tree, dict):
        for v in tree.values():
            yield from tensors_of(v)
    elif isinstance(tree, (list, tuple)):
        for v in tree:
            yield from tensors_of(v)


def state_bytes(tree):
    return sum(t.numel() * t.element_size() for t in tensors_of(tree))


def clone_tree(tree):
    """A deep copy: tensors cloned, containers (and a state_dict's _metadata) kept."""
    if isinstance(tree, torch.Tensor):
        return tree.detach().clone()
    if isinstance(tree, dict):
        out = type(tree)((k, clone_tree(v)) for k, v in tree.items())
        if hasattr(tree, "_metadata"):
            out._metadata = clone_tree(tree._metadata)
        return out
    if isinstance(tree, (list, tuple)):
        return type(tree)(clone_tree(v) for v in tree)
    return tree
