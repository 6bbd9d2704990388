"""Log-probabilities, prompt scoring and n choices, on the real default model and a real server."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import grpc
import numpy as np
import pytest
from inference.v1 import inference_pb2 as pb
from inference.v1 import inference_pb2_grpc as pb_grpc

from service.model.runner import ModelRunner
from tests.support.helpers import OpenStream, req, run_stream
from tests.support.server import DEFAULT_MODEL, RunningServer, assert_kv_clean, start_server, wait_idle

pytestmark = pytest.mark.model

PROMPT = "The three primary colours are red, yellow and"


@pytest.fixture(scope="module")
def single() -> Iterator[RunningServer]:
    """A server that runs one sequence at a time (``--max-running 1``), as the reference needs."""
    srv = start_server(max_running=1, threads=1)
    yield srv
    srv.close()


class RowRecorder:
    """``Engine.logits_hook``: copies of the rows a request's tokens were sampled from."""

    def __init__(self) -> None:
        self.rows: list[np.ndarray] = []

    def __call__(self, seqs: list[Any], logits: np.ndarray) -> None:
        self.rows.extend(logits[i].astype(np.float64) for i in range(len(seqs)))


def _reference(row: np.ndarray, temperature: float) -> np.ndarray:
    x = row / (temperature if temperature > 0 else 1.0)
    x = x - x[np.isfinite(x)].max()
    return x - np.log(np.exp(x).sum())


@pytest.mark.parametrize("temperature", [0.0, 0.7])
def test_logprobs_match_a_numpy_reference_from_the_raw_logits(single: RunningServer, temperature: float) -> None:
    rec = RowRecorder()
    single.engine.logits_hook = rec
    try:
        with grpc.insecure_channel(single.target) as ch:
            r = req("lp", PROMPT, 12, temperature=temperature, seed=3, logprobs=True, top_logprobs=5)
            res = run_stream(ch, [r])["lp"]
    finally:
        single.engine.logits_hook = None
    entries = [e for d in res.deltas for e in d.logprobs]
    assert [e.token_id for e in entries] == res.token_ids
    assert len(rec.rows) >= len(entries) == 12
    for row, e in zip(rec.rows, entries, strict=False):
        ref = _reference(row, temperature)
        assert abs(e.logprob - ref[e.token_id]) < 1e-3
        true_top = np.argsort(-ref, kind="stable")[:5]
        assert [t.token_id for t in e.top_logprobs] == list(true_top)
        assert np.allclose([t.logprob for t in e.top_logprobs], ref[true_top], atol=1e-3)
        assert e.token == single.engine.runner.vocab.token_bytes[e.token_id]
    if temperature == 0.0:  # greedy: the sampled token is the most likely one
        assert all(e.top_logprobs[0].token_id == e.token_id for e in entries)


def test_constrained_logprobs_come_after_the_grammar_mask(server: RunningServer, channel: grpc.Channel) -> None:
    fmt = pb.ResponseFormat(regex="[0-9]{6}")
    r = req("digits", "Pick a number:", 16, logprobs=True, top_logprobs=20, response_format=fmt)
    res = run_stream(channel, [r])["digits"]
    vocab = server.engine.runner.vocab
    entries = [e for d in res.deltas for e in d.logprobs]
    assert res.text.isdigit() and len(entries) == len(res.token_ids) > 0
    for e in entries:
        assert e.logprob <= 1e-6
        # Every alternative is a token the grammar allowed: digits only, never masked text.
        assert all(vocab.token_bytes[t.token_id].isdigit() for t in e.top_logprobs)
        assert np.exp([t.logprob for t in e.top_logprobs]).sum() <= 1.0 + 1e-4


def _manual_prompt_logprobs(ids: list[int]) -> list[float]:
    """Token by token through a context of our own: log p(ids[k+1] | ids[..k])."""
    runner = ModelRunner(DEFAULT_MODEL, n_ctx=256, step_tokens=8, n_lanes=1, n_threads=1)
    try:
        out = []
        for k, tok in enumerate(ids[:-1]):
            row = runner.decode(np.asarray([tok]), np.asarray([k]), np.asarray([0]), np.asarray([1]))[0]
            out.append(float(_reference(row.astype(np.float64), 1.0)[ids[k + 1]]))
        return out
    finally:
        runner.close()


