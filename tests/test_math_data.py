"""Real math data: file loaders (JSONL/Parquet, malformed lines), boxed extraction, and the
math_verify reward (including outside the main thread)."""

import json
import logging
import threading

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from tokenizers import Tokenizer, models, pre_tokenizers

from rl_batch.tasks import Example, MathTask, get_task, load_math_file, math_score
from rl_batch.tasks.base import Score
from rl_batch.tasks.math_data import DEFAULT_INSTRUCTION
from rl_batch.tasks.rewards import (
    UNVERIFIED_TIMEOUT,
    UNVERIFIED_TOO_BIG,
    extract_boxed,
    extract_final_answer,
    unverified_counts,
)
from rl_batch.tokenizers import HFTokenizer


def write_jsonl(path, records):
    lines = [r if isinstance(r, str) else json.dumps(r) for r in records]
    path.write_text("\n".join(lines) + "\n")
    return path


def tiny_chat_tokenizer(directory, bos=False):
    """One token per word or special token (ChatML template); with ``bos``, a ``<s>``
    BOS token that `encode_prompt` prepends."""
    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"] + (["<s>"] if bos else [])
    vocab = {"[UNK]": 0, **{t: i for i, t in enumerate(specials, start=1)}}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.add_special_tokens(specials)
    directory.mkdir()
    tok.save(str(directory / "tokenizer.json"))
    return HFTokenizer(directory)


# ---------------------------------------------------------------------------------------
# Answer extraction and scoring


def test_extract_boxed():
    assert extract_boxed(r"so \boxed{\frac{1}{2}}.") == r"\frac{1}{2}"
    assert extract_boxed(r"\boxed{1} then \boxed{ {2}+3 }") == "{2}+3"  # Last one, stripped.
    assert extract_boxed(r"\fbox{7}") == "7"
    assert extract_boxed(r"\boxed {x}") == "x"
    assert extract_boxed(r"\boxed{\frac{1}{2}") is None  # Unbalanced.
    assert extract_boxed("no box here") is None
    assert extract_final_answer("steps...\nAnswer: $34$") == "34"
    assert extract_final_answer("Answer: 1\n\\boxed{2}") == "2"  # Boxed wins.


@pytest.mark.parametrize(
    "response,truth,reward,format_ok",
    [
        (r"The answer is \boxed{42}.", "42", 1.0, True),
        (r"\boxed{ 42 }", "42", 1.0, True),  # Whitespace inside the box.
        (r"\boxed{41}", "42", 0.0, True),
        (r"\boxed{0.5}", r"\frac{1}{2}", 1.0, True),
        (r"\boxed{\dfrac{1}{2}}", "0.5", 1.0, True),
        (r"\boxed{3\sqrt{2}}", r"\sqrt{18}", 1.0, True),
        (r"\boxed{x = 5}", "5", 1.0, True),
        ("The answer is 42.", "42", 0.0, False),  # No box: format not ok.
        (r"\boxed{}", "42", 0.0, False),
        (r"\boxed{42", "42", 0.0, False),  # Unclosed box.
        ("Let me think.\nAnswer: 34", "34", 1.0, True),  # DAPO's own answer format.
    ],
)
def test_math_score(response, truth, reward, format_ok):
    score = math_score(response, truth)
    assert (score.reward, score.format_ok) == (reward, format_ok)


def test_math_score_in_a_worker_thread():
    """math_verify's signal timeouts fail off the main thread; math_score must still work."""
    results = {}

    def work():
        results["ok"] = math_score(r"\boxed{\frac{2}{4}}", "0.5")
        results["bad"] = math_score(r"\boxed{3}", "0.5")

    thread = threading.Thread(target=work)
    thread.start()
    thread.join(timeout=60)
    assert results["ok"].reward == 1.0 and results["ok"].error is None
    assert results["bad"].reward == 0.0 and results["bad"].format_ok


