#!/bin/sh
# Container entrypoint of the orchestrator: settings come from SPOTSWARM_* variables (see
# orchestrator/config.py); arguments are passed on as `spotswarm serve` flags.
set -eu
if [ -n "${SPOTSWARM_DATABASE_URL:-}" ]; then
  echo "spotswarm orchestrator: database from SPOTSWARM_DATABASE_URL" >&2
else
  echo "spotswarm orchestrator: SQLite in ${SPOTSWARM_DATA_DIR:-data}" >&2
fi
exec spotswarm serve "$@"
