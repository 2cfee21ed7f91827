#!/usr/bin/env bash
# Schemathesis against the server's own OpenAPI document: `herald serve`
# embedded (SQLite in a temporary directory, the in-process queue, a free
# loopback port), checked for server errors, response schema conformance
# and status code conformance. Bounded: a few examples per operation.
# Exits non-zero on any finding.
#
#   crates/herald-server/tests/schemathesis.sh [path/to/herald]
#
# Schemathesis is installed with pip into a venv, cached in
# $HERALD_SCHEMATHESIS_VENV (default ~/.cache/herald-schemathesis).
set -euo pipefail
cd "$(dirname "$0")/../../.."

venv=${HERALD_SCHEMATHESIS_VENV:-$HOME/.cache/herald-schemathesis}
if [ ! -x "$venv/bin/st" ]; then
  echo "schemathesis.sh: installing schemathesis into $venv"
  python3 -m venv "$venv"
  "$venv/bin/pip" install --quiet 'schemathesis>=4,<5'
fi

herald=${1:-}
if [ -z "$herald" ]; then
  cargo build --quiet -p herald-server --bin herald
  herald="${CARGO_TARGET_DIR:-target}/debug/herald"
fi

work=$(mktemp -d -t herald-schemathesis.XXXXXX)
server=
cleanup() {
  if [ -n "$server" ]; then
    kill "$server" 2>/dev/null || true
    wait "$server" 2>/dev/null || true
  fi
  rm -rf "$work"
}
trap cleanup EXIT

# A configuration of its own (no ./herald.toml is read), one handler so that
# emits are accepted.
cat >"$work/herald.toml" <<'TOML'
[handlers.send_email]
kind = "command"
program = "/bin/true"
TOML
HERALD_LOG=${HERALD_LOG:-warn} "$herald" serve --config "$work/herald.toml" \
  --store "sqlite://$work/herald.db" --queue memory --listen 127.0.0.1:0 \
  >"$work/stdout" 2>"$work/stderr" &
server=$!
url=
for _ in $(seq 1 100); do
  url=$(sed -n 's|.*listening on \(http://127\.0\.0\.1:[0-9]*\).*|\1|p' "$work/stdout" | head -n1)
  [ -n "$url" ] && break
  kill -0 "$server" 2>/dev/null || { cat "$work/stderr" >&2; echo "schemathesis.sh: herald serve did not start" >&2; exit 1; }
  sleep 0.1
done
[ -n "$url" ] || { echo "schemathesis.sh: herald serve printed no address" >&2; exit 1; }
echo "schemathesis.sh: herald serve (pid $server) on $url"

status=0
"$venv/bin/st" run "$url/openapi.json" \
  --checks not_a_server_error,response_schema_conformance,status_code_conformance \
  --phases examples,coverage,fuzzing \
  --max-examples "${HERALD_SCHEMATHESIS_EXAMPLES:-20}" \
  --max-time 80 \
  --workers 1 \
  --seed 1 \
  --suppress-health-check all \
  --request-timeout 10 \
  --continue-on-failure \
  --warnings off \
  || status=$?
if grep -q "panicked" "$work/stderr"; then
  echo "schemathesis.sh: the server panicked:" >&2
  grep -A5 "panicked" "$work/stderr" >&2
  status=1
fi
exit "$status"
