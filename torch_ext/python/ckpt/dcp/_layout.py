"""Where each item of a DCP save lives in the ckpt checkpoint.

A DCP save is a list of write items per rank: chunks of tensors (a whole
tensor is one chunk) and byte blobs (BytesIO, e.g. a pickled Python value).
Each becomes one ckpt tensor record:

* multi-rank, when the chunks of an fqn tile its global tensor with at most
  one chunk per rank (DCP's planners do that: DTensor shards, deduplicated
  replicated tensors): a sharded ckpt tensor named by the fqn, each rank
  writing its chunk, so ckpt's own readers (ckpt.load, ckpt-restore --out)
  see the whole tensor;
* one process, a whole tensor: a plain ckpt tensor named by the fqn;
* anything else (a planner that writes partial or overlapping chunks): one
  ckpt tensor per chunk, named "<fqn>@[<offsets>]";
* a byte blob: a uint8 tensor named by the fqn.

The decision is taken once, by the coordinator, in prepare_global_plan, and
travels to every rank in its plan's storage_data. What DCP's metadata keeps
for each item (`Metadata.storage_data[index]`) is a plain tuple
`(ckpt tensor name, offsets of the chunk inside it, shape of it)`, so a
reader finds any box of any chunk without another lookup.
"""
import dataclasses
import math

from .errors import DcpError


@dataclasses.dataclass(frozen=True)
class Place:
    """Where one write item goes: the ckpt tensor `name` of shape
    `global_shape`, at `offset` inside it; `sharded`: written as a chunk of
    a multi-rank sharded tensor."""
    name: str
    offset: tuple
    global_shape: tuple
    sharded: bool

    def stored(self):
        """What DCP's metadata records for the item."""
        return (self.name, self.offset, self.global_shape)


@dataclasses.dataclass
class PlanData:
    """SavePlan.storage_data of one rank, set by the coordinator."""
    step: int
    places: dict  # MetadataIndex -> Place


def _is_bytes(item):
    return item.tensor_data is None


def _chunk_boxes(entries):
    return [(tuple(e[1].tensor_data.chunk.offsets), tuple(e[1].tensor_data.chunk.sizes))
            for e in entries]


def _overlap(a, b):
    return all(ao < bo + bs and bo < ao + as_ for ao, as_, bo, bs in zip(a[0], a[1], b[0], b[1]))


def _tiles(entries, size):
    """Whether the chunks of `entries` ((rank, item)) tile a tensor of `size`,
    at most one per rank."""
    ranks = [r for r, _ in entries]
    if len(set(ranks)) != len(ranks):
        return False
    boxes = _chunk_boxes(entries)
    if sum(math.prod(s) for _, s in boxes) != math.prod(size):
        return False
    return not any(_overlap(boxes[i], boxes[j])
                   for i in range(len(boxes)) for j in range(i + 1, len(boxes)))


def _chunk_name(fqn, offsets, taken):
    name = f"{fqn}@[{','.join(str(o) for o in offsets)}]"
    while name in taken:
        name += "~"
    taken.add(name)
    return name


def assign(plans, multi_rank):
    """One dict MetadataIndex -> Place per plan (rank)."""
    by_fqn = {}
    for rank, plan in enumerate(plans):
        for item in plan.items:
            by_fqn.setdefault(item.index.fqn, []).append((rank, item))
    taken = set(by_fqn)
    places = [{} for _ in plans]
    for fqn, entries in by_fqn.items():
        if any(_is_bytes(item) for _, item in entries):
            if len(entries) != 1:
                raise DcpError(f"ckpt.dcp: {fqn!r} is written {len(entries)} times as bytes; "
                               "DCP's planners write each non-tensor item once")
            rank, item = entries[0]
            # (the shape is known once write_data has the bytes; see writer)
            places[rank][item.index] = Place(fqn, (0,), None, multi_rank)
            continue
        size = tuple(entries[0][1].tensor_data.size)
        whole = [tuple(e[1].tensor_data.chunk.sizes) == size for e in entries]
        if multi_rank and _tiles(entries, size):
            for rank, item in entries:
                places[rank][item.index] = Place(fqn, tuple(item.tensor_data.chunk.offsets), size, True)
        elif not multi_rank and len(entries) == 1 and whole[0]:
            rank, item = entries[0]
            places[rank][item.index] = Place(fqn, (0,) * len(size), size, False)
        else:
            for rank, item in entries:
                chunk = item.tensor_data.chunk
                name = _chunk_name(fqn, chunk.offsets, taken)
                places[rank][item.index] = Place(name, (0,) * len(size), tuple(chunk.sizes),
                                                 multi_rank)
    return places
