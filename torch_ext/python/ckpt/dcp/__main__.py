"""python3 -m ckpt.dcp import DCP_DIR ROOT STEP [--staging-bytes N] [--no-verify]

Converts a DCP FileSystemWriter directory into checkpoint STEP of the ckpt
root ROOT (what `ckpt-restore --root ROOT --import-dcp DCP_DIR --step STEP`
runs). Prints the save's statistics as one JSON line; exits 1 with the
error on stderr if the directory is incomplete or unsafe.
"""
import argparse
import json
import sys


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python3 -m ckpt.dcp")
    sub = parser.add_subparsers(dest="command", required=True)
    imp = sub.add_parser("import", help="import a DCP FileSystemWriter directory")
    imp.add_argument("dcp_dir")
    imp.add_argument("root")
    imp.add_argument("step", type=int)
    imp.add_argument("--staging-bytes", type=int, default=256 << 20)
    imp.add_argument("--no-verify", action="store_true")
    args = parser.parse_args(argv)
    import ckpt.dcp
    try:
        stats = ckpt.dcp.import_checkpoint(args.dcp_dir, args.root, args.step,
                                           staging_bytes=args.staging_bytes,
                                           verify=not args.no_verify)
    except (ckpt.CheckpointError, ValueError, OSError) as e:
        print(f"ckpt.dcp import: {e}", file=sys.stderr)
        return 1
    print(json.dumps({"imported": args.dcp_dir, "root": args.root, "step": args.step,
                      "tensor_bytes": stats.get("tensor_bytes"),
                      "file_bytes": stats.get("file_bytes")}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
