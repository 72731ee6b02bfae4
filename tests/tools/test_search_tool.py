"""The search tool (verl's SearchTool, Search-R1), the local retrieval server, the Search-R1 data and reward,
and multi_turn.format=qwen: a real server on a free port, real HTTP, a real tiny Qwen2 in the agent loop."""

from __future__ import annotations

import http.server
import json
import socket
import threading
import urllib.error
import urllib.request
from pathlib import Path

import pyarrow.parquet as pq
import pytest
import torch

from verl_npu.config import load_recipe
from verl_npu.data import search_r1 as data
from verl_npu.errors import ConfigErrors
from verl_npu.rewards import default_compute_score
from verl_npu.rewards.search_r1 import compute_score, normalize_answer
from verl_npu.tool_registry import read_tool_config
from verl_npu.tools.loading import load_tools
from verl_npu.tools.retrieval_server import RetrievalServer, read_corpus
from verl_npu.tools.search import MISSING_QUERIES, NO_RESULTS, SearchTool

REPO = Path(__file__).resolve().parents[2]
VERL_CONFIG = REPO / "tests" / "fixtures" / "verl_scripts" / "tool_config" / "search_tool_config.yaml"
MT = "actor_rollout_ref.rollout.multi_turn."


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    out = data.prepare_synthetic(tmp_path_factory.mktemp("search"), 24, 6, seed=3)
    return out


@pytest.fixture(scope="module")
def server(corpus):
    srv = RetrievalServer(read_corpus(corpus["paths"]["corpus"]), port=0, topk=3)
    srv.start_in_thread()
    yield srv
    srv.shutdown()
    srv.server_close()


def url(srv) -> str:
    return f"http://127.0.0.1:{srv.port}/retrieve"


