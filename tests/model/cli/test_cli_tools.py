"""The ``inference-client`` CLI with tools: ``generate --tools FILE --tool-choice`` prints each call as one
JSON line; ``count``/``tokenize`` with ``--tools`` count what Generate prefills."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import jsonschema
import pytest

pytestmark = pytest.mark.model
CLI = [sys.executable, "-m", "inference_client.cli"]
PARAMS = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 20}}, "required": ["city"],
          "additionalProperties": False}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "Weather of a city",
                                           "parameters": PARAMS}}]


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=600, check=False)


def test_generate_with_tools_prints_each_call_and_counts_match(server: Any, tmp_path: Path) -> None:
    tools = tmp_path / "tools.json"
    tools.write_text(json.dumps(TOOLS))
    proc = run("--target", server.target, "generate", "Weather in Oslo?", "--tools", str(tools),
               "--tool-choice", "get_weather", "--max-tokens", "64", "--temperature", "0")
    assert proc.returncode == 0, proc.stderr
    lines = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith('{"tool_call"')]
    assert len(lines) == 1 and lines[0]["tool_call"]["name"] == "get_weather"
    assert lines[0]["tool_call"]["id"].startswith("call_")
    jsonschema.validate(lines[0]["tool_call"]["arguments"], PARAMS)
    summary = proc.stderr.strip().splitlines()[-1]
    assert "finish=tool_calls" in summary
    prompt_tokens = int(re.search(r"prompt=(\d+)", summary).group(1))  # type: ignore[union-attr]
    count = run("--target", server.target, "count", "Weather in Oslo?", "--tools", str(tools))
    assert count.returncode == 0, count.stderr
    assert int(count.stdout.strip()) == prompt_tokens
    none = run("--target", server.target, "count", "Weather in Oslo?", "--tools", str(tools), "--tool-choice", "none")
    assert int(none.stdout.strip()) < prompt_tokens  # "none" leaves the tools out of the prompt


def test_several_choices_print_each_choices_call(server: Any, tmp_path: Path) -> None:
    tools = tmp_path / "tools.json"
    tools.write_text(json.dumps(TOOLS))
    proc = run("--target", server.target, "generate", "Weather in Oslo?", "--tools", str(tools), "-n", "2",
               "--tool-choice", "get_weather", "--max-tokens", "64", "--temperature", "0.7", "--seed", "5")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.count("--- choice ") == 2
    calls = [json.loads(line)["tool_call"] for line in proc.stdout.splitlines() if line.startswith('{"tool_call"')]
    assert [c["name"] for c in calls] == ["get_weather", "get_weather"]
    for call in calls:
        jsonschema.validate(call["arguments"], PARAMS)
