"""The Python client and CLI carry logprobs, prompt scoring and n choices end to end."""

from __future__ import annotations

import math
import subprocess
import sys
from typing import Any

import pytest
from inference_client import InferenceClient

CLI = [sys.executable, "-m", "inference_client.cli"]
pytestmark = pytest.mark.model


def test_client_collects_every_choice_and_its_logprobs(server: Any) -> None:
    with InferenceClient(server.target) as client:
        gen = client.generate("Name a fruit:", max_tokens=6, temperature=0.9, seed=4, n=3, logprobs=True, top_logprobs=2)
        result = gen.result()
    assert sorted(result.choices) == [0, 1, 2] and sorted(result.dones) == [0, 1, 2]
    assert result.text == result.choices[0]
    assert len(result.logprobs) == len(result.token_ids) == result.dones[0].usage.completion_tokens
    assert all(e.logprob <= 0 and len(e.top) == 2 for e in result.logprobs)


def test_client_scores_a_prompt_without_generating(server: Any) -> None:
    with InferenceClient(server.target) as client:
        result = client.generate("Paris is the capital of France.", max_tokens=0, echo_prompt_logprobs=True).result()
    assert result.text == "" and result.done is not None and result.done.finish_reason == "length"
    assert len(result.prompt_logprobs) == result.done.usage.prompt_tokens - 1
    assert all(math.isfinite(e.logprob) and e.logprob <= 0 for e in result.prompt_logprobs)


def test_cli_prints_choices_and_logprob_tables(server: Any) -> None:
    args = ["--target", server.target, "generate", "Hello", "-n", "2", "--max-tokens", "4", "--temperature", "0.8"]
    args += ["--logprobs", "--top-logprobs", "2", "--seed", "1"]
    proc = subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=600, check=False)
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert "--- choice 0 ---" in out and "--- choice 1 ---" in out
    table = out.split("--- log-probabilities of choice 0")[1].strip().splitlines()[1:]
    assert len(table) == 4 and all(float(line.split("\t")[1]) <= 0 for line in table)
