"""The environment of the processes the orchestrator starts that run user code: local workers and the
import probe.

They get an allow-list of the server's environment, not all of it: the server's may hold the admin
token (``SPOTSWARM_ADMIN_TOKEN``), the database URL with its password and cloud credentials, and a run's
module is whatever the admin token holder named. What passes: the basics of a shell (``PATH``, ``HOME``,
locale, ``TMPDIR``), the Python environment (``PYTHONPATH``, virtualenv and conda), accelerator and
thread settings (``CUDA_*``, ``NVIDIA_*``, ``OMP_NUM_THREADS``...), caches, proxies and CA bundles, and
the worker agent's own ``SPOTSWARM_*`` settings. Anything else a user's code needs (a dataset token,
``AWS_PROFILE`` for S3 data) is named in ``--worker-env`` (``SPOTSWARM_WORKER_ENV``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

# Names, or prefixes ending in "*", passed by default.
DEFAULT_PASSED: tuple[str, ...] = (
    "PATH",
    "HOME",
    "USER",
    "LOGNAME",
    "SHELL",
    "TERM",
    "TZ",
    "LANG",
    "LANGUAGE",
    "LC_*",
    "TMPDIR",
    "PYTHONPATH",
    "PYTHONUNBUFFERED",
    "VIRTUAL_ENV",
    "CONDA_*",
    "LD_LIBRARY_PATH",
    "CUDA_*",
    "NVIDIA_*",
    "HIP_VISIBLE_DEVICES",
    "ROCR_VISIBLE_DEVICES",
    "OMP_NUM_THREADS",
    "MKL_NUM_THREADS",
    "XDG_CACHE_HOME",
    "HF_HOME",
    "TORCH_HOME",
    "SSL_CERT_FILE",
    "SSL_CERT_DIR",
    "REQUESTS_CA_BUNDLE",
    "HTTP_PROXY",
    "HTTPS_PROXY",
    "NO_PROXY",
    "http_proxy",
    "https_proxy",
    "no_proxy",
    # the worker agent's settings (worker/agent/config.py, worker/runtime/logsetup.py); never the server's own
    "SPOTSWARM_LOG_LEVEL",
    "SPOTSWARM_LOG_FORMAT",
    "SPOTSWARM_HIVEMIND_LOG_LEVEL",
    "SPOTSWARM_ACCELERATOR",
    "SPOTSWARM_PEERS_REFRESH_S",
    "SPOTSWARM_REGISTER_TIMEOUT_S",
    "SPOTSWARM_STOP_GRACE_S",
    "SPOTSWARM_ORCHESTRATOR_LOST_TIMEOUT_S",
    "SPOTSWARM_METADATA_URL",
    "SPOTSWARM_CACHE_DIR",
    "SPOTSWARM_INSTALLER",
    "SPOTSWARM_INSTALL_TIMEOUT_S",
)


def _matches(name: str, pattern: str) -> bool:
    return name.startswith(pattern[:-1]) if pattern.endswith("*") else name == pattern


def child_env(environ: Mapping[str, str], extra: Iterable[str] = ()) -> dict[str, str]:
    """The variables of ``environ`` named by :data:`DEFAULT_PASSED` or ``extra`` (names or ``PREFIX*``)."""
    patterns = (*DEFAULT_PASSED, *extra)
    return {name: value for name, value in environ.items() if any(_matches(name, p) for p in patterns)}
