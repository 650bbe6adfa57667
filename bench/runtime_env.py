"""How long a replacement worker spends making a run's code ready: cold (a new machine: nothing cached,
not even the installer's own download cache) against a cached digest, with uv and with pip, in one run.

    python bench/runtime_env.py [--requirement SPEC ...] [--repeat N]

For each installer it packs a small project, then times :func:`worker.runtime.env.prepare_runtime` (the
agent's step between registration and importing the run's module: extract the package, install the
requirements into the layered environment) on an empty cache and again on the filled one. The package
is copied from disk, so the download from the orchestrator is not in the figures. The requirements come
from the package index the installers are configured with (network); the default ones depend on torch,
which must be found installed, never downloaded. Prints the machine's load: the figures of a busy
machine are slower, the ratios less so.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from orchestrator.cli.packaging import pack
from worker.runtime.env import find_installer, prepare_runtime

DEFAULT_REQUIREMENTS = ("torchmetrics", "einops", "tabulate")


def project(root: Path) -> Path:
    (root / "benchpkg").mkdir(parents=True)
    (root / "benchpkg" / "__init__.py").write_text("import einops, tabulate, torchmetrics\n")
    return root


def prepare_s(archive: Path, digest: str, requirements: list[str], installer: str, cache: Path) -> float:
    environ = {
        **os.environ,
        "UV_CACHE_DIR": str(cache / "uv-cache"),  # the installer's own cache starts empty too
        "PIP_CACHE_DIR": str(cache / "pip-cache"),
    }
    started = time.perf_counter()
    runtime = prepare_runtime(
        digest,
        requirements,
        cache_dir=cache / "spotswarm",
        fetch=lambda dest: shutil.copyfile(archive, dest),
        installer=find_installer(installer),
        environ=environ,
        timeout_s=1800,
        max_unpacked_bytes=1 << 30,
    )
    elapsed = time.perf_counter() - started
    assert runtime.site_dir is not None and not (runtime.site_dir / "torch").exists(), "torch reinstalled"
    return elapsed


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--requirement", action="append", help=f"default: {' '.join(DEFAULT_REQUIREMENTS)}")
    parser.add_argument("--repeat", type=int, default=1, help="cold/warm pairs per installer (median)")
    args = parser.parse_args()
    requirements = list(args.requirement or DEFAULT_REQUIREMENTS)
    load_before = os.getloadavg()
    results: dict[str, tuple[float, float]] = {}
    with tempfile.TemporaryDirectory(prefix="spotswarm-bench-") as tmp:
        package = pack(project(Path(tmp) / "project"), Path(tmp), 1 << 20)
        for installer in ("uv", "pip"):
            cold, warm = [], []
            for attempt in range(args.repeat):
                cache = Path(tmp) / f"{installer}-{attempt}"
                cold.append(prepare_s(package.archive, package.sha256, requirements, installer, cache))
                warm.append(prepare_s(package.archive, package.sha256, requirements, installer, cache))
            results[installer] = (statistics.median(cold), statistics.median(warm))
    load_after = os.getloadavg()
    print(f"requirements: {' '.join(requirements)} (the worker's torch is reused)")
    print(f"{'installer':<10} {'cold s':>8} {'cached s':>9} {'cold/cached':>12}")
    for installer, (cold_s, warm_s) in results.items():
        print(f"{installer:<10} {cold_s:>8.2f} {warm_s:>9.3f} {cold_s / warm_s:>11.0f}x")
    print(f"cold install, pip / uv: {results['pip'][0] / results['uv'][0]:.1f}x")
    print(
        f"load average (1 min) before {load_before[0]:.1f}, after {load_after[0]:.1f}; {os.cpu_count()} CPUs"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
