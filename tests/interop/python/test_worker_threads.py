"""How many threads run the client connections (issue 37): `--worker-threads`,
WARREN_WORKER_THREADS or `worker_threads` in the TOML file, by default half the cores and at
least one, since the WAL writer and the queue groups' loop need the others. Counted in
/proc/PID/task, where tokio names its workers; a node with one worker still serves a
publisher and a consumer at once. warren's command line: no RabbitMQ counterpart."""

import os
import shutil
import subprocess

import pika
import pytest

from conftest import BROKER_START_TIMEOUT_S, free_port, wait_port
from helpers import get

# tokio names its runtime's threads so (the kernel keeps 15 characters of a name).
TOKIO_THREAD_NAMES = ("tokio-runtime-w", "tokio-rt-worker")


def runtime_threads(pid):
    names = []
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/comm") as f:
                names.append(f.read().strip())
        except OSError:
            pass
    return sum(1 for n in names if n in TOKIO_THREAD_NAMES)


def start(broker, tmp_path, extra_args=(), env_extra=None, prefix=()):
    port = free_port()
    args = [*prefix, broker.bin_path, "server", "--data-dir", str(tmp_path / "data"),
            "--listen", f"127.0.0.1:{port}", "--management-listen", "none", *extra_args]
    env = dict(os.environ)
    env.pop("WARREN_WORKER_THREADS", None)
    env.update(env_extra or {})
    log = open(tmp_path / "warren.log", "ab")
    proc = subprocess.Popen(args, env=env, stdout=log, stderr=subprocess.STDOUT,
                            stdin=subprocess.DEVNULL)
    wait_port("127.0.0.1", port, BROKER_START_TIMEOUT_S, proc)
    return proc, port


def publish_and_consume(port, name):
    conn = pika.BlockingConnection(pika.URLParameters(f"amqp://guest:guest@127.0.0.1:{port}/%2F"))
    try:
        ch = conn.channel()
        ch.queue_declare(name, exclusive=True)
        ch.basic_publish("", name, b"through one worker")
        assert get(ch, name)[2] == b"through one worker"
    finally:
        conn.close()


@pytest.fixture
def warren_only(broker):
    if broker.is_rabbitmq:
        pytest.skip("warren's command line")
    return broker


@pytest.mark.parametrize("how,threads", [("flag", 1), ("env", 3), ("toml", 2)])
def test_worker_threads_sets_how_many_threads_run_the_connections(warren_only, tmp_path,
                                                                   name, how, threads):
    args, env = [], {}
    if how == "flag":
        args = ["--worker-threads", str(threads)]
    elif how == "env":
        env = {"WARREN_WORKER_THREADS": str(threads)}
    else:
        config = tmp_path / "warren.toml"
        config.write_text(f"worker_threads = {threads}\n")
        args = ["--config", str(config)]
    proc, port = start(warren_only, tmp_path, args, env)
    try:
        publish_and_consume(port, name)
        assert runtime_threads(proc.pid) == threads
    finally:
        proc.kill()
        proc.wait()


def test_worker_threads_default_to_half_the_cores(warren_only, tmp_path, name):
    if shutil.which("taskset") is None or len(os.sched_getaffinity(0)) < 2:
        pytest.skip("needs taskset and two cores")
    cores = sorted(os.sched_getaffinity(0))[:2]
    proc, port = start(warren_only, tmp_path,
                       prefix=("taskset", "-c", ",".join(map(str, cores))))
    try:
        publish_and_consume(port, name)
        assert runtime_threads(proc.pid) == 1
    finally:
        proc.kill()
        proc.wait()


@pytest.mark.parametrize("threads", ["0", "257"])
def test_worker_threads_out_of_range_is_refused_at_start(warren_only, tmp_path, threads):
    out = subprocess.run([warren_only.bin_path, "server", "--data-dir", str(tmp_path / "data"),
                          "--listen", f"127.0.0.1:{free_port()}", "--management-listen", "none",
                          "--worker-threads", threads],
                         capture_output=True, text=True, timeout=BROKER_START_TIMEOUT_S)
    assert out.returncode == 2
    assert f"worker threads must be between 1 and 256, got {threads}" in out.stderr