def test_prompt_logprobs_equal_a_token_by_token_loop(server: RunningServer, channel: grpc.Channel) -> None:
    # Warm the prefix cache first: prompt scoring must compute every position anyway.
    run_stream(channel, [req("warm", PROMPT, 1)])
    r = req("score", PROMPT, 0, echo_prompt_logprobs=True, top_logprobs=3, logprobs=True)
    res = run_stream(channel, [r])["score"]
    assert res.done.finish_reason == pb.FINISH_REASON_LENGTH and res.done.usage.completion_tokens == 0
    assert res.done.usage.cached_tokens == 0
    scored = [e for d in res.deltas for e in d.prompt_logprobs]
    ids = server.engine.runner.vocab.tokenize(PROMPT, add_special=True, parse_special=False)
    assert [e.token_id for e in scored] == ids[1:]
    manual = _manual_prompt_logprobs(ids)
    assert np.allclose([e.logprob for e in scored], manual, atol=1e-3)
    assert abs(sum(e.logprob for e in scored) - sum(manual)) < 1e-2
    assert all(len(e.top_logprobs) == 3 for e in scored)
    assert_kv_clean(server)


def test_long_prompt_scoring_spans_several_steps_and_then_generates(
    server: RunningServer, channel: grpc.Channel
) -> None:
    prompt = " ".join(f"item{i}" for i in range(60))  # well over the 32 logits rows of one step
    r = req("long", prompt, 4, echo_prompt_logprobs=True)
    res = run_stream(channel, [r])["long"]
    scored = [e for d in res.deltas for e in d.prompt_logprobs]
    assert len(scored) == res.done.usage.prompt_tokens - 1 > 64
    assert res.deltas[0].prompt_logprobs and not res.deltas[0].token_ids  # before any generated text
    assert len(res.token_ids) == 4
    assert_kv_clean(server)


def _choices(responses: Any) -> tuple[dict[int, str], dict[int, pb.Done]]:
    texts: dict[int, str] = {}
    dones: dict[int, pb.Done] = {}
    for m in responses:
        assert m.WhichOneof("event") != "error", m.error
        if m.WhichOneof("event") == "delta":
            texts[m.delta.choice_index] = texts.get(m.delta.choice_index, "") + m.delta.text
        else:
            assert m.done.choice_index not in dones
            dones[m.done.choice_index] = m.done
    return texts, dones


def test_n_choices_share_one_prefill(server: RunningServer, channel: grpc.Channel) -> None:
    stub = pb_grpc.InferenceServiceStub(channel)
    prompt = "A short story about a lighthouse keeper and a storm, told in one paragraph. " * 3
    wait_idle(server)
    before = stub.GetMetrics(pb.GetMetricsRequest())
    r = req("n4", prompt, 12, n=4, seed=11, temperature=0.9)
    texts, dones = _choices(stub.Generate(iter([r])))
    after = stub.GetMetrics(pb.GetMetricsRequest())
    assert sorted(dones) == [0, 1, 2, 3] and len(set(texts.values())) > 1
    n_prompt = dones[0].usage.prompt_tokens
    block = server.engine.kv.block_size
    # One prefill of the prompt; each further choice computes less than one block of it.
    assert after.prefill_tokens_total - before.prefill_tokens_total < n_prompt + 3 * block
    assert after.shared_prefill_choices - before.shared_prefill_choices == 3
    assert all(dones[i].usage.cached_tokens >= n_prompt - block for i in (1, 2, 3))
    assert_kv_clean(server)


@pytest.fixture(scope="module")
def exact() -> Iterator[RunningServer]:
    """A server without prefix reuse: a repeated request computes bit-identical logits (on the shared
    server the repeat would reuse cached KV cells, another summation order)."""
    srv = start_server(prefix_cache=False)
    yield srv
    srv.close()


