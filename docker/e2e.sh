#!/usr/bin/env bash
# The compose cluster in real containers, end to end:
#   start (or reuse) a Docker engine, build the image (on python:3.11-slim when a
#   registry answers, else on a Debian base made here with debootstrap), bring up
#   the catalog and three nodes, wait for every health check, run the client
#   service (zero-copy on node 1's host), check the status page, stop everything
#   with SIGTERM and check each daemon exited cleanly, tear down; then the failover
#   cluster (compose-ha.yaml: PostgreSQL, two catalogs sharing a lease, three
#   nodes): put, kill the leading catalog, put again through the other.
# Exit 0: passed. Exit 1: failed. Exit 3: skipped (no engine can run here; the
# reason is printed). Bounded by E2E_TIMEOUT seconds (default 1500).
# Environment: DOCKER_HOST to use a running engine; E2E_WORK for the engine's and
# the base image's files (default /var/tmp/flightpart-e2e, kept for reuse).
set -uo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)
WORK=${E2E_WORK:-/var/tmp/flightpart-e2e}
PROJECT=fpe2e
BASE_IMAGE=flightpart-base:bookworm
DEADLINE=$(( $(date +%s) + ${E2E_TIMEOUT:-1500} ))
STARTED_ENGINE=""
mkdir -p "$WORK"

say() { echo "e2e: $*" >&2; }
skip() { say "SKIPPED: $*"; cleanup; exit 3; }
fail() { say "FAILED: $*"; [ -n "${COMPOSE:-}" ] && $COMPOSE logs --no-color --tail=40 >&2 2>/dev/null; cleanup; exit 1; }
left() { echo $(( DEADLINE - $(date +%s) )); }
bounded() { local t; t=$(left); [ "$t" -gt 0 ] || fail "out of time (E2E_TIMEOUT)"; timeout "$t" "$@"; }

cleanup() {
  if [ -n "${COMPOSE:-}" ]; then $COMPOSE down -v --remove-orphans >/dev/null 2>&1; fi
  if [ -n "$STARTED_ENGINE" ]; then
    kill "$STARTED_ENGINE" 2>/dev/null
    for _ in $(seq 50); do kill -0 "$STARTED_ENGINE" 2>/dev/null || break; sleep 0.2; done
    kill -9 "$STARTED_ENGINE" 2>/dev/null
  fi
}
trap 'fail "interrupted"' INT TERM
# Under vfs every image layer and every container is a copy of its image (a container's init layer and its own
# took 1.5 times the image between them here), so the failover cluster alone needs several GB. Say so before the engine says "no space left".
free_mb() { df -Pm "$WORK" | awk 'NR==2 {print $4}'; }
need_disk() {  # need_disk MB WHAT
  local free; free=$(free_mb)
  [ "$free" -ge "$1" ] || fail "$2 needs about $1 MB free under $WORK (vfs copies every layer and container), and $free MB are free"
}
image_mb() { docker image inspect "$1" --format '{{.Size}}' | awk '{printf "%d", $1/1e6 + 1}'; }
# images that lost their tag to a rebuild keep their layers (full copies under vfs): drop them after each build,
# on the engine this script started only (an engine it was given holds other people's images too)
prune_images() {
  [ -n "$STARTED_ENGINE" ] || return 0
  docker container prune -f >/dev/null 2>&1; docker image prune -f >/dev/null 2>&1
}

# ---------------------------------------------------------------- the engine
command -v docker >/dev/null 2>&1 || skip "no docker client (apt-get install docker.io)"
if [ -z "${DOCKER_HOST:-}" ] && ! docker info >/dev/null 2>&1; then
  command -v dockerd >/dev/null 2>&1 || skip "no Docker engine running and no dockerd to start"
  [ "$(id -u)" = 0 ] || skip "no Docker engine running, and starting dockerd needs root"
  export DOCKER_HOST="unix://$WORK/docker.sock"
  say "starting dockerd (vfs storage, no iptables, no default bridge) under $WORK"
  dockerd --storage-driver=vfs --iptables=false --bridge=none --data-root "$WORK/data-root" \
          --exec-root "$WORK/exec-root" --pidfile "$WORK/dockerd.pid" -H "$DOCKER_HOST" >"$WORK/dockerd.log" 2>&1 &
  STARTED_ENGINE=$!
  for _ in $(seq 150); do docker info >/dev/null 2>&1 && break; kill -0 "$STARTED_ENGINE" 2>/dev/null || break; sleep 0.2; done
  docker info >/dev/null 2>&1 || skip "dockerd did not start: $(tail -n 3 "$WORK/dockerd.log" | tr '\n' ' ')"
fi
if command -v docker-compose >/dev/null 2>&1; then COMPOSE_BIN="docker-compose"
elif docker compose version >/dev/null 2>&1; then COMPOSE_BIN="docker compose"
else skip "neither docker-compose nor docker compose is installed"; fi
COMPOSE="$COMPOSE_BIN -p $PROJECT -f $ROOT/docker/compose.yaml"
say "engine $(docker version --format '{{.Server.Version}}'), compose: $($COMPOSE_BIN version --short 2>/dev/null || $COMPOSE_BIN version | head -n 1)"

