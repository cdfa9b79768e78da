# SPDX-License-Identifier: Apache-2.0
"""``vllm serve`` (vLLM's OpenAI server) on the TT host platform, bound to 127.0.0.1: every request
field the platform refuses is an HTTP 400 naming it (``response_format: json_object`` was a 500
with an empty message) and the server serves on; SIGINT ends it with its engine core exited, not
SIGKILLed, and no traceback. One server start (45-95 s here): slow."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from models.testing import REPO_ROOT
from models.testing.tiny_models import make_checkpoint, tiny_config
from tests.ttnn.vllm.oracle import tiny_tokenizer

pytestmark = pytest.mark.slow
START_TIMEOUT_S = 600
REQUEST_TIMEOUT_S = 60
EXIT_TIMEOUT_S = 30
MODEL = "tiny-llama"
PROMPT_TEXT = "t3 t5 t7 t9"
# Each refused SamplingParams field an OpenAI request can set (and response_format, which vLLM
# turns into structured_outputs), with the field the answer must name.
REFUSED = {
    "response_format": ({"response_format": {"type": "json_object"}}, "structured_outputs"),
    "structured_outputs": ({"structured_outputs": {"choice": ["t1", "t2"]}}, "structured_outputs"),
    "watermarking": ({"watermarking": True}, "watermarking"),
    "thinking_token_budget": ({"thinking_token_budget": 4}, "thinking_token_budget"),
    "routed_experts_prompt_start": ({"routed_experts_prompt_start": 1}, "routed_experts_prompt_start"),
}


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def post(url: str, body: dict) -> tuple[int, dict]:
    request = urllib.request.Request(url, json.dumps(body).encode(), {"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=REQUEST_TIMEOUT_S) as answer:
            return answer.status, json.loads(answer.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read() or b"{}")


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> Path:
    """A tiny Llama with a word-level tokenizer (token i is ``t<i>``) and a chat template."""
    directory = make_checkpoint("llama", tmp_path_factory.mktemp("serve") / MODEL)
    tiny_tokenizer(directory, tiny_config("llama").vocab_size)
    (directory / "chat_template.jinja").write_text("{% for m in messages %}{{ m['content'] }} {% endfor %}")
    return directory


def wait_until_serving(proc: subprocess.Popen, base: str) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        assert proc.poll() is None, f"vllm serve exited {proc.returncode} while starting"
        try:
            with urllib.request.urlopen(f"{base}/v1/models", timeout=5) as answer:
                if answer.status == 200:
                    return
        except OSError:
            pass
        time.sleep(2)
    raise AssertionError(f"vllm serve did not answer within {START_TIMEOUT_S} s")


def children(pid: int) -> list[int]:
    path = Path(f"/proc/{pid}/task/{pid}/children")
    return [int(child) for child in path.read_text().split()] if path.exists() else []


def process_name(pid: int) -> str:
    """The process's title (vLLM names its engine core ``VLLM::EngineCore``); "" once it is gone."""
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return ""


def test_refused_fields_are_http_400_and_sigint_ends_the_server_cleanly(checkpoint, tmp_path):
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    log = tmp_path / "serve.log"
    vllm = Path(sys.executable).parent / "vllm"
    env = {**os.environ, "TT_CACHE_PATH": str(tmp_path / "tt-cache"), "HF_HUB_OFFLINE": "1",
           "VLLM_ENABLE_V1_MULTIPROCESSING": "1", "PYTHONPATH": str(REPO_ROOT)}  # this checkout's plugin
    with log.open("w") as out:
        proc = subprocess.Popen([str(vllm), "serve", str(checkpoint), "--served-model-name", MODEL, "--host",
                                 "127.0.0.1", "--port", str(port), "--max-model-len", "64", "--max-num-seqs", "2",
                                 "--additional-config", json.dumps({"precision": "bfloat16"})],
                                stdout=out, stderr=subprocess.STDOUT, env=env, cwd=REPO_ROOT, start_new_session=True)
    try:
        wait_until_serving(proc, base)
        chat = {"model": MODEL, "messages": [{"role": "user", "content": PROMPT_TEXT}], "max_tokens": 3,
                "temperature": 0.0, "ignore_eos": True}
        status, answer = post(f"{base}/v1/chat/completions", chat)
        assert status == 200, answer
        served = answer["choices"][0]["message"]["content"]
        for name, (fields, named) in REFUSED.items():
            status, answer = post(f"{base}/v1/chat/completions", {**chat, **fields})
            assert status == 400, (name, answer)
            assert named in answer["error"]["message"] and answer["error"]["param"] == named, (name, answer)
            status, answer = post(f"{base}/v1/chat/completions", chat)  # serves on, the same tokens
            assert status == 200 and answer["choices"][0]["message"]["content"] == served, (name, answer)
        engine_cores = [pid for pid in children(proc.pid) if "EngineCore" in process_name(pid)]
        assert engine_cores, f"no engine core among {[process_name(pid) for pid in children(proc.pid)]}"
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=EXIT_TIMEOUT_S)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    text = log.read_text()
    assert proc.returncode == 0, text[-4000:]
    assert "Traceback" not in text and "force killing" not in text, text[-4000:]
    assert not [pid for pid in engine_cores if process_name(pid)]  # exited (and reaped) with the server
