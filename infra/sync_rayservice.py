#!/usr/bin/env python3
"""Keep the RayService's ``serveConfigV2`` equal to ``serve_configs/gpu.yaml``.

KubeRay takes the Serve config inline, as a YAML string under ``spec.serveConfigV2`` of
``infra/kuberay/rayservice.yaml``. The source of truth is ``serve_configs/gpu.yaml``, the file
``serve deploy`` takes. This script copies that file's text into the block verbatim (comments
included) and leaves every other byte of the manifest as it is.

    python infra/sync_rayservice.py           # rewrite the block
    python infra/sync_rayservice.py --check   # exit 1 if the block is stale (tests, CI)
"""

from __future__ import annotations

import argparse
import difflib
import re
import sys
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
SERVE_CONFIG = REPO / "serve_configs" / "gpu.yaml"
RAYSERVICE = REPO / "infra" / "kuberay" / "rayservice.yaml"

_BLOCK_KEY = re.compile(r"^(?P<indent> *)serveConfigV2: *\|[-+]? *(#.*)?$")


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip(" "))


def render(manifest: str, serve_config: str) -> str:
    """``manifest`` with its ``serveConfigV2: |`` block replaced by ``serve_config``'s text.

    The manifest must hold exactly one such block key. Raises ``ValueError`` when it does not, or
    when the result does not parse back to the same Serve config.
    """
    lines = manifest.splitlines(keepends=True)
    keys = [i for i, line in enumerate(lines) if _BLOCK_KEY.match(line.rstrip("\n"))]
    if len(keys) != 1:
        raise ValueError(
            f"expected exactly one 'serveConfigV2: |' line in the manifest, found {len(keys)}"
        )
    start = keys[0]
    indent = _indent(lines[start])
    end = start + 1
    while end < len(lines) and (not lines[end].strip() or _indent(lines[end]) > indent):
        end += 1
    while end > start + 1 and not lines[end - 1].strip():
        end -= 1  # blank lines after the block belong to what follows it

    prefix = " " * (indent + 2)
    body = [
        prefix + line if line.strip() else "\n"
        for line in serve_config.rstrip("\n").splitlines(keepends=False)
    ]
    block = [" " * indent + "serveConfigV2: |\n"] + [line.rstrip(" ") + "\n" for line in body]
    result = "".join(lines[:start] + block + lines[end:])

    embedded = yaml.safe_load(result)["spec"]["serveConfigV2"]
    if yaml.safe_load(embedded) != yaml.safe_load(serve_config):
        raise ValueError("the rendered serveConfigV2 does not parse back to the Serve config")
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="only report; exit 1 when stale")
    parser.add_argument("--serve-config", type=Path, default=SERVE_CONFIG)
    parser.add_argument("--rayservice", type=Path, default=RAYSERVICE)
    args = parser.parse_args(argv)

    current = args.rayservice.read_text(encoding="utf-8")
    try:
        wanted = render(current, args.serve_config.read_text(encoding="utf-8"))
    except ValueError as err:
        print(f"{args.rayservice}: {err}", file=sys.stderr)
        return 2
    if wanted == current:
        print(f"{args.rayservice} is in sync with {args.serve_config}")
        return 0
    if args.check:
        diff = difflib.unified_diff(
            current.splitlines(keepends=True),
            wanted.splitlines(keepends=True),
            fromfile=str(args.rayservice),
            tofile=f"{args.rayservice} (from {args.serve_config})",
        )
        sys.stderr.writelines(diff)
        print(
            f"{args.rayservice}: serveConfigV2 differs from {args.serve_config}; "
            "run `python infra/sync_rayservice.py`",
            file=sys.stderr,
        )
        return 1
    args.rayservice.write_text(wanted, encoding="utf-8")
    print(f"updated serveConfigV2 in {args.rayservice} from {args.serve_config}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
