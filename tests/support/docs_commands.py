# ruff: noqa: E501  (the registries below hold documented command lines verbatim, so a change in the docs shows)
"""The shell commands the documentation shows, and what proves each one works.

:func:`documented_commands` reads every ```bash block of :func:`doc_files` (the pages of the site under
``docs/``, README.md and CONTRIBUTING.md) and yields its logical lines (``\\`` continuations joined,
comment-only lines left out).
Each command is either run by ``tests/integration/test_docs_commands.py`` (every ``spotswarm`` client
command, and the lines of :data:`RUN_IN_SHELL`), run by another test named in :data:`RUN_ELSEWHERE`, or
listed in :data:`NOT_RUN_HERE` with the reason. A new command that is none of these fails
``tests/unit/test_docs_commands.py``, and so does a listed command the docs no longer show.

Placeholders are substituted in one way, the way the CLI reference explains them: UPPERCASE
words (``NAME``, ``N``, ``TEXT``, ``EPOCH``, ``PATH``) are values, ``[...]`` is an optional part (the test
includes it), ``a | b`` inside brackets are alternatives (the test takes the first), ``ssa_...`` is the
admin token.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from tests.support.processes import REPO_ROOT

DOCS_DIR = REPO_ROOT / "docs"
TOP_LEVEL_DOCS = ("README.md", "CONTRIBUTING.md")
CLIENT_COMMANDS = frozenset({"runs", "workers", "checkpoints", "peers"})
SHELL_OPERATORS = ("|", "&&", ">", "$(")


@dataclass(frozen=True)
class DocCommand:
    """One logical command line of a ```bash block."""

    file: str  # relative to the repository, e.g. "docs/operations/status-page-and-cli.md"
    line: int  # where it starts in that file
    text: str  # continuation lines joined, whitespace collapsed, the trailing comment kept

    @property
    def code(self) -> str:
        """The command without its trailing comment."""
        return " ".join(shlex.split(self.text, comments=True)) if self.is_plain_cli else self.text

    @property
    def is_plain_cli(self) -> bool:
        """A ``spotswarm`` client command with no shell around it: run in-process by the docs test."""
        words = self.text.split()
        return (
            len(words) > 1
            and words[0] == "spotswarm"
            and words[1] in CLIENT_COMMANDS
            and not any(op in re.sub(r"\[[^\]]*\]", "", self.text.split("#", 1)[0]) for op in SHELL_OPERATORS)
        )


def _blocks(text: str) -> Iterator[tuple[int, list[str]]]:
    """(first line number, lines) of each ```bash block."""
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        if lines[i].strip() == "```bash":
            start = i + 2
            end = next(j for j in range(i + 1, len(lines)) if lines[j].strip() == "```")
            yield start, lines[i + 1 : end]
            i = end
        i += 1


def _open_quote(text: str) -> bool:
    """Whether ``text`` ends inside a quoted string (a command that goes on on the next line)."""
    try:
        shlex.split(text, comments=True)
    except ValueError:
        return True
    return False


def doc_files() -> list[Path]:
    """Every Markdown file a reader sees: the site's pages (``docs/**/*.md``), README.md, CONTRIBUTING.md."""
    return sorted(DOCS_DIR.rglob("*.md")) + [REPO_ROOT / name for name in TOP_LEVEL_DOCS]


def documented_commands() -> list[DocCommand]:
    """Every command line of every ```bash block in :func:`doc_files`, in file and line order."""
    found: list[DocCommand] = []
    for path in doc_files():
        for start, lines in _blocks(path.read_text()):
            pending: list[str] = []
            for offset, raw in enumerate(lines):
                stripped = raw.strip()
                if not pending and (not stripped or stripped.startswith("#")):
                    continue
                pending.append(stripped.removesuffix("\\").strip())
                if stripped.endswith("\\") or _open_quote(" ".join(pending)):
                    continue
                first = start + offset - len(pending) + 1
                relative = path.relative_to(REPO_ROOT).as_posix()
                found.append(DocCommand(relative, first, re.sub(r"\s+", " ", " ".join(pending))))
                pending = []
    return found