def test_pathological_answers_score_zero_without_the_verifier(monkeypatch):
    import math_verify

    calls = []
    monkeypatch.setattr(math_verify, "parse", lambda *a, **k: calls.append(a) or [])
    nested = "{" * 900 + "1" + "}" * 900  # (4000 deep took 21 s per math_verify call)
    score = math_score(r"\boxed{1}", nested)
    assert (score.reward, score.format_ok) == (0.0, True)
    assert score.error == "ground truth not verified: brackets nested 900 deep (more than 64)"
    long = math_score("\\boxed{" + "1" * 5000 + "}", "1")
    assert long.error == "answer not verified: 5000 characters (more than 2000)"
    assert calls == []  # neither reached math_verify
    assert math_score(r"\boxed{\frac{(1+2)}{[3]}}", "1") is not None and calls  # ordinary ones do


def test_unverified_scores_are_marked_and_counted_for_the_math_task():
    too_big = math_score("\\boxed{" + "1" * 5000 + "}", "1")
    nested = math_score(r"\boxed{1}", "{" * 65 + "1" + "}" * 65)
    verified = math_score(r"\boxed{1}", "1")
    timed_out = Score(0.0, True, "1", "not verified", unverified=UNVERIFIED_TIMEOUT)
    assert too_big.unverified == nested.unverified == UNVERIFIED_TOO_BIG
    assert verified.unverified is None and verified.reward == 1.0
    scores = [too_big, verified, nested, timed_out]
    assert unverified_counts(MathTask(), scores) == {
        "score_unverified_too_big": 2,
        "score_unverified_timeout": 1,
    }
    # Tasks whose verifier never skips add no fields to the metrics lines.
    assert unverified_counts(get_task("addition"), scores) == {}


def _in_a_worker_thread(fn):
    """``fn()`` run in a thread that is not the main one, then every watchdog thread
    (``rewards.call_with_timeout``) it left behind finished."""
    results = {}
    thread = threading.Thread(target=lambda: results.update(value=fn()), daemon=True)
    thread.start()
    thread.join(timeout=300)  # a guard against a hang, not a measurement
    assert "value" in results, "math_score did not return (no watchdog?)"
    return results["value"]


def _join_watchdog_threads():
    for thread in threading.enumerate():
        if thread.name == "math_verify":
            thread.join()


def test_a_slow_verifier_off_the_main_thread_times_out(monkeypatch):
    import math_verify

    release, calls = threading.Event(), []

    def slow_verify(gold, pred, timeout_seconds=None):
        calls.append(timeout_seconds)
        release.wait()  # stuck until the test lets it go
        return True

    monkeypatch.setattr(math_verify, "verify", slow_verify)
    try:
        score = _in_a_worker_thread(lambda: math_score(r"\boxed{42}", "42", timeout_s=0.01))
    finally:
        release.set()
    _join_watchdog_threads()
    assert (score.reward, score.format_ok, score.parsed) == (0.0, True, "42")
    assert score.unverified == UNVERIFIED_TIMEOUT
    assert score.error == "not verified: math_verify ran past 0.03 s"
    assert calls == [None]  # math_verify's own (signal) timeout is off in a thread
    assert unverified_counts(MathTask(), [score])["score_unverified_timeout"] == 1


def test_the_watchdog_returns_the_verdict_and_the_errors_of_a_quick_verifier(monkeypatch):
    import math_verify

    calls = []

    def quick_verify(gold, pred, timeout_seconds=None):
        calls.append(timeout_seconds)
        return True

    monkeypatch.setattr(math_verify, "verify", quick_verify)
    score = _in_a_worker_thread(lambda: math_score(r"\boxed{42}", "42", timeout_s=60))
    assert (score.reward, score.unverified, calls) == (1.0, None, [None])
    assert math_score(r"\boxed{42}", "42", timeout_s=7).reward == 1.0  # the main thread
    assert calls == [None, 7]  # math_verify times itself there

    def boom(*args, **kwargs):
        raise RuntimeError("sympy exploded")

    monkeypatch.setattr(math_verify, "verify", boom)
    score = _in_a_worker_thread(lambda: math_score(r"\boxed{42}", "42", timeout_s=60))
    assert score.reward == 0.0 and score.unverified is None
    assert score.error == "math_verify failed: RuntimeError: sympy exploded"


