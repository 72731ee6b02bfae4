"""A local retrieval server for the search tool: BM25 over a jsonl corpus, speaking Search-R1's protocol.

    verl-npu retrieval-server --corpus data/tiny_search_r1/corpus.jsonl [--port 8000] [--host 127.0.0.1] [--topk 3]
    python -m verl_npu.tools.retrieval_server --corpus ...          # the same

The corpus is Search-R1's format: one JSON object a line, `{"id": "...", "contents": "<title>\\n<text>"}`
(the search tool shows the first line of `contents` as the document's title). The server answers

    POST /retrieve  {"queries": ["...", ...], "topk": 3, "return_scores": true}
    -> 200 {"result": [[{"document": {"id", "contents"}, "score": <BM25>}, ...], ...]}   (one list per query)

(`topk` missing or null: `--topk`; `return_scores` false: each list holds the documents alone), and
`GET /health` -> `{"status": "ok", "documents": N}`. A request that is not the contract's (not JSON, no
`queries` list of strings, a `topk` that is not a positive integer, an unknown field) gets 400 with
`{"error": "<what is wrong>"}`; another path 404. Documents are ranked by Okapi BM25 (k1 0.9, b 0.4:
Lucene's / pyserini's defaults, which Search-R1's BM25 server uses) over lower-cased words; documents
that share no word with the query are not returned; ties keep corpus order. Pure Python and the standard
library (`http.server`, one thread per connection): for corpora of thousands of documents, the demos and
tests; for Wikipedia-sized corpora use Search-R1's own servers, which speak the same protocol.

Robust to its clients: a body over MAX_BODY bytes gets 413; a client silent for `client_timeout` seconds
(10) is dropped; a client that hangs up (mid-body, or before its answer) costs only its connection
(SIGPIPE is ignored, even when `verl-npu` restored its default for piping); at most MAX_CONNECTIONS are
served at once and further ones wait in a listen queue of LISTEN_BACKLOG, those still waiting after
SLOT_WAIT_S are closed. Each refusal is one line on stderr. The server stops on SIGINT or SIGTERM (exit
0), or on a fatal error it names (exit 1).
"""

from __future__ import annotations

import argparse
import json
import math
import re
import signal
import sys
import threading
from collections import Counter, defaultdict
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

WORD = re.compile(r"\w+", re.UNICODE)
K1, B = 0.9, 0.4
REQUEST_FIELDS = ("queries", "topk", "return_scores")
MAX_BODY = 10 * 1024 * 1024
MAX_CONNECTIONS = 64  # connections served at once (one thread each)
LISTEN_BACKLOG = 256  # connections the kernel queues before accept
SLOT_WAIT_S = 10.0  # how long an accepted connection waits for a free slot before it is closed
CLIENT_TIMEOUT_S = 10.0


class CorpusError(ValueError):
    """A corpus file that cannot be read, naming the file and line."""


def words(text: str) -> list[str]:
    return WORD.findall(text.lower())