def substitute(argv: list[str], values: dict[str, str]) -> list[str]:
    """Fill the placeholders of ``argv`` (split words of a documented command) as the module says."""
    out: list[str] = []
    optional = skipping = False
    for word in argv:
        if not optional and word.startswith("["):
            optional, word = True, word[1:]
        closes = optional and word.endswith("]")
        if closes:
            optional, word = False, word[:-1]
        if word == "|":  # the alternatives after the first one, up to the closing bracket
            skipping = True
        elif not skipping and word != "...":
            out.append(values.get(word, word))
        skipping = skipping and not closes
    return out


# Lines that are not `spotswarm` client commands but run here as they are (bash, a real orchestrator at
# $URL with $TOKEN, $JOIN_TOKEN of a run of its own, curl failing on HTTP errors): the curl tour of the API.
RUN_IN_SHELL = frozenset(
    {
        'H="Authorization: Bearer $TOKEN"',
        'curl -s -X POST $URL/api/v1/runs -H "$H" -H \'Content-Type: application/json\' -d \'{ "name": "digits", "module": "worker.examples.digits:DigitsModule", "datamodule": "worker.examples.digits:DigitsDataModule", "target_batch_size": 256, "batch_size": 32, "desired_workers": 2, "max_workers": 4, "stop": {"target_epochs": 50}, "checkpoint_every_epochs": 5, "keep_checkpoints": 3}\'',
        "curl -s $URL/api/v1/runs/digits | jq '{state, workers, reported, swarm}'",
        "curl -s -X POST $URL/api/v1/runs/digits/scale -H \"$H\" -H 'Content-Type: application/json' -d '{\"desired_workers\": 4}'",
        'curl -s "$URL/api/v1/runs/digits/events?after_id=0&limit=50" | jq -r \'.items[] | "\\(.at) \\(.kind) \\(.message)"\'',
        "curl -s \"$URL/api/v1/runs/digits/progress?max_points=100\" | jq '.points[-1]'",
        "curl -s $URL/api/v1/runs/digits/peers | jq -r '.initial_peers[]'",
        'curl -s -X POST $URL/api/v1/runs/digits/stop -H "$H"',
        'curl -s -X DELETE $URL/api/v1/runs/digits -H "$H" # once stopped',
        'curl -s -X POST $URL/api/v1/workers/register -H "Authorization: Bearer $JOIN_TOKEN" -H \'Content-Type: application/json\' -d \'{"hostname": "gpu-7"}\'',
        "spotswarm runs show from-spec --json | jq .run.spec > spec.json && spotswarm runs create -f spec.json --name from-spec-2",
        "curl -s $URL/metrics | grep '^spotswarm_run_swarm_epoch'",
    }
)

