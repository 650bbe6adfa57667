#!/bin/sh
# Container entrypoint of a worker: the agent reads SPOTSWARM_URL, SPOTSWARM_JOIN_TOKEN and
# SPOTSWARM_REQUEST_ID (set by a launcher) from the environment; arguments are passed on as flags.
set -eu
if [ -z "${SPOTSWARM_URL:-}" ] || [ -z "${SPOTSWARM_JOIN_TOKEN:-}" ]; then
  echo "spotswarm worker: set SPOTSWARM_URL and SPOTSWARM_JOIN_TOKEN (a run's join token)" >&2
  exit 3  # permanent configuration error (worker/agent/config.py: EXIT_CONFIG)
fi
mkdir -p "${SPOTSWARM_WORKER_DIR:-$HOME/work}"
exec spotswarm-worker "$@"
