# Sourced by the compare-* scripts: starts a fresh warren node on $WPORT (stopped and its data
# removed on exit) and the real RabbitMQ 3.10 on 5680 if it is not up; sets WPID and RPID, the
# two broker processes whose /proc figures the scripts read, and WSESSION, which says how warren
# was started (WARREN_SESSION=own, the default, or shared) for the scripts to print.
RMQ=../shared/rabbitmq/rabbitmq.sh
cargo build --release -p warren >/dev/null 2>&1
ss -ltn | grep -q ":5680 " || "$RMQ" start >/dev/null
DATA=$(mktemp -d)
# In a session of its own, as rabbitmq.sh starts RabbitMQ's nodes (`setsid`): the kernel's
# autogroup scheduling would otherwise share one CPU group between warren and PerfTest, which
# flatters warren (issue 37). WARREN_SESSION=shared measures that arrangement on purpose.
case "${WARREN_SESSION:-own}" in
  own) WSESSION="warren in a session of its own (setsid), as RabbitMQ"; SESSION=setsid ;;
  shared) WSESSION="warren in the load generator's session, RabbitMQ in its own: not like for like"; SESSION= ;;
  *) echo "WARREN_SESSION is own or shared, not '$WARREN_SESSION'" >&2; exit 2 ;;
esac
$SESSION "${WARREN_BIN:-./target/release/warren}" server --listen "127.0.0.1:$WPORT" --data-dir "$DATA" --management-listen none >"$DATA/log" 2>&1 &
WPID=$!
trap 'kill $WPID 2>/dev/null || true; rm -rf "$DATA"' EXIT
for _ in $(seq 50); do ss -ltn | grep -q ":$WPORT " && break; sleep 0.1; done
RPID=$(ss -ltnp | grep ":5680 " | sed -E 's/.*pid=([0-9]+).*/\1/' | head -1)