def test_n_choices_with_a_seed_are_reproducible(exact: RunningServer) -> None:
    prompt = "A short story about a lighthouse keeper and a storm, told in one paragraph. " * 3
    r = req("n4", prompt, 12, n=4, seed=11, temperature=0.9)
    with grpc.insecure_channel(exact.target) as ch:
        stub = pb_grpc.InferenceServiceStub(ch)
        texts, dones = _choices(stub.Generate(iter([r])))
        again, _ = _choices(stub.Generate(iter([r])))
        r.sampling.seed = 12
        other, _ = _choices(stub.Generate(iter([r])))
    assert sorted(dones) == [0, 1, 2, 3] and len(set(texts.values())) > 1
    assert again == texts and other != texts
    assert_kv_clean(exact)


def test_cancelling_an_n_choice_request_ends_every_choice(server: RunningServer, channel: grpc.Channel) -> None:
    stream = OpenStream(channel)
    stream.send(req("many", "Count slowly:", 400, n=3, temperature=0.8, ignore_eos=True))
    first = stream.next_event()
    assert first.WhichOneof("event") == "delta"
    stream.send(pb.GenerateRequest(request_id="many", cancel=True))
    stream.close()
    stream.join()
    rest = list(stream.events.queue)
    dones = [m.done for m in rest if m.WhichOneof("event") == "done"]
    assert sorted(d.choice_index for d in dones) == [0, 1, 2]
    assert all(d.finish_reason == pb.FINISH_REASON_CANCELLED for d in dones)
    assert not [m for m in rest if m.WhichOneof("event") == "error"]
    wait_idle(server)
    assert_kv_clean(server)


def test_a_failing_choice_ends_an_n_choice_request_with_one_error_and_nothing_after(
    server: RunningServer, channel: grpc.Channel, monkeypatch: pytest.MonkeyPatch
) -> None:
    """n = 3 with log-probabilities; the fifth log-probability computation (one choice, second step)
    fails: the request gets one INTERNAL error, no done, and no event of any choice after it; the
    other choices are aborted (idle engine, no KV held)."""
    import service.engine.model_step

    real, calls = service.engine.model_step.token_logprob, []

    def fails_once(*a: Any, **k: Any) -> Any:
        calls.append(1)
        if len(calls) == 5:
            raise FloatingPointError("injected")
        return real(*a, **k)

    monkeypatch.setattr(service.engine.model_step, "token_logprob", fails_once)
    events = list(
        pb_grpc.InferenceServiceStub(channel).Generate(
            iter([req("n3", PROMPT, 40, n=3, temperature=0.8, seed=4, logprobs=True, ignore_eos=True)])
        )
    )
    kinds = [e.WhichOneof("event") for e in events]
    assert kinds.count("error") == 1 and kinds.count("done") == 0, kinds
    assert kinds[-1] == "error", kinds  # nothing after the terminal event
    assert events[-1].error.status == "INTERNAL" and "injected" not in events[-1].error.message
    assert sum(len(e.delta.token_ids) for e in events if e.WhichOneof("event") == "delta") < 3 * 40
    wait_idle(server)
    assert_kv_clean(server)


