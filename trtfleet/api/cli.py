"""``trtfleet crds``: print the CRD YAML, write it to a folder, or check a folder for drift."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from trtfleet.api.crdgen import render_crds, write_crds
from trtfleet.api.docgen import render_crd_reference


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--out", type=Path, help="write one file per CRD into this folder (atomically)")
    parser.add_argument("--check", type=Path, help="exit 1 if this folder differs from a fresh generation")
    parser.add_argument("--markdown", action="store_true", help="print the field reference as Markdown")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    if args.markdown:
        sys.stdout.write(render_crd_reference())
        return 0
    if args.check is not None:
        stale = [
            name
            for name, text in render_crds().items()
            if not (args.check / name).is_file() or (args.check / name).read_text() != text
        ]
        if stale:
            print(f"CRDs out of date in {args.check}: {', '.join(stale)}; run `make crds`", file=sys.stderr)
            return 1
        return 0
    if args.out is not None:
        for path in write_crds(args.out):
            print(path)
        return 0
    sys.stdout.write("---\n".join(render_crds().values()))
    return 0