def test_math_score_survives_verifier_crash(monkeypatch):
    import math_verify

    def boom(*args, **kwargs):
        raise RuntimeError("sympy exploded")

    monkeypatch.setattr(math_verify, "verify", boom)
    score = math_score(r"\boxed{42}", "42")
    assert (score.reward, score.format_ok, score.parsed) == (0.0, True, "42")
    assert "sympy exploded" in score.error


def test_math_task_scores_dicts_and_refuses_generation():
    task = get_task("math", max_response_len=1024)
    assert isinstance(task, MathTask) and task.max_response_len == 1024
    assert task.reward({"prompt": "q", "answer": "7"}, r"so \boxed{7}") == 1.0
    assert task.reward(Example("q", "7"), r"so \boxed{8}") == 0.0
    with pytest.raises(NotImplementedError, match="load_math_file"):
        task.make_example(None)


# ---------------------------------------------------------------------------------------
# Loaders


def test_gsm8k_jsonl(tmp_path):
    path = write_jsonl(
        tmp_path / "gsm8k.jsonl",
        [
            {"question": "Tom has 3 apples...", "answer": "3 + 4 = <<3+4=7>>7\n#### 7"},
            "",  # Blank lines are skipped.
            {"question": "Big?", "answer": "so\n#### 1,234"},
        ],
    )
    examples = load_math_file(path, "gsm8k")
    assert [e.answer for e in examples] == ["7", "1234"]
    assert examples[0].prompt == f"Tom has 3 apples...\n{DEFAULT_INSTRUCTION}"
    assert examples[1].meta["line"] == 3 and examples[1].meta["format"] == "gsm8k"
    assert examples[0].meta["messages"] == [{"role": "user", "content": examples[0].prompt}]
    assert load_math_file(path, "auto") == examples
    assert len(load_math_file(path, "gsm8k", limit=1)) == 1


def test_math_and_aime_jsonl(tmp_path):
    math_path = write_jsonl(
        tmp_path / "math.jsonl",
        [
            {"problem": "Half of one?", "solution": r"It is $\boxed{\frac{1}{2}}$."},
            {"problem": "P", "solution": "no box", "answer": "5"},  # MATH-500 style.
        ],
    )
    assert [e.answer for e in load_math_file(math_path, "math")] == [r"\frac{1}{2}", "5"]
    aime_path = write_jsonl(
        tmp_path / "aime.jsonl",
        [{"problem": "AIME 1", "answer": 204}, {"question": "AIME 2", "answer": "033"}],
    )
    aime = load_math_file(aime_path, "aime", instruction="", system="Be careful.")
    assert [e.answer for e in aime] == ["204", "033"]
    assert aime[1].meta["messages"] == [
        {"role": "system", "content": "Be careful."},
        {"role": "user", "content": "AIME 2"},
    ]
    assert aime[1].prompt == "Be careful.\n\nAIME 2"


def dapo_record(question, truth):
    return {
        "data_source": "math_dapo",
        "prompt": [{"role": "user", "content": f"Solve: {question}\n\nAnswer: $Answer"}],
        "ability": "MATH",
        "reward_model": {"ground_truth": truth, "style": "rule"},
        "extra_info": {"index": "x"},
    }


def test_dapo_parquet_and_chat_template(tmp_path):
    path = tmp_path / "dapo.parquet"
    pq.write_table(pa.Table.from_pylist([dapo_record("1+1", "2"), dapo_record("2+2", "4")]), path)
    tok = tiny_chat_tokenizer(tmp_path / "tok")
    examples = load_math_file(path, "dapo", tokenizer=tok)
    assert [e.answer for e in examples] == ["2", "4"]
    assert examples[0].prompt == (
        "<|im_start|>user\nSolve: 1+1\n\nAnswer: $Answer<|im_end|>\n<|im_start|>assistant\n"
    )
    assert examples[1].meta == {
        "messages": [{"role": "user", "content": "Solve: 2+2\n\nAnswer: $Answer"}],
        "format": "dapo",
        "line": 2,
    }
    assert load_math_file(path) == load_math_file(path, "dapo")  # auto-detected
    ids = tok.encode(examples[0].prompt)
    assert ids[0] == tok._tok.token_to_id("<|im_start|>")