def test_no_event_follows_a_terminal_event_under_cancels(server: RunningServer, channel: grpc.Channel) -> None:
    """Requests cancelled right after their first delta, some with several choices: per request id,
    nothing after its error or final done, and per choice nothing after its done."""
    stream = OpenStream(channel)
    for i in range(6):
        stream.send(req(f"c{i}", f"Story {i}:", 60, n=1 + i % 3, temperature=0.7, seed=i, ignore_eos=True))
    cancelled: set[str] = set()
    events: list[pb.GenerateResponse] = []
    while len(cancelled) < 6:
        ev = stream.next_event()
        events.append(ev)
        if ev.WhichOneof("event") == "delta" and ev.request_id not in cancelled:
            cancelled.add(ev.request_id)
            stream.send(pb.GenerateRequest(request_id=ev.request_id, cancel=True))
    stream.close()
    stream.join()
    events += list(stream.events.queue)
    ended: set[str] = set()
    choice_done: set[tuple[str, int]] = set()
    dones: dict[str, int] = {}
    for ev in events:
        kind, rid = ev.WhichOneof("event"), ev.request_id
        assert rid not in ended, f"{kind} after the terminal event of {rid}"
        if kind == "delta":
            assert (rid, ev.delta.choice_index) not in choice_done, f"delta after choice {ev.delta.choice_index} of {rid} ended"
        elif kind == "done":
            choice_done.add((rid, ev.done.choice_index))
            dones[rid] = dones.get(rid, 0) + 1
            if dones[rid] == 1 + int(rid[1:]) % 3:
                ended.add(rid)
        else:
            ended.add(rid)
    assert ended == {f"c{i}" for i in range(6)}
    wait_idle(server)
    assert_kv_clean(server)


@pytest.mark.parametrize(
    ("sampling", "words"),
    [
        ({"logprobs": True, "top_logprobs": 21}, "top_logprobs"),
        ({"logprobs": True, "top_logprobs": -1}, "top_logprobs"),
        ({"top_logprobs": 3}, "needs logprobs"),
        ({"n": 0}, "n must be"),
        ({"n": 17}, "n must be"),
        ({"n": -2}, "n must be"),
        ({"max_tokens": 0}, "echo_prompt_logprobs"),
    ],
)
def test_bad_logprob_and_choice_values_are_invalid_argument(
    channel: grpc.Channel, sampling: dict[str, Any], words: str
) -> None:
    sp = {"max_tokens": 4, "temperature": 0.0, **sampling}
    r = pb.GenerateRequest(request_id="bad", prompt="Hi", sampling=pb.SamplingParams(**sp))
    res = run_stream(channel, [r])["bad"]
    assert res.error is not None and res.error.status == "INVALID_ARGUMENT", res
    assert words in res.error.message


def test_generate_json_refuses_several_choices(channel: grpc.Channel) -> None:
    stub = pb_grpc.InferenceServiceStub(channel)
    with pytest.raises(grpc.RpcError) as err:
        stub.GenerateJSON(
            pb.GenerateJSONRequest(prompt="x", json_schema='{"type":"integer"}', sampling=pb.SamplingParams(n=2))
        )
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT


def test_generate_json_returns_logprobs_of_its_document(channel: grpc.Channel) -> None:
    stub = pb_grpc.InferenceServiceStub(channel)
    resp = stub.GenerateJSON(
        pb.GenerateJSONRequest(
            prompt="A small integer:",
            json_schema='{"type":"integer","minimum":0,"maximum":99}',
            sampling=pb.SamplingParams(temperature=0.0, logprobs=True),
        )
    )
    assert len(resp.logprobs) == resp.usage.completion_tokens - 1 or len(resp.logprobs) == resp.usage.completion_tokens
    assert b"".join(e.token for e in resp.logprobs).decode() == resp.json


def test_a_failing_logprob_computation_ends_only_its_own_request(
    server: RunningServer, channel: grpc.Channel, monkeypatch: pytest.MonkeyPatch
) -> None:
    import service.engine.model_step

    def broken(*_a: Any, **_k: Any) -> Any:
        raise FloatingPointError("injected")

    monkeypatch.setattr(service.engine.model_step, "token_logprob", broken)
    monkeypatch.setattr(service.engine.model_step, "prompt_logprobs", broken)
    out = run_stream(
        channel,
        [
            req("lp", PROMPT, 8, logprobs=True),
            req("echo", PROMPT, 4, echo_prompt_logprobs=True),
            req("plain", PROMPT, 8, ignore_eos=True),
        ],
    )
    for rid in ("lp", "echo"):
        assert out[rid].error is not None and out[rid].error.status == "INTERNAL", out[rid]
        assert "injected" not in out[rid].error.message  # the exception type, never its text
    assert out["plain"].done is not None and len(out["plain"].token_ids) == 8
    wait_idle(server)
    assert_kv_clean(server)
