"""Read-once restore of replicated state across a process group.

With DDP, every rank's part of a checkpoint holds every replicated tensor
(the model and its optimizer state), so a group of N ranks that each read
its part reads the replicated state N times: N times the bytes over the
disk or the network file system, N times the time where they share it.
Here each replicated tensor that every rank loads is read from storage by
one rank, its reader, and sent to the others over the group:

- readers: largest tensor first, each to the rank with the fewest bytes so
  far (the rule the save uses to spread the writing), computed alike on
  every rank from the manifest;
- each rank reads its share a batch at a time (`BATCH_BYTES`) and, as soon
  as every rank has read batch k, batch k of every reader is broadcast
  (asynchronously) while the next batch is read, so the transfers overlap
  the reads; tensors under `PACK_BYTES` travel packed, one broadcast per
  batch, larger ones straight into their destinations;
- a rank's own tensors (rank-local, default, DTensor boxes) are read by it
  alone, after its share, while the last broadcasts run;
- every read is verified by the rank that reads it (its checksums), and a
  failure on any rank fails the step on every rank alike (the loader then
  tries an older step on every rank, as without sharing).

It needs a group that can broadcast CPU tensors (a gloo backend, alone or
beside nccl); destinations on other devices are read by each rank itself.
"""
import torch

from ._dist_load import collective
from ._distributed import any_rank
from .errors import CheckpointError, translate

BATCH_BYTES = 64 << 20  # a rank's share is read and sent this much at a time
PACK_BYTES = 1 << 20  # tensors smaller than this travel packed together


def usable(group):
    """Whether `group` can broadcast CPU tensors (what sharing needs)."""
    import torch.distributed as dist
    return "gloo" in str(dist.get_backend(group))


class Item:
    """One tensor a rank loads: `dst` its destination (None: a new tensor),
    `shareable` whether it may be read by one rank for all."""
    __slots__ = ("name", "dst", "shape", "dtype", "nbytes", "shareable", "got")

    def __init__(self, name, dst, shape, dtype, nbytes, shareable):
        self.name, self.dst, self.shape, self.dtype = name, dst, tuple(shape), dtype
        self.nbytes, self.shareable, self.got = int(nbytes), shareable, None


def readers(names, nbytes, world):
    """{name: rank that reads it}: largest first, each to the rank with the
    fewest bytes so far (ties: the lower rank; equal sizes: by name)."""
    load = [0] * world
    out = {}
    for name in sorted(names, key=lambda n: (-nbytes[n], n)):
        r = min(range(world), key=lambda i: (load[i], i))
        out[name] = r
        load[r] += nbytes[name]
    return out


def batches(names, nbytes):
    """`names` (in order) cut into batches of about BATCH_BYTES."""
    out, cur, size = [], [], 0
    for n in names:
        if cur and size + nbytes[n] > BATCH_BYTES:
            out.append(cur)
            cur, size = [], 0
        cur.append(n)
        size += nbytes[n]
    if cur:
        out.append(cur)
    return out


def _bytes_of(t):
    return t.reshape(-1).view(torch.uint8)


