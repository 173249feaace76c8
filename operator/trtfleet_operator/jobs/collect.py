"""Entrypoint of the collect Job: ``python3 -m trtfleet_operator.jobs.collect --root /volume --remove REL ...``.

Removes directories of a mounted engine or adapter volume that nothing uses any more: a deleted Adapter's
converted or staged artifact, an engine or a staged checkpoint past its retention. Each ``REL`` must stay
inside ``--root`` once normalised (no ``..``, not the root itself); one that is already gone counts as
removed, so a retried Job is harmless. Where the build runner left its lock beside ``<root>/<first part of
REL>`` (``.<name>.lock``, engines) it holds that ``flock`` while removing, so a build of the same hash that
starts meanwhile waits and then finds no engine. Exit codes: 0 done, 2 a path outside the root (never retried).
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import json
import shutil
import sys
from collections.abc import Sequence
from pathlib import Path

EXIT_BAD_PATH = 2


def inside(root: Path, relative: str) -> Path:
    """``root / relative``, refused (ValueError) unless it lies strictly inside ``root``."""
    parts = Path(relative).parts
    if not parts or Path(relative).is_absolute() or ".." in parts or "." in parts:
        raise ValueError(f"{relative!r} is not a path inside {root}")
    return root / relative


def remove(root: Path, relative: str) -> bool:
    """Remove ``root/relative``, under the build lock of its top directory where a build made one (engines;
    it stays, for the next build of that hash); True when something was removed."""
    target = inside(root, relative)
    top = root / Path(relative).parts[0]
    lock_path = top.parent / f".{top.name}.lock"
    with contextlib.ExitStack() as stack:
        if lock_path.exists():
            fcntl.flock(stack.enter_context(open(lock_path, "a+")), fcntl.LOCK_EX)
        if not target.exists() and not target.is_symlink():
            return False
        if target.is_dir() and not target.is_symlink():
            shutil.rmtree(target)
        else:
            target.unlink()
        return True


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python3 -m trtfleet_operator.jobs.collect", description=__doc__)
    p.add_argument("--root", required=True, type=Path, help="where the volume is mounted")
    p.add_argument("--remove", action="append", required=True, metavar="REL", help="a directory to remove")
    args = p.parse_args(argv)
    try:
        for relative in args.remove:
            inside(args.root, relative)
    except ValueError as exc:
        print(f"collect: {exc}", file=sys.stderr)
        return EXIT_BAD_PATH
    removed = [relative for relative in args.remove if remove(args.root, relative)]
    print(json.dumps({"removed": removed, "absent": [r for r in args.remove if r not in removed]}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