# Commands another test runs (file::test); a unit test checks that the test exists.
RUN_ELSEWHERE = {
    "spotswarm runs logs digits --worker 7 [--tail-bytes 20000] [--json]": "tests/integration/test_operability.py::test_runs_logs_prints_a_workers_log_tail_and_follows_it_until_the_worker_ends",
    "spotswarm runs logs NAME [--follow] # --follow exits by itself once the run has ended": "tests/integration/test_cli_runs.py::test_logs_prints_history_and_follow_exits_when_the_run_ends",
    "spotswarm runs logs digits --worker 7 -f # then what it writes, until the worker has ended": "tests/integration/test_operability.py::test_runs_logs_prints_a_workers_log_tail_and_follows_it_until_the_worker_ends",
    "spotswarm runs watch NAME [--interval 2] # live table until the run ends; exit 0 completed, 1 failed/stopped": "tests/integration/test_cli_usability.py::test_watch_prints_a_line_per_refresh_without_a_terminal_and_exits_1_when_the_run_stops",
    "spotswarm checkpoints download NAME [EPOCH] [-o PATH] # latest by default; SHA-256 verified": "tests/integration/test_cli_workers.py::test_checkpoints_list_and_download_verified",
    "spotswarm runs revoke-manual-workers NAME [--yes] # ends every worker joined by hand; their tokens stop working": "tests/integration/test_cli_workers.py::test_runs_revoke_manual_workers_ends_them_and_their_tokens",
    "spotswarm checkpoints delete NAME EPOCH [--yes] # one that does not load, or that you no longer trust": "tests/integration/test_cli_workers.py::test_checkpoints_delete_one_epoch_or_every_upload_of_a_worker",
    "spotswarm checkpoints delete NAME --uploaded-by N [--yes] # every one worker N uploaded": "tests/integration/test_cli_workers.py::test_checkpoints_delete_one_epoch_or_every_upload_of_a_worker",
    "spotswarm runs export NAME [--epoch N] [-o model.ckpt] # for plain Lightning / PyTorch (Exporting the model)": "tests/integration/test_stop_keeps_work.py::test_runs_stop_uploads_a_final_checkpoint_of_the_epoch_it_stopped_at",
    ".venv/bin/python bench/time_to_accuracy.py --quick # 1 and 2 peers, one trial, target 0.8: about a minute": "tests/integration/test_bench_time_to_accuracy.py::test_time_to_accuracy_quick_mode_prints_its_table",
    ".venv/bin/python bench/swarm_start.py --rounds 1 # every arm once: about a minute": "tests/integration/test_bench_swarm_start.py::test_swarm_start_bench_prints_every_arm",
    ".venv/bin/python bench/diloco_steps.py --quick # a tiny model, 40 steps: checks the script, measures nothing": "tests/integration/test_bench_diloco_steps.py::test_diloco_steps_quick_mode_prints_a_row_per_arm",
    ".venv/bin/python bench/orchestrated_scaling.py --quick # a tiny model, 6 s a run: checks the script, measures nothing": "tests/integration/test_bench_orchestrated_scaling.py::test_orchestrated_scaling_quick_mode_prints_t1_and_t2_and_leaves_nothing_running",
    ".venv/bin/python bench/scaling.py --quick --arms AEFG --link-mbit 10 # a tiny model, 8 s an arm: checks the script, measures nothing": "tests/integration/test_bench_scaling.py::test_scaling_quick_mode_prints_its_table",
    "make docs-build # the site built with --strict into site/, as CI does": "tests/integration/test_docs_site.py::test_make_docs_build_builds_the_site_strictly_with_its_generated_reference",
    "make docs # the documentation site on 127.0.0.1, rebuilt as you edit; prints its URL": "tests/e2e/test_docs_site.py::test_make_docs_serves_the_site_and_the_browser_asks_nothing_of_other_hosts",
}

