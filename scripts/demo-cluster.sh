#!/usr/bin/env bash
# The cluster part of `make demo`: a topic spread over two broker groups keeps taking
# writes while one master is killed (kill -9), and two members of one consumer group share
# its queues. Everything runs through the `understudy` commands a user would type:
#   local up --groups 2 · topic create --groups g1,g2 · produce --rate (in the background)
#   · local kill g1-0 · consume -g demo (two processes) · consumer-group describe · local down
# The cluster is stopped by PID whatever happens. Knob: DEMO_DIR (.understudy/demo).
set -uo pipefail
cd "$(dirname "$0")/.."
U=.venv/bin/understudy
PY=.venv/bin/python
DIR="${DEMO_DIR:-.understudy/demo}/cluster"
COUNT=12000
RATE=2000

if [ -f "$DIR/cluster.json" ]; then "$U" local down --dir "$DIR" >/dev/null 2>&1; fi
rm -rf "$DIR"
mkdir -p "$(dirname "$DIR")"
"$U" local up --dir "$DIR" --groups 2 --slaves 1 || exit 1
trap '"$U" local down --dir "$DIR" >/dev/null' EXIT

BOOT=$("$PY" -c 'import json, sys
d = json.load(open(sys.argv[1]))
print(",".join("%s:%d" % (b["host"], b["port"]) for g in d["groups"] for b in g["brokers"]))' "$DIR/cluster.json")

echo
echo "== understudy topic create -t orders --groups g1,g2 --queues-per-group 2"
"$U" topic create -b "$BOOT" -t orders --groups g1,g2 --queues-per-group 2 || exit 1

echo
echo "== understudy produce -t orders --count $COUNT --rate $RATE (background), then kill -9 of g1's master"
"$U" produce -b "$BOOT" -t orders --count "$COUNT" --rate "$RATE" --size 128 --json \
    > "$DIR/produce.json" 2> "$DIR/produce.log" &
producer=$!
sleep 2
"$U" local kill --dir "$DIR" g1-0 && echo "killed g1-0 (kill -9): g1's queues have no writer; g1-1 takes READ"
wait "$producer"
"$PY" - "$DIR/produce.json" <<'EOF'
import json
import sys

s = json.loads(open(sys.argv[1]).read().strip().splitlines()[-1])
print(f"produce: {s['acked']} acknowledged, {s['failed']} never acknowledged, "
      f"longest write stall {s['max_ack_gap_ms']:.1f} ms, ack p99 {s['ack_p99_ms']:.1f} ms")
EOF

echo
echo "== two members of consumer group 'demo' share the queues (g1's are read from its acting slave)"
for m in a b; do
    "$U" consume -b "$BOOT" -t orders -g demo --member-id "demo-$m" --count "$COUNT" \
        --idle-timeout 5 --session-timeout-ms 3000 --json > "$DIR/consume-$m.json" 2> "$DIR/consume-$m.log" &
done
sleep 3
"$U" consumer-group describe -b "$BOOT" -g demo
wait
"$PY" - "$DIR/produce.json" "$DIR/consume-a.json" "$DIR/consume-b.json" <<'EOF'
import json
import sys

def last(path):
    return json.loads(open(path).read().strip().splitlines()[-1])

p, a, b = (last(x) for x in sys.argv[1:])
print(f"consumed: demo-a {a['consumed']}, demo-b {b['consumed']}: together "
      f"{a['consumed'] + b['consumed']} deliveries of {p['acked']} acknowledged sends (a batch "
      "in flight at the kill is re-sent to g2 and may be stored twice: at least once)")
EOF
echo
echo "== understudy local start g1-0 (back-sync, then the master writes and reads again)"
"$U" local start --dir "$DIR" g1-0 >/dev/null
for _ in $(seq 60); do
    mode=$("$U" local status --dir "$DIR" --json | "$PY" -c 'import json, sys
print(next(g["mode"] for g in json.load(sys.stdin)["groups"] if g["name"] == "g1"))')
    [ "$mode" = NORMAL ] && break
    sleep 0.5
done
echo "g1 is $mode"
"$U" topic describe -b "$BOOT" -t orders
