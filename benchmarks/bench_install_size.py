"""Install sizes of treellm's core and of each extra, and the cost of the core's choices.

Builds fresh virtual environments offline from the wheelhouse (``make wheelhouse``) and the
wheel of this tree, and prints the size of each one's site-packages beside the core's; then
the speed of the signature hash with numpy (an extra) and without (the core's loop), side by
side in one run.

    .venv/bin/python benchmarks/bench_install_size.py
"""

from __future__ import annotations

import importlib
import os
import subprocess
import sys
import tempfile
import timeit
import venv
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
WHEELHOUSE = ROOT / ".wheelhouse"
TARGETS = [
    "treellm",
    "treellm[openai]",
    "treellm[mcp]",
    "treellm[store]",
    "treellm[collector]",
    "treellm[dashboard]",
    "treellm[clickhouse]",
    "treellm[chdb]",
    "treellm[all]",
]


def _size(folder: Path) -> int:
    return sum(f.stat().st_size for f in folder.rglob("*") if f.is_file() and not f.is_symlink())


def _site(env: Path) -> Path:
    return next((env / "lib").glob("python*/site-packages"))


def main() -> None:
    if not (WHEELHOUSE / ".complete").exists():
        subprocess.run(["make", "-C", str(ROOT), "wheelhouse"], check=True)
    with tempfile.TemporaryDirectory() as tmp:
        dist = Path(tmp) / "dist"
        subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w",
                        str(dist), str(ROOT)], check=True)  # fmt: skip
        empty = Path(tmp) / "empty"
        venv.create(empty, with_pip=True)
        base = _size(_site(empty))
        sizes = {}
        for target in TARGETS:
            env = Path(tmp) / target.replace("[", "_").replace("]", "")
            venv.create(env, with_pip=True)
            subprocess.run([str(env / "bin" / "python"), "-m", "pip", "install", "-q", "--disable-pip-version-check",
                            "--no-index", "--find-links", str(WHEELHOUSE), "--find-links", str(dist), target],
                           check=True)  # fmt: skip
            sizes[target] = _size(_site(env)) - base
    core = sizes["treellm"]
    print("install size (site-packages, beyond an empty venv with pip)")
    print(f"{'install':<24}{'MB':>10}{'x core':>10}")
    for target, size in sizes.items():
        print(f"{target:<24}{size / 1e6:>10.1f}{size / core:>10.2f}")

    sys.path.insert(0, str(ROOT))
    signature = importlib.import_module("treellm.signature")  # the module (treellm.signature is also a function)

    print("\nsignature hash of a 10,000-character argument text (median of 5 x 200)")
    text = "x" * 10_000
    with_numpy = min(timeit.repeat(lambda: signature.djb2(text), number=200, repeat=5)) / 200
    loop = min(timeit.repeat(lambda: signature._djb2_loop(text.encode()), number=200, repeat=5)) / 200
    small = '{"query":"refund policy"}'
    small_numpy = min(timeit.repeat(lambda: signature.djb2(small), number=20_000, repeat=5)) / 20_000
    print(f"{'way':<34}{'us':>10}{'ratio':>10}")
    print(f"{'numpy (store extra installed)':<34}{with_numpy * 1e6:>10.1f}{1.0:>10.2f}")
    print(f"{'Python loop (core without numpy)':<34}{loop * 1e6:>10.1f}{loop / with_numpy:>10.2f}")
    print(f"{'a 25-character argument (both)':<34}{small_numpy * 1e6:>10.2f}{small_numpy / with_numpy:>10.2f}")
    print(f"\ncpu count {os.cpu_count()}")


if __name__ == "__main__":
    main()