def post(srv, body: bytes | dict, path: str = "/retrieve") -> tuple[int, dict]:
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    req = urllib.request.Request(
        f"http://127.0.0.1:{srv.port}{path}", data=raw, method="POST", headers={"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read())


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# ------------------------------------------------------------------ the retrieval server
def test_each_question_finds_its_own_document_first(server, corpus):
    docs = read_corpus(corpus["paths"]["corpus"])
    facts = data.synthetic_facts(30, seed=3)
    status, answer = post(server, {"queries": [f["question"] for f in facts], "topk": 3, "return_scores": True})
    assert status == 200 and len(answer["result"]) == 30
    for fact, hits, doc in zip(facts, answer["result"], docs):
        assert hits[0]["document"] == doc and fact["answer"] in hits[0]["document"]["contents"]
        scores = [h["score"] for h in hits]
        assert scores == sorted(scores, reverse=True) and scores[0] > scores[-1]


def test_topk_and_return_scores_are_honoured(server):
    q = data.synthetic_facts(1, seed=3)[0]["question"]
    for k in (1, 2, 5):
        assert len(post(server, {"queries": [q], "topk": k, "return_scores": True})[1]["result"][0]) == k
    status, answer = post(server, {"queries": [q, "capital"]})  # no topk: the server's --topk
    assert status == 200 and [len(r) for r in answer["result"]] == [3, 3]
    assert set(answer["result"][0][0]) == {"id", "contents"}  # return_scores false: documents alone
    assert post(server, {"queries": ["zzzz qqqq"], "topk": 3})[1] == {"result": [[]]}  # no shared word: none
    assert post(server, {"queries": []})[1] == {"result": []}


@pytest.mark.parametrize(
    "body, what",
    [
        (b"{not json", "not JSON"),
        (b"[1, 2]", "must be a JSON object"),
        ({"query": ["x"]}, "unknown field(s) ['query']"),
        ({"queries": "x"}, "'queries' must be a list of strings"),
        ({"queries": ["x", 3]}, "'queries' must be a list of strings"),
        ({"queries": ["x"], "topk": 0}, "'topk' must be a positive integer, got 0"),
        ({"queries": ["x"], "topk": "3"}, "'topk' must be a positive integer"),
        ({"queries": ["x"], "return_scores": "yes"}, "'return_scores' must be true or false"),
    ],
)
def test_malformed_requests_get_400_with_a_message(server, body, what):
    status, answer = post(server, body)
    assert status == 400 and what in answer["error"]


def test_health_and_unknown_paths(server, corpus):
    with urllib.request.urlopen(f"http://127.0.0.1:{server.port}/health", timeout=10) as r:
        assert json.loads(r.read()) == {"status": "ok", "documents": 30}
    assert post(server, {"queries": ["x"]}, path="/search")[0] == 404


def test_bad_corpus_and_bad_port_end_in_one_line(tmp_path, server, capsys):
    from verl_npu.cli import main

    assert main(["retrieval-server", "--corpus", str(tmp_path / "none.jsonl")]) == 1
    assert "does not exist" in capsys.readouterr().err
    (tmp_path / "bad.jsonl").write_text('{"id": "0", "contents": "a"}\n{"id": 1}\n')
    assert main(["retrieval-server", "--corpus", str(tmp_path / "bad.jsonl")]) == 1
    assert "bad.jsonl line 2" in capsys.readouterr().err
    (tmp_path / "ok.jsonl").write_text('{"id": "0", "contents": "a"}\n')
    assert main(["retrieval-server", "--corpus", str(tmp_path / "ok.jsonl"), "--port", str(server.port)]) == 1
    err = capsys.readouterr().err
    assert f"cannot listen on 127.0.0.1:{server.port}" in err and "Traceback" not in err


def test_the_command_serves_until_stopped(corpus):
    """`verl-npu retrieval-server` as a user starts it (port 0: any free one, printed in its first line)."""
    import re
    import subprocess
    import sys

    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "verl_npu.cli",
            "retrieval-server",
            "--corpus",
            corpus["paths"]["corpus"],
            "--port",
            "0",
            "--topk",
            "1",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        line = proc.stdout.readline()
        port = int(re.search(r"http://127\.0\.0\.1:(\d+)/retrieve", line).group(1))
        assert line.startswith("[retrieval-server] 30 documents from ")
        srv = type("S", (), {"port": port})
        fact = data.synthetic_facts(1, seed=3)[0]
        assert post(srv, {"queries": [fact["question"]]})[1]["result"][0][0]["contents"].endswith(fact["answer"] + ".")
    finally:
        proc.terminate()
        proc.wait(timeout=30)


# ------------------------------------------------------------------ the search tool
def tool(target: str, **config) -> SearchTool:
    return SearchTool({"type": "native", "retrieval_service_url": target, **config})


def test_search_tool_hands_the_model_verls_text(server):
    facts = data.synthetic_facts(2, seed=3)
    t = tool(url(server), topk=2)
    iid, _ = t.create()
    response, reward, metrics = t.execute(iid, {"query_list": [f["question"] for f in facts]})
    result = json.loads(response.text)["result"]
    first, second = result.split("\n---\n")
    assert first.startswith(f'Doc 1 (Title: "{facts[0]["title"]}")\n') and facts[0]["answer"] in first
    assert "\n\nDoc 2 (Title: " in first and "Doc 3" not in first
    assert second.startswith(f'Doc 1 (Title: "{facts[1]["title"]}")\n')
    assert reward == 0.0 and metrics["status"] == "success" and metrics["total_results"] == 4
    assert t.calc_reward(iid) == [response.text]
    t.release(iid)
    assert json.loads(t.execute("x", {"query_list": ["zzzz"]})[0].text) == {"result": NO_RESULTS}
    assert json.loads(t.execute("x", {"query": ["a"]})[0].text) == {"result": MISSING_QUERIES}
    assert json.loads(t.execute("x", {"query_list": []})[0].text) == {"result": MISSING_QUERIES}
    assert "non-empty string" in t.execute("x", {"query_list": [3]})[0].text


class _Answer(http.server.BaseHTTPRequestHandler):
    """A broken retrieval server: answers every POST with the class's status and body."""

    status, body, calls = 200, b"", [0]

    def do_POST(self):  # noqa: N802
        self.calls[0] += 1
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self.send_response(self.status)
        self.send_header("Content-Length", str(len(self.body)))
        self.end_headers()
        self.wfile.write(self.body)

    def log_message(self, *args):
        pass


@pytest.mark.parametrize(
    "status, body, attempts, what",
    [
        (200, b"<html>not json</html>", 1, "answer is not JSON"),
        (200, b'{"documents": []}', 1, "has no 'result' list"),
        (503, b"busy", 3, "answered HTTP 503: busy (after 3 attempts)"),
        (400, b'{"error": "bad topk"}', 1, 'answered HTTP 400: {"error": "bad topk"}'),
    ],
)
def test_broken_servers_become_an_error_message_in_the_conversation(status, body, attempts, what):
    handler = type("H", (_Answer,), {"status": status, "body": body, "calls": [0]})
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        text = (
            tool(f"http://127.0.0.1:{srv.server_address[1]}/retrieve", max_attempts=3, retry_delay=0)
            .execute("i", {"query_list": ["q"]})[0]
            .text
        )
    finally:
        srv.shutdown()
        srv.server_close()
    result = json.loads(text)["result"]
    assert result.startswith("Search error: ") and what in result
    assert handler.calls[0] == attempts


def test_unreachable_and_silent_servers_become_error_messages():
    text = (
        tool(f"http://127.0.0.1:{free_port()}/retrieve", max_attempts=2, retry_delay=0)
        .execute("i", {"query_list": ["q"]})[0]
        .text
    )
    assert "Search error: cannot reach" in text and "(after 2 attempts)" in text
    with socket.socket() as silent:  # accepts connections, never answers
        silent.bind(("127.0.0.1", 0))
        silent.listen(4)
        text = (
            tool(f"http://127.0.0.1:{silent.getsockname()[1]}/retrieve", timeout=0.3, max_attempts=1)
            .execute("i", {"query_list": ["q"]})[0]
            .text
        )
    assert "within 0.3 s" in text and "(after 1 attempt)" in text


class _Slow(http.server.BaseHTTPRequestHandler):
    """A retrieval server that takes 0.2 s per request and records how many were in flight at once."""

    lock, now, most = threading.Lock(), [0], [0]

    def do_POST(self):  # noqa: N802
        import time

        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        with self.lock:
            self.now[0] += 1
            self.most[0] = max(self.most[0], self.now[0])
        time.sleep(0.2)
        with self.lock:
            self.now[0] -= 1
        body = b'{"result": [[]]}'
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


@pytest.mark.parametrize(
    "config, most",
    [
        ({"num_workers": 2, "enable_global_rate_limit": False}, 2),
        ({"num_workers": 8, "rate_limit": 3}, 3),
        ({"num_workers": 8, "enable_global_rate_limit": False}, 6),
    ],
)
def test_num_workers_and_rate_limit_bound_the_requests_in_flight(config, most):
    handler = type("H", (_Slow,), {"lock": threading.Lock(), "now": [0], "most": [0]})
    server_class = type("Srv", (http.server.ThreadingHTTPServer,), {"request_queue_size": 32})
    srv = server_class(("127.0.0.1", 0), handler)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        t = tool(f"http://127.0.0.1:{srv.server_address[1]}/retrieve", **config)
        calls = [threading.Thread(target=t.execute, args=(str(i), {"query_list": ["q"]})) for i in range(6)]
        for c in calls:
            c.start()
        for c in calls:
            c.join(30)
    finally:
        srv.shutdown()
        srv.server_close()
    assert handler.most[0] == most


def test_verls_search_tool_config_loads_under_verls_class_path(server, tmp_path):
    assert read_tool_config(VERL_CONFIG)[1] == []
    cfg = tmp_path / "tools.yaml"
    cfg.write_text(VERL_CONFIG.read_text().replace("http://127.0.0.1:8000/retrieve", url(server)))
    built = load_tools(cfg)["search"]
    assert isinstance(built, SearchTool) and built.topk == 3 and built.timeout == 30
    assert "Doc 1 (Title:" in built.execute("i", {"query_list": ["capital"]})[0].text


@pytest.mark.parametrize(
    "config, where, what",
    [
        ("{type: native}", "config.retrieval_service_url", "is missing"),
        ("{type: native, retrieval_service_url: localhost:8000}", "config.retrieval_service_url", "http://host:port"),
        ("{type: native, retrieval_service_url: 'http://h/r', topk: 0}", "config.topk", "positive integer"),
        ("{type: native, retrieval_service_url: 'http://h/r', timeout: -1}", "config.timeout", "positive number"),
        (
            "{type: native, retrieval_service_url: 'http://h/r', top_k: 3}",
            "config.top_k",
            "not a key of the search tool",
        ),
        (
            "{type: native, retrieval_service_url: 'http://h/r', enable_global_rate_limit: 1}",
            "config.enable_global_rate_limit",
            "true or false",
        ),
    ],
)
def test_bad_search_configs_are_refused_by_key(tmp_path, config, where, what):
    path = tmp_path / "t.yaml"
    path.write_text(f"tools:\n  - class_name: verl.tools.search_tool.SearchTool\n    config: {config}\n")
    _, problems = read_tool_config(path)
    assert any(w.endswith(f"tools[0].{where}") and what in m for w, m in problems), problems


# ------------------------------------------------------------------ data, reward, format
def test_synthetic_data_has_verls_search_r1_columns(corpus):
    rows = pq.read_table(corpus["paths"]["train"]).to_pylist()
    assert len(rows) == 24 and len(pq.read_table(corpus["paths"]["test"])) == 6
    row = rows[0]
    assert row["data_source"] == "searchR1_synthetic" and row["agent_name"] == "tool_agent"
    assert [m["role"] for m in row["prompt"]] == ["system", "user"]
    assert row["prompt"][1]["content"].startswith("Answer the given question. You must conduct reasoning")
    assert row["prompt"][1]["content"].endswith("Question: " + row["extra_info"]["question"])
    answer = row["reward_model"]["ground_truth"]["target"]
    assert row["extra_info"]["tools_kwargs"]["search"]["create_kwargs"]["ground_truth"] == {"target": answer}
    assert len(read_corpus(corpus["paths"]["corpus"])) == 30


def test_local_search_r1_data_converts(tmp_path):
    import pyarrow as pa

    src = tmp_path / "src"
    src.mkdir()
    pq.write_table(
        pa.Table.from_pylist(
            [{"question": "who wrote hamlet?", "golden_answers": ["Shakespeare"], "data_source": "nq"}]
        ),
        src / "train.parquet",
    )
    data.main(["--local_dataset_path", str(src), "--local_dir", str(tmp_path / "out")])
    [row] = pq.read_table(tmp_path / "out" / "train.parquet").to_pylist()
    assert row["data_source"] == "searchR1_nq" and row["reward_model"]["ground_truth"] == {"target": ["Shakespeare"]}
    with pytest.raises(SystemExit, match="exists; pass --overwrite"):
        data.main(["--local-dataset-path", str(src), "--local-save-dir", str(tmp_path / "out")])


@pytest.mark.parametrize(
    "response, truth, score",
    [
        ("<think>x</think><answer> Beijing </answer>", {"target": ["beijing"]}, 1.0),
        ("<answer>The Beijing!</answer>", {"target": ["Beijing"]}, 1.0),  # article, punctuation, case
        ("<answer>Paris</answer> then <answer>Beijing</answer>", {"target": ["Beijing"]}, 1.0),  # the last one counts
        ("<answer>Beijing</answer> then <answer>Paris</answer>", {"target": ["Beijing"]}, 0.0),
        ("Beijing", {"target": ["Beijing"]}, 0.0),  # no answer tag
        ("<answer>Beijing city</answer>", {"target": ["Beijing"]}, 0.0),  # exact, not substring
        ("<answer>x</answer>" * 11 + "<answer>Beijing</answer>", {"target": ["Beijing"]}, 0.25),  # > 10 tags
        ("<answer>Kyoto</answer>", {"target": ["Tokyo", "Kyoto"]}, 1.0),
        ("<answer>Kyoto</answer>", "{'target': ['Kyoto']}", 1.0),  # the mapping as text
        ("<answer>Kyoto</answer>", "Kyoto", 1.0),
    ],
)
def test_exact_match_reward_hand_cases(response, truth, score):
    assert compute_score("searchR1_nq", response, truth) == score
    assert default_compute_score("searchR1_hotpotqa", response, truth) == score


def test_normalize_answer():
    assert normalize_answer("  The  U.S.A.,  an Answer! ") == "usa answer"


def test_format_qwen_is_hermes_and_other_formats_stay_refused():
    for name in ("qwen", "qwen25", "hermes"):
        rc = load_recipe("tiny_gsm8k", [MT + "enable=true", MT + f"format={name}"])
        assert rc.backend.actor_rollout_ref.rollout.multi_turn.format == name
    with pytest.raises(ConfigErrors, match="format"):
        load_recipe("tiny_gsm8k", [MT + "enable=true", MT + "format=chatml"])


# ------------------------------------------------------------------ run: the server must be up
def test_run_stops_early_naming_the_key_and_the_server_command(tmp_path, capsys, corpus):
    from verl_npu.cli import main

    dead = tmp_path / "tools.yaml"
    dead.write_text(VERL_CONFIG.read_text().replace("127.0.0.1:8000", f"127.0.0.1:{free_port()}"))
    args = [
        f"{MT}tool_config_path={dead}",
        f"data.train_files={corpus['paths']['train']}",
        f"data.val_files={corpus['paths']['test']}",
        f"af_output_dir={tmp_path / 'out'}",
    ]
    assert main(["validate", "tiny_search_r1", *args]) == 0  # validation does not need the server
    assert "retrieval server cannot be reached" in capsys.readouterr().out
    assert main(["run", "tiny_search_r1", *args]) == 1
    err = capsys.readouterr().err
    assert "multi_turn.tool_config_path" in err and "tools[0].config.retrieval_service_url" in err
    assert "verl-npu retrieval-server --corpus" in err and "Traceback" not in err
    assert not (tmp_path / "out").exists()


# ------------------------------------------------------------------ a scripted search in the agent loop
def test_scripted_search_turn_comes_back_as_an_untrained_tool_turn(server):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from verl_npu.batch import Batch
    from verl_npu.config.typed import section
    from verl_npu.models.tiny import materialize
    from verl_npu.rollout.agent_loop import MULTI_TURN, AgentLoop
    from verl_npu.rollout.base import SamplingParams
    from verl_npu.rollout.hf import HFRollout

    path = materialize("tiny://qwen2")
    torch.manual_seed(0)
    model, tok = AutoModelForCausalLM.from_pretrained(path).float().eval(), AutoTokenizer.from_pretrained(path)
    fact = data.synthetic_facts(1, seed=3)[0]
    call = '<tool_call>{"name": "search", "arguments": {"query_list": ["%s"]}}</tool_call>' % fact["question"]
    turns = [call, f"<answer> {fact['answer']} </answer>"]
    eng = HFRollout(model, tok, seed=0)
    eos = eng.eos_ids[0]

    def factory(active, steps):
        plan = [tok(turns[t.assistant_turns], add_special_tokens=False)["input_ids"] + [eos] for t in active]
        return lambda scores, i: torch.tensor([p[i] if i < len(p) else eos for p in plan])

    search = tool(url(server), topk=1)
    loop = AgentLoop(
        model,
        tok,
        {"search": search},
        section(MULTI_TURN, {"max_tool_response_length": 4000}),
        eos_ids=eng.eos_ids,
        pad_id=eng.pad_id,
        suppress_ids=eng.suppress_ids,
        pick_factory=factory,
    )
    prompt = tok(
        tok.apply_chat_template(
            [{"role": "user", "content": fact["question"]}], tokenize=False, add_generation_prompt=True
        ),
        add_special_tokens=False,
    )["input_ids"]
    batch = Batch(
        {"input_ids": torch.tensor([prompt]), "attention_mask": torch.ones(1, len(prompt), dtype=torch.long)},
        {"raw_prompt_ids": [prompt], "uid": ["q"], "extra_info": [{}]},
    )
    width = 400
    out = loop.run(batch, SamplingParams(n=1, max_new_tokens=width))

    want_text = json.dumps(
        {"result": f'Doc 1 (Title: "{fact["title"]}")\n' + fact["contents"].partition("\n")[2]}, ensure_ascii=False
    )
    model_turn, tool_turn, answer_turn = out["agent_turns"][0]
    assert tool_turn["role"] == "tool" and tool_turn["calls"][0]["result"] == want_text
    assert tool_turn["calls"][0]["arguments"] == {"query_list": [fact["question"]]}
    n1, n2, n3 = model_turn["tokens"], tool_turn["tokens"], answer_turn["tokens"]
    tool_ids = out["responses"][0, n1 : n1 + n2].tolist()
    assert want_text in tok.decode(tool_ids)  # the server's answer, verl's text
    assert out["response_mask"][0].tolist() == [1] * n1 + [0] * n2 + [1] * n3 + [0] * (width - n1 - n2 - n3)
    assert out["tool_call_counts"] == [1]
    conversation = tok.decode(out["responses"][0, : n1 + n2 + n3], skip_special_tokens=True)
    assert compute_score("searchR1_synthetic", conversation, {"target": [fact["answer"]]}) == 1.0