class _Exchange:
    """One step's read of this rank's items, the shared ones read once."""

    def __init__(self, group, root, reader, items, shared):
        # shared: the names read once for the group, the same list on every rank.
        self.group, self.root, self.reader = group, root, reader
        self.rank, self.world = group.rank(), group.size()
        self.items = {it.name: it for it in items}
        nbytes = {n: self.items[n].nbytes for n in shared}
        self.reader_of = readers(shared, nbytes, self.world)
        order = {n: i for i, n in enumerate(shared)}
        # batches[r][k]: reader r's k-th batch, in manifest order (file order).
        self.batches = [batches(sorted((n for n in shared if self.reader_of[n] == r), key=order.get),
                                nbytes) for r in range(self.world)]
        self.works = []
        self.unpack = []  # (packed buffer, [(item, offset)]) to copy out once all arrived
        self.bytes_received = 0

    def _read(self, names):
        """Reads `names` (this rank's) into their destinations, or new tensors."""
        if not names:
            return
        items = [self.items[n] for n in names]
        into = [it for it in items if it.dst is not None]
        new = [it for it in items if it.dst is None]
        with torch.no_grad(), translate():
            if into:
                self.reader.read_into([it.name for it in into], [it.dst for it in into])
            if new:
                for it, t in zip(new, self.reader.read_new([it.name for it in new])):
                    it.got = t

    def _landing(self, it):
        """The tensor a shared item is received into: its destination when
        that is a contiguous CPU tensor, else a new one (copied over later)."""
        if it.dst is not None and it.dst.is_contiguous() and it.dst.device.type == "cpu":
            return it.dst
        if it.got is None:
            it.got = torch.empty(it.shape, dtype=it.dtype)
        return it.got

    def _source(self, it):
        return it.dst if it.got is None else it.got

    def _send(self, k):
        """Starts the broadcasts of every reader's batch k."""
        import torch.distributed as dist
        for r in range(self.world):
            if k >= len(self.batches[r]):
                continue
            src = dist.get_global_rank(self.group, r)
            mine = r == self.rank
            items = [self.items[n] for n in self.batches[r][k]]
            small = [it for it in items if it.nbytes < PACK_BYTES]
            for it in items:
                if it.nbytes >= PACK_BYTES:
                    t = self._source(it) if mine else self._landing(it)
                    self.works.append(dist.broadcast(_bytes_of(t), src=src, group=self.group, async_op=True))
                    self.bytes_received += 0 if mine else it.nbytes
            total = sum(it.nbytes for it in small)
            if total:
                packed = torch.empty(total, dtype=torch.uint8)
                places, offset = [], 0
                for it in small:
                    if mine and it.nbytes:
                        packed[offset:offset + it.nbytes].copy_(_bytes_of(self._source(it)))
                    places.append((it, offset))
                    offset += it.nbytes
                self.works.append(dist.broadcast(packed, src=src, group=self.group, async_op=True))
                if not mine:
                    self.unpack.append((packed, places))
                    self.bytes_received += total

    def _settle(self):
        """Waits for every broadcast started."""
        works, self.works = self.works, []
        for w in works:
            w.wait()

    def _fail_everywhere(self, error):
        """After a read failed on some rank: waits for the transfers under
        way, then raises on every rank (collective)."""
        self._settle()

        def check():
            if error is not None:
                raise error
            return None, None
        collective(self.group, self.root, check)

    def run(self):
        rounds = max((len(b) for b in self.batches), default=0)
        for k in range(rounds):
            error = None
            try:
                self._read(self.batches[self.rank][k] if k < len(self.batches[self.rank]) else [])
            except CheckpointError as e:
                error = e
            if any_rank(error is not None, self.group):
                self._fail_everywhere(error)
            self._send(k)
        error = None
        try:  # this rank's own tensors, while the last batches travel
            self._read([n for n in self.items if n not in self.reader_of])
        except CheckpointError as e:
            error = e
        if any_rank(error is not None, self.group):
            self._fail_everywhere(error)
        self._settle()
        for packed, places in self.unpack:
            for it, offset in places:
                if it.nbytes:
                    _bytes_of(self._landing(it)).copy_(packed[offset:offset + it.nbytes])
        with torch.no_grad():
            for it in self.items.values():  # received through a temporary: into its destination
                if it.dst is not None and it.got is not None:
                    it.dst.copy_(it.got)
        return {n: (it.dst if it.got is None else it.got) for n, it in self.items.items()}


def load_step(group, root, step, plan_local):
    """Loads step `step` on every rank of `group` (a collective), each
    replicated tensor read by one rank; returns (this rank's finish(tensors)
    result, stats {"bytes_read", "bytes_received", "shared_tensors"}).

    plan_local(): this rank's plan, (reader, items, finish): `reader` a
    torch.classes.ckpt.StepReader of the step, `items` the tensors it loads
    (Item), finish({name: tensor}) -> the state, run once all arrived. A
    failure on any rank raises on every rank (CheckpointError: the step does
    not load; ValueError/TypeError: the request is wrong)."""
    def plan():
        reader, items, finish = plan_local()
        wanted = [it.name for it in items if it.shareable]
        return wanted, (reader, items, finish)

    wanted, (reader, items, finish) = collective(group, root, plan)
    # Shared: what every rank wants (in rank 0's order), the same on every rank.
    common = set(wanted[0]).intersection(*map(set, wanted[1:]))
    shared = [n for n in wanted[0] if n in common]
    exchange = _Exchange(group, root, reader, items, shared)
    tensors = exchange.run()
    state = finish(tensors)
    return state, {"bytes_read": reader.bytes_read(), "bytes_received": exchange.bytes_received,
                   "shared_tensors": len(shared), "own_tensors": len(items) - len(shared)}
