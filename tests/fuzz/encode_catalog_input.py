#!/usr/bin/env python3
"""Encodes a checkpoint root on disk as a fuzz_catalog input (the format of
catalog_input.h), to turn a hand-edited root into a reproducer:

    encode_catalog_input.py [--flags N] ROOT > input

Regular files only, one level of directories; a directory or file that is a
symlink is encoded as linked (kDirLinked, kFileLinked / kManifestLinked),
a FIFO as kFifo. Manifests lose their checksum trailer (fuzz_catalog adds
it back) and the checksum the previous manifest's trailer holds becomes
"$PREV", so a base edited by hand (its trailer left as it was) stays the
base of its deltas.
"""
import argparse
import os
import re
import stat
import struct
import sys

K_FILE, K_MANIFEST, K_FILE_LINKED, K_MANIFEST_LINKED, K_EMPTY_DIR, K_DIR_LINKED, K_ODD, K_FIFO = range(8)
D_ROOT, D_STEP, D_STEP64, D_RAW = 0, 1, 2, 6
F_MANIFEST, F_LATEST, F_RAW = 0, 1, 2
TRAILER = re.compile(rb',\n "manifest_xxh3": "([0-9a-f]{16})"\n}\n$')


def segments(data):
    out, i, count = bytearray(), 0, 0
    while i < len(data) and count < 255:
        zeros = 0
        while i + zeros < len(data) and data[i + zeros] == 0 and zeros < 0xFFFF:
            zeros += 1
        if zeros < 64 and i + zeros < len(data):
            zeros = 0
        begin = end = i + zeros
        run = 0
        while end < len(data) and end - begin < 0xFFFF:
            run = run + 1 if data[end] == 0 else 0
            end += 1
            if run == 64:
                end -= 64
                break
        out += struct.pack("<HH", zeros, end - begin) + data[begin:end]
        count += 1
        i = end
    return bytes([count]) + bytes(out)


def dir_sel(name):
    m = re.fullmatch(r"step-(\d{20})", name)
    if m and int(m.group(1)) < 2**63:
        step = int(m.group(1))
        return bytes([D_STEP, step]) if step < 256 else bytes([D_STEP64]) + struct.pack("<q", step)
    if name == "":
        return bytes([D_ROOT])
    return bytes([D_RAW, len(name)]) + name.encode()


def file_sel(name):
    if name == "MANIFEST.json":
        return bytes([F_MANIFEST])
    if name == "LATEST":
        return bytes([F_LATEST])
    return bytes([F_RAW, len(name)]) + name.encode()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--flags", type=int, default=0)
    ap.add_argument("root")
    args = ap.parse_args()
    out = bytearray([args.flags])
    prev = b"0000000000000000"
    entries = []
    for name in sorted(os.listdir(args.root)):
        path = os.path.join(args.root, name)
        st = os.lstat(path)
        if stat.S_ISLNK(st.st_mode) and os.path.isdir(path):
            out += bytes([K_DIR_LINKED]) + dir_sel(name)
        if os.path.isdir(path):
            for f in sorted(os.listdir(path)):
                entries.append((name, f, os.path.join(path, f)))
        else:
            entries.append(("", name, path))
    for d, f, path in entries:
        st = os.lstat(path)
        linked = stat.S_ISLNK(st.st_mode)
        if stat.S_ISFIFO(os.stat(path).st_mode if linked else st.st_mode):
            out += bytes([K_FIFO]) + dir_sel(d) + file_sel(f)
            continue
        data = open(path, "rb").read()
        trailer = TRAILER.search(data) if f == "MANIFEST.json" else None
        if trailer:
            body = data[: trailer.start()].replace(prev, b"$PREV")
            prev = trailer.group(1)
            out += bytes([K_MANIFEST_LINKED if linked else K_MANIFEST]) + dir_sel(d)
            out += struct.pack("<H", len(body)) + body
        else:
            out += bytes([K_FILE_LINKED if linked else K_FILE]) + dir_sel(d) + file_sel(f) + segments(data)
    sys.stdout.buffer.write(out)


if __name__ == "__main__":
    main()