def read_corpus(path: str | Path) -> list[dict]:
    """The documents of a jsonl corpus ({"id", "contents"} per line; blank lines skipped)."""
    path = Path(path).expanduser()
    if not path.is_file():
        raise CorpusError(
            f"corpus file {str(path)!r} does not exist; write one with "
            "`python data_prep/search_r1.py --synthetic 64` or point --corpus at your jsonl file"
        )
    docs = []
    with path.open(encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                doc = json.loads(line)
            except json.JSONDecodeError as err:
                raise CorpusError(f"{path} line {n}: not JSON ({err.msg})") from None
            if not isinstance(doc, dict) or not isinstance(doc.get("contents"), str):
                raise CorpusError(f'{path} line {n}: each line must be {{"id": ..., "contents": "<title>\\n<text>"}}')
            docs.append({"id": str(doc.get("id", len(docs))), "contents": doc["contents"]})
    if not docs:
        raise CorpusError(f"{path} holds no documents")
    return docs


class BM25:
    """Okapi BM25 over `documents` (dicts with "contents")."""

    def __init__(self, documents: list[dict], k1: float = K1, b: float = B):
        self.documents, self.k1, self.b = documents, k1, b
        self.lengths = []
        self.postings: dict[str, list[tuple[int, int]]] = defaultdict(list)  # word -> [(doc, count)]
        for i, doc in enumerate(documents):
            counts = Counter(words(doc["contents"]))
            self.lengths.append(sum(counts.values()))
            for word, count in counts.items():
                self.postings[word].append((i, count))
        self.avg_length = sum(self.lengths) / len(self.lengths) if self.lengths else 0.0
        n = len(documents)
        # Lucene's idf: never negative, so a word in most documents still counts a little
        self.idf = {w: math.log(1 + (n - len(p) + 0.5) / (len(p) + 0.5)) for w, p in self.postings.items()}

    def search(self, query: str, topk: int) -> list[tuple[int, float]]:
        """(document index, score) of the best `topk` documents, best first."""
        scores: dict[int, float] = defaultdict(float)
        for word in set(words(query)):
            idf = self.idf.get(word)
            if idf is None:
                continue
            for i, count in self.postings[word]:
                norm = self.k1 * (1 - self.b + self.b * self.lengths[i] / (self.avg_length or 1.0))
                scores[i] += idf * count * (self.k1 + 1) / (count + norm)
        ranked = sorted(scores.items(), key=lambda item: (-item[1], item[0]))
        return ranked[:topk]


class BadRequest(ValueError):
    """A request that is not the protocol's (answered 400 with its message)."""


def parse_request(body: bytes, default_topk: int) -> tuple[list[str], int, bool]:
    """(queries, topk, return_scores) of a /retrieve body. Raises BadRequest naming what is wrong."""
    try:
        data = json.loads(body or b"null")
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise BadRequest(
            f'the body is not JSON ({err}); send {{"queries": [...], "topk": 3, "return_scores": true}}'
        ) from None
    if not isinstance(data, dict):
        raise BadRequest('the body must be a JSON object {"queries": [...], "topk": 3, "return_scores": true}')
    unknown = sorted(set(data) - set(REQUEST_FIELDS))
    if unknown:
        raise BadRequest(f"unknown field(s) {unknown}; the fields are {', '.join(REQUEST_FIELDS)}")
    queries = data.get("queries")
    if not isinstance(queries, list) or not all(isinstance(q, str) for q in queries):
        raise BadRequest("'queries' must be a list of strings")
    topk = data.get("topk")
    topk = default_topk if topk is None else topk
    if isinstance(topk, bool) or not isinstance(topk, int) or topk < 1:
        raise BadRequest(f"'topk' must be a positive integer, got {topk!r}")
    scores = data.get("return_scores", False)
    if not isinstance(scores, bool):
        raise BadRequest(f"'return_scores' must be true or false, got {scores!r}")
    return queries, topk, scores


def note(text: str) -> None:
    """One line on stderr (what the server refused or dropped, and why)."""
    try:
        sys.stderr.write(f"[retrieval-server] {text}\n")
        sys.stderr.flush()
    except (OSError, ValueError):  # stderr itself gone: nothing left to tell
        pass


class RetrievalServer(ThreadingHTTPServer):
    """The HTTP server over one BM25 index (`serve_forever` / `shutdown`; `port` once bound);
    `client_timeout`: seconds a client may stay silent (module docstring)."""

    daemon_threads = True
    block_on_close = False  # stopping does not wait for a stalled client
    request_queue_size = LISTEN_BACKLOG

    def __init__(
        self,
        documents: list[dict],
        host: str = "127.0.0.1",
        port: int = 8000,
        topk: int = 3,
        quiet: bool = True,
        client_timeout: float = CLIENT_TIMEOUT_S,
    ):
        self.index, self.topk, self.quiet, self.client_timeout = BM25(documents), topk, quiet, client_timeout
        self.slots = threading.BoundedSemaphore(MAX_CONNECTIONS)
        super().__init__((host, port), _Handler)

    def process_request(self, request, client_address) -> None:
        # bounded threads: a flood waits for a slot (or is closed) instead of starting a thread each
        if not self.slots.acquire(timeout=SLOT_WAIT_S):
            note(f"refused {client_address[0]}: {MAX_CONNECTIONS} connections busy for {SLOT_WAIT_S:g} s")
            self.shutdown_request(request)
            return
        try:
            super().process_request(request, client_address)
        except BaseException:
            self.slots.release()
            raise

    def process_request_thread(self, request, client_address) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self.slots.release()

    def handle_error(self, request, client_address) -> None:
        err = sys.exc_info()[1]
        note(f"connection from {client_address[0]} ended: {type(err).__name__}: {err}")

    @property
    def port(self) -> int:
        return self.server_address[1]

    def answer(self, queries: list[str], topk: int, scores: bool) -> dict:
        result = []
        for query in queries:
            hits = self.index.search(query, topk)
            docs = [self.index.documents[i] for i, _ in hits]
            result.append([{"document": d, "score": s} for d, (_, s) in zip(docs, hits)] if scores else docs)
        return {"result": result}

    def start_in_thread(self) -> threading.Thread:
        """Serve from a daemon thread (tests, and embedding the server in another program)."""
        thread = threading.Thread(target=self.serve_forever, daemon=True, name="retrieval-server")
        thread.start()
        return thread


class _Handler(BaseHTTPRequestHandler):
    server: RetrievalServer

    def setup(self) -> None:
        self.timeout = self.server.client_timeout  # StreamRequestHandler applies it to the socket
        super().setup()

    def _send(self, status: int, payload: dict) -> None:
        if status >= 400:
            note(
                f"refused {self.address_string()} {self.command} {self.path[:200]!r}: {status} "
                f"{str(payload.get('error'))[:300]}"
            )
        body = json.dumps(payload, ensure_ascii=False).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        if self.path.rstrip("/") == "/health":
            self._send(200, {"status": "ok", "documents": len(self.server.index.documents)})
        else:
            self._send(404, {"error": f"no such path {self.path!r}; POST /retrieve or GET /health"})

    def do_POST(self) -> None:  # noqa: N802
        if self.path.rstrip("/") != "/retrieve":
            self._send(404, {"error": f"no such path {self.path!r}; POST /retrieve"})
            return
        try:
            length = int(self.headers.get("Content-Length") or 0)
        except ValueError:
            length = -1
        if length < 0:
            self._send(400, {"error": "Content-Length must be a number of bytes"})
            return
        if length > MAX_BODY:
            self.close_connection = True  # the body is not read
            self._send(413, {"error": f"the body is {length} bytes; at most {MAX_BODY}"})
            return
        try:
            body = self.rfile.read(length)
        except TimeoutError:  # the socket's timeout (socket.timeout is TimeoutError since 3.10)
            note(f"dropped {self.address_string()}: no body within {self.server.client_timeout:g} s")
            self.close_connection = True
            return
        if len(body) < length:
            note(f"dropped {self.address_string()}: the client hung up mid-body ({len(body)} of {length} bytes)")
            self.close_connection = True
            return
        try:
            queries, topk, scores = parse_request(body, self.server.topk)
        except BadRequest as err:
            self._send(400, {"error": str(err)})
            return
        self._send(200, self.server.answer(queries, topk, scores))

    def log_message(self, fmt: str, *args) -> None:
        if not self.server.quiet:
            note(f"{self.address_string()} {fmt % args}")

    def log_error(self, fmt: str, *args) -> None:  # timeouts, malformed request lines: always told
        note(f"refused {self.address_string()}: {fmt % args}")


def build_parser(prog: str = "verl-npu retrieval-server") -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog=prog,
        description="Serve BM25 search over a jsonl corpus with Search-R1's "
        "retrieval protocol (POST /retrieve), for the search tool (docs/agents.md).",
    )
    add_arguments(p)
    return p


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--corpus", required=True, help='jsonl file, one {"id", "contents"} object a line')
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1: this machine only)")
    p.add_argument("--port", type=int, default=8000, help="port (default 8000, the search tool config's; 0: any free)")
    p.add_argument("--topk", type=int, default=3, help="documents per query when a request gives no topk (default 3)")
    p.add_argument("--verbose", action="store_true", help="log every request to stderr")


