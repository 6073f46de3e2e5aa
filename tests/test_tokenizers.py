"""Tokenizers: the character vocabulary and the Hugging Face wrapper with chat templates."""

import json

import numpy as np
import pytest
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from rl_batch.tasks import get_task
from rl_batch.tokenizers import (
    BOS_ID,
    CHATML,
    EOS_ID,
    PAD_ID,
    CharTokenizer,
    ChatTemplate,
    HFTokenizer,
    encode_prompt,
)
from rl_batch.tokenizers import Tokenizer as TokenizerProtocol

SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]


def make_hf_tokenizer(directory, specials=SPECIALS, config=None):
    """Trains a tiny byte-level BPE and saves tokenizer.json (+ tokenizer_config.json)."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=300,
        special_tokens=list(specials),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    corpus = ["Please reason step by step.", "What is 1+1? The answer is 2.", "user assistant"]
    tok.train_from_iterator(corpus * 5, trainer=trainer)
    directory.mkdir(parents=True, exist_ok=True)
    tok.save(str(directory / "tokenizer.json"))
    if config is not None:
        (directory / "tokenizer_config.json").write_text(json.dumps(config))
    return directory


# ---------------------------------------------------------------------------------------
# CharTokenizer


def test_char_tokenizer_ids_and_roundtrip():
    tok = CharTokenizer()
    assert (tok.pad_id, tok.bos_id, tok.eos_id) == (PAD_ID, BOS_ID, EOS_ID) == (0, 1, 2)
    assert tok.vocab_size <= 64
    # '0' is the first character after the three specials, '+' follows the ten digits.
    assert tok.encode("0+9=") == [3, 13, 12, 19]
    text = "(12+3)*4/5-6=7, a|b>c; x:y_z.\n"
    assert tok.decode(tok.encode(text)) == text
    assert isinstance(tok, TokenizerProtocol)


def test_char_tokenizer_decode_drops_specials_and_checks_range():
    tok = CharTokenizer()
    ids = [BOS_ID, *tok.encode("42"), EOS_ID, PAD_ID, PAD_ID]
    assert tok.decode(ids) == "42"
    assert tok.decode(np.array(ids)) == "42"
    with pytest.raises(ValueError, match="outside the vocabulary"):
        tok.decode([tok.vocab_size])


def test_char_tokenizer_unknown_character_is_named():
    with pytest.raises(ValueError, match=r"'#' at position 2"):
        CharTokenizer().encode("12#4")
    with pytest.raises(ValueError, match="duplicates"):
        CharTokenizer("abca")


def test_encode_prompt_prepends_bos():
    tok = CharTokenizer()
    assert encode_prompt(tok, "1+1=") == [BOS_ID, *tok.encode("1+1=")]


@pytest.mark.parametrize(
    "name,kwargs",
    [
        ("addition", {"n_digits": 4, "scratchpad": True}),
        ("multiplication", {"n_digits": 3, "scratchpad": True}),
        ("countdown", {"n_numbers": 5, "max_number": 50}),
    ],
)
def test_char_vocabulary_covers_every_synthetic_task(name, kwargs):
    tok = CharTokenizer()
    task = get_task(name, **kwargs)
    rng = np.random.default_rng(0)
    for _ in range(200):
        ex = task.make_example(rng)
        assert tok.decode(tok.encode(ex.prompt + ex.answer)) == ex.prompt + ex.answer


# ---------------------------------------------------------------------------------------
# HFTokenizer


def test_hf_tokenizer_defaults_without_config(tmp_path):
    tok = HFTokenizer(make_hf_tokenizer(tmp_path / "tok"))
    # No tokenizer_config.json: EOS/PAD come from the well-known Qwen tokens, no BOS.
    assert tok.eos_id == tok._tok.token_to_id("<|im_end|>")
    assert tok.pad_id == tok._tok.token_to_id("<|endoftext|>")
    assert tok.bos_id is None
    assert tok.vocab_size == tok._tok.get_vocab_size()
    text = "What is 1+1? Zebra!"  # 'Z' was never seen in training: byte-level still works.
    assert tok.decode(tok.encode(text)) == text
    assert encode_prompt(tok, text) == tok.encode(text)
    assert isinstance(tok, TokenizerProtocol)


def test_hf_tokenizer_accepts_file_path_and_rejects_missing(tmp_path):
    directory = make_hf_tokenizer(tmp_path / "tok")
    assert HFTokenizer(directory / "tokenizer.json").eos_id == HFTokenizer(directory).eos_id
    with pytest.raises(FileNotFoundError, match="no tokenizer.json"):
        HFTokenizer(tmp_path / "nowhere")


def test_hf_tokenizer_chatml_template_and_special_tokens(tmp_path):
    tok = HFTokenizer(make_hf_tokenizer(tmp_path / "tok"))
    assert tok.chat_template is CHATML
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "1+1?"}]
    text = tok.apply_chat_template(messages)
    assert text == (
        "<|im_start|>system\nBe brief.<|im_end|>\n"
        "<|im_start|>user\n1+1?<|im_end|>\n"
        "<|im_start|>assistant\n"
    )
    assert tok.apply_chat_template(messages, add_generation_prompt=False).endswith("<|im_end|>\n")
    ids = tok.encode(text)
    start = tok._tok.token_to_id("<|im_start|>")
    assert ids[0] == start and ids.count(start) == 3  # Special strings map to single ids.
    assert ids.count(tok.eos_id) == 2
    # Special tokens are dropped on decode unless asked for.
    assert "<|im_start|>" not in tok.decode(ids)
    assert tok.decode(ids, skip_special_tokens=False) == text


def test_hf_tokenizer_bad_messages_are_named(tmp_path):
    tok = HFTokenizer(make_hf_tokenizer(tmp_path / "tok"))
    with pytest.raises(ValueError, match="chat message 1 needs a string 'content'"):
        tok.apply_chat_template([{"role": "user", "content": "a"}, {"role": "user"}])


def test_hf_tokenizer_uses_config_tokens_and_jinja_template(tmp_path):
    template = (
        "{% for m in messages %}[{{ m['role'] }}]{{ m['content'] }}{{ eos_token }}{% endfor %}"
        "{% if add_generation_prompt %}[assistant]{% endif %}"
    )
    config = {
        "eos_token": {"content": "<|endoftext|>"},
        "pad_token": "<|im_end|>",
        "bos_token": None,
        "chat_template": template,
    }
    tok = HFTokenizer(make_hf_tokenizer(tmp_path / "tok", config=config))
    assert tok.eos_id == tok._tok.token_to_id("<|endoftext|>")
    assert tok.pad_id == tok._tok.token_to_id("<|im_end|>")
    text = tok.apply_chat_template([{"role": "user", "content": "hi"}])
    assert text == "[user]hi<|endoftext|>[assistant]"


def test_hf_tokenizer_explicit_template_wins_over_config(tmp_path):
    config = {"chat_template": "{{ raise_exception('should not render') }}"}
    plain = ChatTemplate(message="{role}: {content}\n", generation_prompt="assistant:")
    tok = HFTokenizer(make_hf_tokenizer(tmp_path / "tok", config=config), chat_template=plain)
    assert tok.apply_chat_template([{"role": "user", "content": "x"}]) == "user: x\nassistant:"
    # The config template itself raises through raise_exception, as HF templates do.
    jinja_tok = HFTokenizer(tmp_path / "tok")
    with pytest.raises(Exception, match="should not render"):
        jinja_tok.apply_chat_template([{"role": "user", "content": "x"}])


def test_chat_template_default_system():
    template = ChatTemplate(
        message="<{role}>{content}", generation_prompt="<a>", default_system="S"
    )
    assert template.render([{"role": "user", "content": "q"}]) == "<system>S<user>q<a>"
    system_given = [{"role": "system", "content": "T"}, {"role": "user", "content": "q"}]
    assert template.render(system_given, False) == "<system>T<user>q"


def test_hf_tokenizer_config_token_missing_from_vocab(tmp_path):
    directory = make_hf_tokenizer(tmp_path / "tok", config={"eos_token": "</s>"})
    with pytest.raises(ValueError, match="eos_token '</s>'"):
        HFTokenizer(directory)


def test_hf_tokenizer_without_any_eos(tmp_path):
    directory = make_hf_tokenizer(tmp_path / "tok", specials=["<unk>"])
    with pytest.raises(ValueError, match="cannot find an EOS token"):
        HFTokenizer(directory)
