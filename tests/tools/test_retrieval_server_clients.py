"""`verl-npu retrieval-server` under bad clients (issue 36): a client that hangs up mid-body used to
kill it (SIGPIPE, exit 141, nothing logged) and 50 concurrent clients got connection resets. The server
here is the real command in its own process; every client is local (127.0.0.1) and time-bounded."""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

from verl_npu.tools.retrieval_server import RetrievalServer

ROOT = Path(__file__).resolve().parents[2]
DOCS = [{"id": str(i), "contents": f"Title {i}\nthe city number {i} has river {i % 7}"} for i in range(40)]


def start_cli(tmp_path: Path):
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text("".join(json.dumps(d) + "\n" for d in DOCS))
    proc = subprocess.Popen(
        [sys.executable, "-m", "verl_npu.cli", "retrieval-server", "--corpus", str(corpus), "--port", "0"],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    line = proc.stdout.readline()
    assert "retrieval_service_url" in line, (line, proc.stderr.read() if proc.poll() is not None else "")
    port = int(line.rsplit(":", 1)[1].split("/")[0])
    return proc, port


def retrieve(port: int, query: str) -> tuple[int, dict]:
    req = urllib.request.Request(
        f"http://127.0.0.1:{port}/retrieve",
        method="POST",
        data=json.dumps({"queries": [query], "topk": 2}).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(req, timeout=30) as r:
        return r.status, json.loads(r.read())


def hang_up_mid_body(port: int) -> None:
    with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
        s.sendall(
            b"POST /retrieve HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b'Content-Length: 5000\r\n\r\n{"queries": ["ci'
        )
        s.shutdown(socket.SHUT_WR)
        time.sleep(0.1)
    # and one that hangs up before its answer is written, leaving the server a write to a closed socket
    with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")  # RST on close
        body = json.dumps({"queries": ["city river"] * 2000}).encode()
        s.sendall(b"POST /retrieve HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n" % len(body) + body)


def test_the_command_survives_hang_ups_and_50_concurrent_clients_then_stops_on_sigterm(tmp_path):
    proc, port = start_cli(tmp_path)
    try:
        hang_up_mid_body(port)
        time.sleep(0.5)
        assert proc.poll() is None, f"the server died with exit status {proc.returncode}"
        results, errors = [], []

        def client(i):
            try:
                results.append(retrieve(port, f"city number {i}"))
            except Exception as err:  # noqa: BLE001 - counted below
                errors.append(repr(err))

        threads = [threading.Thread(target=client, args=(i,)) for i in range(50)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert errors == [] and len(results) == 50
        assert all(status == 200 and body["result"][0] for status, body in results)
        hang_up_mid_body(port)
        assert retrieve(port, "river")[0] == 200 and proc.poll() is None
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=20)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0
    assert "the client hung up mid-body (" in err and "stopped (SIGTERM)" in err


def test_stalling_and_oversized_clients_are_refused_and_logged(capfd):
    srv = RetrievalServer(DOCS, port=0, client_timeout=1.0)
    srv.start_in_thread()
    try:
        with socket.create_connection(("127.0.0.1", srv.port), timeout=10) as s:  # headers, then silence
            s.sendall(b"POST /retrieve HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n")
            t0 = time.monotonic()
            assert s.recv(100) == b""  # dropped at the client timeout
            assert time.monotonic() - t0 < 8
        with socket.create_connection(("127.0.0.1", srv.port), timeout=10) as s:
            s.sendall(b"POST /retrieve HTTP/1.1\r\nHost: x\r\nContent-Length: 999999999\r\n\r\n")
            assert s.recv(100).startswith(b"HTTP/1.0 413")
        assert retrieve(srv.port, "city")[0] == 200
    finally:
        srv.shutdown()
        srv.server_close()
    err = capfd.readouterr().err
    assert "no body within 1 s" in err and "413 the body is 999999999 bytes" in err