def test_gsm8k_prompt_through_chat_template(tmp_path):
    path = write_jsonl(tmp_path / "g.jsonl", [{"question": "Q?", "answer": "#### 3"}])
    tok = tiny_chat_tokenizer(tmp_path / "tok")
    (example,) = load_math_file(path, "gsm8k", tokenizer=tok)
    assert example.prompt == (
        f"<|im_start|>user\nQ?\n{DEFAULT_INSTRUCTION}<|im_end|>\n<|im_start|>assistant\n"
    )


@pytest.mark.parametrize(
    "fmt,lines,where,what",
    [
        ("gsm8k", ['{"question": "a", "answer": "#### 1"}', "{not json"], ":2:", "invalid JSON"),
        (
            "gsm8k",
            ['{"question": "a", "answer": "#### 1"}', '{"answer": "#### 2"}'],
            ":2:",
            "'question'",
        ),
        ("gsm8k", ['{"question": "a", "answer": "no marker"}'], ":1:", "####"),
        ("math", ["", "", '{"problem": "p", "solution": "no box"}'], ":3:", "boxed"),
        ("aime", ['{"problem": "p"}'], ":1:", "missing field 'answer'"),
        ("aime", ['{"problem": "", "answer": 3}'], ":1:", "non-empty string"),
        ("dapo", ['{"prompt": [], "reward_model": {"ground_truth": "1"}}'], ":1:", "'prompt'"),
        ("dapo", ['{"prompt": [{"role": "user", "content": "q"}]}'], ":1:", "'reward_model'"),
        (
            "dapo",
            ['{"prompt": [{"role": "user", "content": "q"}], "reward_model": {}}'],
            ":1:",
            "'ground_truth'",
        ),
        (
            "auto",
            ['{"foo": 1}'],
            ":1:",
            "cannot tell the layout from fields ['foo']; set task.format",
        ),
        ("auto", ["[1, 2]"], ":1:", "expected a JSON object"),
    ],
)
def test_malformed_lines_name_file_and_line(tmp_path, fmt, lines, where, what):
    path = tmp_path / "bad.jsonl"
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(ValueError) as info:
        load_math_file(path, fmt)
    message = str(info.value)
    assert message.startswith(f"{path}{where}") and what in message


def test_malformed_parquet_row_is_named(tmp_path):
    path = tmp_path / "bad.parquet"
    rows = [{"question": "a", "answer": "#### 1"}, {"question": None, "answer": "#### 2"}]
    pq.write_table(pa.Table.from_pylist(rows), path)
    with pytest.raises(ValueError, match=r"bad\.parquet:2: missing field 'question'"):
        load_math_file(path, "gsm8k")


def test_unknown_format(tmp_path):
    with pytest.raises(ValueError, match="unknown math data format 'svamp'"):
        load_math_file(tmp_path / "x.jsonl", "svamp")


# ---------------------------------------------------------------------------------------
# Prompt budget


def write_questions(path, questions):
    """A GSM8K file with one question per line (answers all 1)."""
    return write_jsonl(path, [{"question": q, "answer": "#### 1"} for q in questions])


# With instruction="" a k-word question renders to
# "<|im_start|>user\n{question}<|im_end|>\n<|im_start|>assistant\n": the tiny tokenizer
# makes that <|im_start|> user w1 .. wk <|im_end|> <|im_start|> assistant = k + 5 tokens.
QUESTIONS = ["a", "a b c d", "a b", "a b c d e"]  # lines 1-4: 6, 9, 7, 10 tokens