def serve(args: argparse.Namespace) -> int:
    """Run the server until SIGINT or SIGTERM (exit 0). A bad corpus, a busy port or a fatal error while
    serving: one line naming it, exit 1."""
    if hasattr(signal, "SIGPIPE"):  # a client that hangs up is a failed write, never the server's death
        signal.signal(signal.SIGPIPE, signal.SIG_IGN)
    if args.topk < 1:
        print(f"error: --topk must be a positive integer, got {args.topk}", file=sys.stderr)
        return 1
    try:
        documents = read_corpus(args.corpus)
    except CorpusError as err:
        print(f"error: --corpus: {err}", file=sys.stderr)
        return 1
    try:
        server = RetrievalServer(documents, args.host, args.port, args.topk, quiet=not args.verbose)
    except OSError as err:
        print(
            f"error: cannot listen on {args.host}:{args.port} ({err.strerror or err}); pick another --port "
            "(and the same port in the tool config's retrieval_service_url)",
            file=sys.stderr,
        )
        return 1
    print(
        f"[retrieval-server] {len(documents)} documents from {args.corpus}; "
        f"retrieval_service_url: http://{args.host}:{server.port}/retrieve",
        flush=True,
    )
    stopped = []

    def on_signal(signum, _frame) -> None:
        # serve_forever ends at its next poll; raising here could land anywhere in the main thread
        stopped.append(signal.Signals(signum).name)
        threading.Thread(target=server.shutdown, daemon=True).start()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    status = 0
    try:
        server.serve_forever()
        note(f"stopped ({stopped[0] if stopped else 'shut down'})")
    except Exception as err:  # noqa: BLE001 - the one line that says why the server ends
        note(f"fatal: {type(err).__name__}: {err}; the server stops")
        status = 1
    finally:
        server.server_close()
    return status


def main(argv: list[str] | None = None) -> int:
    return serve(build_parser("python -m verl_npu.tools.retrieval_server").parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