# Commands that cannot run on a test machine, and why.
NOT_RUN_HERE = {
    "make demo # the orchestrator + a local run of 2 workers training digits; prints the status page URL": "runs until Ctrl-C on the fixed port 8000; tests/e2e/test_demo_exits.py runs `spotswarm demo` (what it starts) on free ports",
    "make test # every test: unit, integration (real uvicorn, hivemind, SQLite, PostgreSQL, moto) and e2e": "runs every test, this one included",
    "make venv # .venv with torch==2.13.0 (CPU) first, then the project with all its extras": "builds the .venv every test already runs in",
    "make lint # ruff (rules and formatting), mypy and the import contracts": "runs the linters over the whole tree (CI runs it first): a check of the code's form, not a behaviour a test can prove",
    "PYTEST_ARGS='-k strategy -x' make test": "runs tests (make test runs these and every other)",
    "docker build -f deploy/Dockerfile.orchestrator -t $REGISTRY/spotswarm-orchestrator:0.1.0 .": "needs a Docker engine and a registry; tests/integration/test_deploy_static.py checks the Dockerfiles and the compose file",
    "docker build -f deploy/Dockerfile.worker -t $REGISTRY/spotswarm-worker:0.1.0 . # CUDA": "needs a Docker engine and a registry; tests/integration/test_deploy_static.py checks the Dockerfiles and the compose file",
    "docker push $REGISTRY/spotswarm-orchestrator:0.1.0 && docker push $REGISTRY/spotswarm-worker:0.1.0": "needs a Docker engine and a registry; tests/integration/test_deploy_static.py checks the Dockerfiles and the compose file",
    "cd terraform/examples/minimal": "needs an AWS account and a deployed orchestrator; tests/integration/test_terraform.py validates and plans the module offline",
    "terraform init": "needs an AWS account and a deployed orchestrator; tests/integration/test_terraform.py validates and plans the module offline",
    'terraform apply -var "my_ip_cidr=$(curl -s https://checkip.amazonaws.com)/32" -var "registry=123456789012.dkr.ecr.us-east-1.amazonaws.com"': "needs an AWS account and a deployed orchestrator; tests/integration/test_terraform.py validates and plans the module offline",
    "terraform output # orchestrator_url (https://...), launcher_options (launch template, subnets)": "needs an AWS account and a deployed orchestrator; tests/integration/test_terraform.py validates and plans the module offline",
    'aws ssm start-session --target "$(terraform output -raw orchestrator_instance_id)"': "needs an AWS account and a deployed orchestrator; tests/integration/test_terraform.py validates and plans the module offline",
    "sudo cat /var/lib/spotswarm/data/admin_token": "needs an AWS account and a deployed orchestrator; tests/integration/test_terraform.py validates and plans the module offline",
    "sudo cat /var/lib/spotswarm/tls/cert.pem # save it as orchestrator.pem on your machine": "needs an AWS account and a deployed orchestrator; tests/integration/test_terraform.py validates and plans the module offline",
    'openssl s_client -connect "$(terraform output -raw orchestrator_public_ip):443" </dev/null 2>/dev/null | openssl x509 > orchestrator.pem': "needs an AWS account and a deployed orchestrator; tests/integration/test_terraform.py validates and plans the module offline",
    "openssl x509 -in orchestrator.pem -noout -fingerprint -sha256": "needs an AWS account and a deployed orchestrator; tests/integration/test_terraform.py validates and plans the module offline",
    'eval "$(terraform output -raw tls_fingerprint_command)" # the console\'s line: the same fingerprint': "needs an AWS account and a deployed orchestrator; tests/integration/test_terraform.py validates and plans the module offline",
    "export SPOTSWARM_URL=$(terraform output -raw orchestrator_url) SPOTSWARM_TOKEN=ssa_... SPOTSWARM_CA_CERT=$PWD/orchestrator.pem": "needs an AWS account and a deployed orchestrator; tests/integration/test_terraform.py validates and plans the module offline",
    "export POSTGRES_PASSWORD=$(openssl rand -hex 24) # required: compose refuses to start without it": "needs a Docker engine and a registry; tests/integration/test_deploy_static.py checks the Dockerfiles and the compose file",
    "docker compose up -d --build # PostgreSQL + orchestrator on http://localhost:8000": "needs a Docker engine and a registry; tests/integration/test_deploy_static.py checks the Dockerfiles and the compose file",
    "export SPOTSWARM_URL=http://localhost:8000 SPOTSWARM_TOKEN=$(docker compose exec -T orchestrator cat /data/admin_token)": "needs a Docker engine and a registry; tests/integration/test_deploy_static.py checks the Dockerfiles and the compose file",
    "SPOTSWARM_JOIN_TOKEN=ssj_... docker compose --profile workers up -d --build # two CPU workers join": "needs a Docker engine and a registry; tests/integration/test_deploy_static.py checks the Dockerfiles and the compose file",
    "spotswarm serve --data-dir data --host 0.0.0.0 --port 8000 --dht-port 31330": "fixed ports 8000 and 31330 on 0.0.0.0 collide with the other tests' orchestrators; every test starts `spotswarm serve` on free ports (tests/support/orchestrator.py)",
    "export TOKEN=$(cat data/admin_token) URL=http://localhost:8000": "names the port 8000 of the line above; the docs-command test sets URL and TOKEN to its own orchestrator's",
    "createdb spotswarm": "needs the PostgreSQL server db.internal; tests start a throwaway cluster (tests/support/postgres.py) and serve on it (tests/integration/test_db_migrations.py)",
    "export SPOTSWARM_DATABASE_URL=postgresql+psycopg://spotswarm:secret@db.internal:5432/spotswarm": "the PostgreSQL server db.internal of the example; see createdb",
    "spotswarm db upgrade # optional: serve does it too": "the PostgreSQL server db.internal of the example; tests/integration/test_db_migrations.py migrates throwaway databases",
    "spotswarm serve": "port 8000 and the PostgreSQL server of the example; see spotswarm serve --data-dir",
    'curl -s -H "$H" -o digits.ckpt $URL/api/v1/runs/digits/checkpoints/latest/download': "needs a checkpoint, so a training worker; tests/integration/test_cli_workers.py::test_checkpoints_list_and_download_verified downloads through this route",
    ".venv/bin/python bench/fuzz_api.py --examples 500 # own orchestrator, SQLite, private reads": "a benchmark of minutes; tests/api/test_fuzz.py runs the same fuzzer in miniature",
    ".venv/bin/python bench/fuzz_api.py --examples 300 --postgres # own throwaway PostgreSQL": "a benchmark of minutes; tests/api/test_fuzz.py runs the same fuzzer in miniature",
    ".venv/bin/python bench/fuzz_api.py --url $URL --admin-token $TOKEN [--public-reads]": "a benchmark of minutes; tests/api/test_fuzz.py runs the same fuzzer in miniature",
    ".venv/bin/python bench/api_load.py --workers 1000,10000 [--db postgres] [--duration-s 60]": "a benchmark of minutes; tests/integration/test_api_load_smoke.py runs bench/api_load.py with 50 workers",
    ".venv/bin/python bench/recovery.py --heartbeat-timeout-s 10 --rounds 2": "a benchmark of minutes with real training workers",
    ".venv/bin/python bench/diloco_steps.py --workers 2 --steps 1500 --every 20,50,200 # about 25 minutes on one core": "a benchmark of about 25 minutes of training; tests/integration/test_bench_diloco_steps.py runs its quick mode",
    ".venv/bin/python bench/scaling.py --workers 2 --trials 3 --budget-s 300 # each worker on its own core(s)": "a benchmark of about 90 minutes with real training workers; tests/integration/test_bench_scaling.py runs its quick mode",
    ".venv/bin/python bench/scaling.py --arms EGCH --link-mbit 100 # as root: DiLoCo and gradients over capped links": "a benchmark of about 60 minutes with real training workers; tests/integration/test_bench_scaling.py runs its quick mode, capped links included",
    ".venv/bin/python bench/orchestrated_scaling.py --trials 3 --budget-s 150 # about 20 minutes on 2 cores": "a benchmark of about 20 minutes with an orchestrator and real training workers; tests/integration/test_bench_orchestrated_scaling.py runs its quick mode",
    "python bench/spot_replay.py --trace trace_hh_55_65.txt --slots 2 --compress 10 --sync diloco": "a benchmark of 6 minutes with real training workers, on a trace file of Parcae's artifact (not shipped); tests/integration/test_bench_spot_replay.py runs its quick mode, in this mode",
    "python bench/spot_replay.py --trace trace_hh_55_65.txt --slots 2 --compress 10 --sync gradients": "a benchmark of 6 minutes with real training workers, on a trace file of Parcae's artifact (not shipped); tests/integration/test_bench_spot_replay.py runs its quick mode, and tests/unit/test_spot_market.py reads an excerpt of this trace",
    "python bench/spot_replay.py --trace trace_lh_80_90.txt --slots 2 --compress 10 --sync diloco": "a benchmark of 6 minutes with real training workers, on another trace file of Parcae's artifact (not shipped); tests/integration/test_bench_spot_replay.py runs its quick mode, in this mode",
    ".venv/bin/python bench/worker_start.py --rounds 4": "a benchmark of minutes with two orchestrators and real training workers; tests/integration/test_local_preload.py tests the preloaded start it measures",
    ".venv/bin/python -m worker.examples.local_swarm --peers 2 --seconds 60": "trains two real peers for 60 s; tests/integration/test_swarm_training.py trains real peers",
    ".venv/bin/python bench/strategy_overhead.py # CPU, ~15 min on 2 busy cores": "a benchmark of about 15 minutes",
    ".venv/bin/python bench/swarm_batch.py --peers 2,4 --trials 2 --seconds 40 --target-batch-size 4096 --hidden 64 --trackers hivemind,swarm,state10 --trace": "a benchmark of about 15 minutes with real peers; tests/integration/test_swarm_tracker.py checks the tracker it measures",
    ".venv/bin/python bench/swarm_batch.py --peers 2,4 --trials 2 --seconds 60 --target-batch-size 16384 --hidden 64 --trackers state10 --trace": "a benchmark of about 5 minutes with real peers; tests/integration/test_swarm_tracker.py checks the tracker it measures",
    ".venv/bin/python bench/swarm_batch.py --peers 2,4 --trials 2 --seconds 40 --target-batch-size 4096 --hidden 64 --trackers state10 --trace": "a benchmark of about 4 minutes with real peers; tests/integration/test_swarm_tracker.py checks the tracker it measures",
    ".venv/bin/python bench/averaging.py --trials 2 --seconds 60 # admission on and off, side by side": "a benchmark of about 8 minutes with real training workers; tests/e2e/test_averaging_outcomes.py and the completion test in tests/e2e/test_runs_keep_going.py read the same counts",
    ".venv/bin/python bench/swarm_start.py --rounds 8": "a benchmark of a few minutes with real peers; tests/integration/test_bench_swarm_start.py runs one round",
    ".venv/bin/python bench/time_to_accuracy.py --peers 1,2,4 --trials 3 --target 0.95 [--accelerator cuda]": "a benchmark of many minutes (or a CUDA GPU); tests/integration/test_bench_time_to_accuracy.py runs its quick mode",
    ".venv/bin/python bench/time_to_accuracy.py --peers 1,2,4 --trials 2 --target 0.95": "a benchmark of minutes with 4 peers, run on a 16-core machine; tests/integration/test_bench_time_to_accuracy.py runs its quick mode",
    ".venv/bin/python bench/strategy_overhead.py --accelerator cuda --hidden 4096 --depth 4 --batch-size 1024": "needs a CUDA GPU",
    ".venv/bin/python bench/strategy_overhead.py --short --variants loop sbloop peer1 --rounds 3": "a benchmark of about a minute and a half; its numbers vary with the machine",
    ".venv/bin/python -m pytest tests/integration/test_strategy_*.py tests/integration/test_swarm_training.py": "runs tests (make test runs these and every other)",
    "SPOTSWARM_TENSORBOARD_DIR=data/tensorboard spotswarm serve": "port 8000; tests/e2e/test_trainer_and_metrics.py starts an orchestrator with SPOTSWARM_TENSORBOARD_DIR",
    "spotswarm-worker --url http://10.0.0.5:8000 --join-token ssj_... # or SPOTSWARM_URL / SPOTSWARM_JOIN_TOKEN": "joins the example address 10.0.0.5; the worker tests start spotswarm-worker against their own orchestrators",
}

# `cd DIR` lines before a command: the docs-command test makes DIR (with these files) and runs what follows in it.
PROJECT_DIRS = {
    "cd my-project # mypkg/model.py holds TinyMLP and TeacherData; requirements.txt beside it": {
        "mypkg/__init__.py": "",
        "mypkg/model.py": "from lightning.pytorch import LightningDataModule, LightningModule\n\n\n"
        "class TinyMLP(LightningModule):\n    def __init__(self, hidden: int = 32) -> None:\n        super().__init__()\n\n\n"
        "class TeacherData(LightningDataModule):\n    def __init__(self, batch_size: int = 32) -> None:\n        super().__init__()\n",
        "requirements.txt": "# nothing beyond what the workers have\n",
    },
    "cd my-lm": {  # the language model example copied into a project, as the docs say
        "lm/__init__.py": "",
        "lm/model.py": (REPO_ROOT / "worker" / "examples" / "tinylm.py").read_text(),
        "lm/data/founding_documents.txt": (
            REPO_ROOT / "worker" / "examples" / "data" / "founding_documents.txt"
        ).read_text(),
    },
}