def test_prompt_over_budget_names_file_line_tokens_and_limit(tmp_path):
    path = write_questions(tmp_path / "g.jsonl", QUESTIONS)
    tok = tiny_chat_tokenizer(tmp_path / "tok")
    with pytest.raises(ValueError) as info:
        load_math_file(path, "gsm8k", tokenizer=tok, instruction="", max_prompt_tokens=7)
    assert str(info.value).startswith(
        f"{path}:2: prompt has 9 tokens, over the limit of 7 (BOS included); 2 prompt(s) of "
        "this file are over it (lines 2, 4)."
    )
    # At the limit is within it: 10 tokens admit every prompt.
    examples = load_math_file(path, "gsm8k", tokenizer=tok, instruction="", max_prompt_tokens=10)
    assert [e.meta["line"] for e in examples] == [1, 2, 3, 4]
    assert examples == load_math_file(path, "gsm8k", tokenizer=tok, instruction="")


def test_prompt_budget_counts_bos(tmp_path):
    path = write_questions(tmp_path / "g.jsonl", QUESTIONS)
    tok = tiny_chat_tokenizer(tmp_path / "tok", bos=True)  # 7, 10, 8, 11 tokens
    with pytest.raises(ValueError, match=r"g\.jsonl:2: prompt has 10 tokens, over the limit of 8"):
        load_math_file(path, "gsm8k", tokenizer=tok, instruction="", max_prompt_tokens=8)
    examples = load_math_file(path, "gsm8k", tokenizer=tok, instruction="", max_prompt_tokens=11)
    assert len(examples) == 4


def test_drop_long_prompts_keeps_the_rest_and_logs_the_count(tmp_path, caplog):
    path = write_questions(tmp_path / "g.jsonl", QUESTIONS)
    tok = tiny_chat_tokenizer(tmp_path / "tok")
    load = dict(tokenizer=tok, instruction="", max_prompt_tokens=7, drop_long_prompts=True)
    with caplog.at_level(logging.WARNING, logger="rl_batch.tasks.math_data"):
        examples = load_math_file(path, "gsm8k", **load)
    assert [e.meta["line"] for e in examples] == [1, 3]
    assert [e.prompt for e in examples] == [
        "<|im_start|>user\na<|im_end|>\n<|im_start|>assistant\n",
        "<|im_start|>user\na b<|im_end|>\n<|im_start|>assistant\n",
    ]
    assert f"{path}: dropped 2 of 4 prompts over 7 tokens (lines 2, 4)" in caplog.text
    # limit counts the examples kept.
    assert [e.meta["line"] for e in load_math_file(path, "gsm8k", limit=2, **load)] == [1, 3]
    # Nothing over the budget: nothing dropped, nothing logged.
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="rl_batch.tasks.math_data"):
        assert len(load_math_file(path, "gsm8k", **{**load, "max_prompt_tokens": 10})) == 4
    assert caplog.text == ""


def test_prompt_budget_lists_at_most_five_lines(tmp_path):
    path = write_questions(tmp_path / "g.jsonl", ["a b c"] * 7)  # 8 tokens each
    tok = tiny_chat_tokenizer(tmp_path / "tok")
    with pytest.raises(
        ValueError, match=r"7 prompt\(s\) of this file are over it \(lines 1, 2, 3, 4, 5, \.\.\.\)"
    ):
        load_math_file(path, "gsm8k", tokenizer=tok, instruction="", max_prompt_tokens=7)


def test_prompt_budget_needs_a_tokenizer_and_a_positive_limit(tmp_path):
    path = write_questions(tmp_path / "g.jsonl", QUESTIONS)
    with pytest.raises(ValueError, match="max_prompt_tokens=7 needs the tokenizer"):
        load_math_file(path, "gsm8k", max_prompt_tokens=7)
    tok = tiny_chat_tokenizer(tmp_path / "tok")
    with pytest.raises(ValueError, match="max_prompt_tokens=0: must be >= 1"):
        load_math_file(path, "gsm8k", tokenizer=tok, max_prompt_tokens=0)