# ---------------------------------------------------------------- the image
BASE=python:3.11-slim
if ! docker image inspect "$BASE" >/dev/null 2>&1 && ! bounded docker pull -q "$BASE" >/dev/null 2>&1; then
  BASE=$BASE_IMAGE
  if ! docker image inspect "$BASE" >/dev/null 2>&1; then
    command -v debootstrap >/dev/null 2>&1 || skip "no registry image and no debootstrap to make a base (apt-get install debootstrap)"
    say "no registry image: making $BASE with debootstrap"
    rm -rf "$WORK/rootfs"
    bounded debootstrap --variant=minbase --include=python3,python3-venv,ca-certificates bookworm "$WORK/rootfs" \
      >"$WORK/debootstrap.log" 2>&1 || skip "debootstrap failed: $(tail -n 2 "$WORK/debootstrap.log" | tr '\n' ' ')"
    tar -C "$WORK/rootfs" -c . | docker import - "$BASE" >/dev/null || fail "docker import of the base failed"
    rm -rf "$WORK/rootfs"
  fi
fi
BUILD_ARGS=(--build-arg "BASE=$BASE")
if ls /usr/local/share/ca-certificates/*.crt >/dev/null 2>&1; then
  # this machine trusts CAs of its own (a TLS-inspecting proxy): so must the build, or pip cannot reach the registry
  ctx="$WORK/ca-context"; rm -rf "$ctx"; mkdir -p "$ctx"; cp /usr/local/share/ca-certificates/*.crt "$ctx/"
  printf 'FROM %s\nUSER root\nCOPY *.crt /usr/local/share/ca-certificates/\nRUN update-ca-certificates >/dev/null\n' "$BASE" >"$ctx/Dockerfile"
  bounded docker build -q --network host -t flightpart-base:trusted "$ctx" >/dev/null || fail "adding this machine's CAs to $BASE failed"
  BUILD_ARGS=(--build-arg "BASE=flightpart-base:trusted" --build-arg "PIP_CERT=/etc/ssl/certs/ca-certificates.crt")
  say "the base trusts this machine's CAs: $(ls /usr/local/share/ca-certificates/*.crt | xargs -n1 basename | tr '\n' ' ')"
fi
prune_images
need_disk 3000 "building the image"
say "building flightpart:latest on $BASE"
bounded docker build --network host "${BUILD_ARGS[@]}" -t flightpart:latest -f docker/Dockerfile . \
  >"$WORK/build.log" 2>&1 || fail "docker build: $(tail -n 15 "$WORK/build.log")"
prune_images
docker run --rm --entrypoint python3 flightpart:latest -c \
  'import importlib.util as u, sys; bad=[m for m in ("pandas","polars","dask","ray") if u.find_spec(m)]; sys.exit(bool(bad) and print("image carries", bad))' \
  || fail "the daemon image carries frame libraries it never imports"
[ "$(docker run --rm --entrypoint id flightpart:latest -u)" != 0 ] || fail "the image runs as root"
say "image: $(docker image inspect flightpart:latest --format '{{.Size}}' | awk '{printf "%.0f MB", $1/1e6}')"

# ---------------------------------------------------------------- the cluster
export CATALOG_PORT=${CATALOG_PORT:-18815} STATUS_PORT=${STATUS_PORT:-18818}
$COMPOSE down -v --remove-orphans >/dev/null 2>&1
need_disk $(( 3 * 5 * $(image_mb flightpart:latest) / 2 + 500 )) "the cluster (four daemons and a client)"
bounded $COMPOSE up -d --no-build catalog node1 node2 node3 >"$WORK/up.log" 2>&1 || fail "compose up: $(tail -n 20 "$WORK/up.log")"
wait_healthy() {
  local svc cid state
  for svc in "$@"; do
    cid=$($COMPOSE ps -q "$svc")
    for _ in $(seq 120); do
      state=$(docker inspect -f '{{.State.Health.Status}}' "$cid" 2>/dev/null)
      [ "$state" = healthy ] && break
      [ "$(left)" -gt 0 ] || fail "out of time waiting for $svc"
      sleep 1
    done
    [ "$state" = healthy ] || fail "$svc is $state: $(docker inspect -f '{{json .State.Health.Log}}' "$cid" | tail -c 600)"
    say "$svc healthy"
  done
}
stop_cleanly() {
  local ids cid code
  ids=$($COMPOSE ps -q "$@")
  bounded $COMPOSE stop -t 20 >/dev/null 2>&1 || fail "compose stop"
  for cid in $ids; do
    code=$(docker inspect -f '{{.State.ExitCode}} {{.Name}}' "$cid")
    [ "${code%% *}" = 0 ] || fail "container ${code#* } exited with ${code%% *} on SIGTERM (137: it had to be killed)"
  done
}
wait_healthy catalog node1 node2 node3

out=$(bounded $COMPOSE run --rm --no-deps client 2>&1) || fail "client: $out"
echo "$out" >&2
echo "$out" | grep -q '^3 live nodes' || fail "the client did not see 3 live nodes"
[ "$(echo "$out" | grep -c '^partition .*zero-copy')" = 1 ] || fail "exactly node 1's partition should be read zero-copy"
[ "$(echo "$out" | grep -c '^partition .*streamed')" = 2 ] || fail "the other two partitions should be streamed"
echo "$out" | grep -q 'read equals what was put: True' || fail "the data read differs from what was put"

page=$(python3 -c "import urllib.request,sys; sys.stdout.write(urllib.request.urlopen('http://127.0.0.1:$STATUS_PORT/status.json', timeout=5).read().decode())" 2>&1) \
  || fail "the catalog's status page is not published on 127.0.0.1:$STATUS_PORT"
echo "$page" | python3 -c 'import json,sys; s=json.load(sys.stdin); assert sum(n["health"]=="SERVING" for n in s["nodes"])==3, s["nodes"]; assert [d["name"] for d in s["datasets"]]==["example"], s["datasets"]' \
  || fail "the status page does not show 3 serving nodes and the example dataset"
say "status page published on 127.0.0.1:$STATUS_PORT: 3 nodes SERVING, dataset example"
beats=$(python3 -c "import urllib.request,sys; sys.stdout.write(urllib.request.urlopen('http://127.0.0.1:$STATUS_PORT/metrics', timeout=5).read().decode())" 2>&1 \
  | sed -n 's/^flightpart_udp_heartbeats_taken_total{role="catalog"} \([0-9.e+]*\)$/\1/p')
python3 -c "import sys; sys.exit(0 if float(sys.argv[1] or 0) > 0 else 1)" "$beats" \
  || fail "the catalog took no heartbeat in a datagram (metrics: '$beats')"
say "heartbeats reach the catalog in datagrams ($beats taken)"

# ---------------------------------------------------------------- SIGTERM
stop_cleanly catalog node1 node2 node3
say "every daemon stopped cleanly on SIGTERM"
$COMPOSE down -v --remove-orphans >/dev/null 2>&1

# ---------------------------------------------------------------- catalogs that fail over (compose-ha.yaml)
say "building flightpart-postgres:latest on $BASE"
bounded docker build --network host "${BUILD_ARGS[@]}" -t flightpart-postgres:latest -f docker/Dockerfile.postgres . \
  >"$WORK/build-pg.log" 2>&1 || fail "docker build of PostgreSQL: $(tail -n 15 "$WORK/build-pg.log")"
prune_images
COMPOSE="$COMPOSE_BIN -p ${PROJECT}ha -f $ROOT/docker/compose-ha.yaml"
$COMPOSE down -v --remove-orphans >/dev/null 2>&1
need_disk $(( 3 * (6 * $(image_mb flightpart:latest) + $(image_mb flightpart-postgres:latest)) / 2 + 500 )) \
  "the failover cluster (PostgreSQL, five daemons and a client)"
bounded $COMPOSE up -d --no-build postgres catalog-a catalog-b node1 node2 node3 >"$WORK/up-ha.log" 2>&1 \
  || fail "compose up (failover): $(tail -n 20 "$WORK/up-ha.log")"
wait_healthy postgres catalog-a catalog-b node1 node2 node3
out=$(bounded $COMPOSE run --rm --no-deps client put 2>&1) || fail "client put: $out"
echo "$out" >&2
leader=$(echo "$out" | sed -n 's|^leader grpc://\([a-z-]*\):8815$|\1|p')
case "$leader" in catalog-a|catalog-b) ;; *) fail "the client did not name a leading catalog" ;; esac
docker kill "$($COMPOSE ps -q "$leader")" >/dev/null || fail "docker kill $leader"
say "killed the leading catalog ($leader)"
out=$(bounded $COMPOSE run --rm --no-deps client after 2>&1) || fail "client after the kill: $out"
echo "$out" >&2
echo "$out" | grep -q '^leader grpc://catalog-[ab]:8815$' || fail "no catalog leads after the kill"
echo "$out" | grep -q "^leader grpc://$leader:8815$" && fail "the killed catalog is still named leader"
echo "$out" | grep -q '^versions \[1, 2\]$' || fail "the versions are not [1, 2] after the failover"
echo "$out" | grep -q 'read equals what was put: True' || fail "the data read after the failover differs from what was put"
say "failover: the standby took over from $leader and the next put was accepted"
survivors=$(for s in postgres catalog-a catalog-b node1 node2 node3; do [ "$s" = "$leader" ] || echo "$s"; done)
# shellcheck disable=SC2086
stop_cleanly $survivors
say "every daemon of the failover cluster stopped cleanly on SIGTERM"
cleanup
say "PASSED"
