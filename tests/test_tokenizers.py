"""Tokenizers: the character vocabulary and the Hugging Face wrapper with chat templates."""

import json

import numpy as np
import pytest
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

from rl_batch.tasks import get_task, load_math_file
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


def test_hf_tokenizer_null_bos_in_config_means_no_bos(tmp_path):
    # "<s>" is in the vocabulary, but the config says the family has no BOS.
    config = {"eos_token": "<|endoftext|>", "bos_token": None}
    specials = SPECIALS + ["<s>"]
    tok = HFTokenizer(make_hf_tokenizer(tmp_path / "tok", specials=specials, config=config))
    assert tok.bos_id is None
    assert encode_prompt(tok, "hi") == tok.encode("hi")
    # Without the config entry the well-known "<s>" is taken as BOS.
    del config["bos_token"]
    tok = HFTokenizer(make_hf_tokenizer(tmp_path / "tok2", specials=specials, config=config))
    assert tok.bos_id == tok._tok.token_to_id("<s>")
    assert encode_prompt(tok, "hi") == [tok.bos_id] + tok.encode("hi")


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


def test_stop_ids_add_the_generation_configs_eos_ids(tmp_path):
    directory = make_hf_tokenizer(tmp_path / "tok", config={"eos_token": "<|im_end|>"})
    tok = HFTokenizer(directory)
    im_end, endoftext = tok.eos_id, tok._tok.token_to_id("<|endoftext|>")
    assert tok.stop_ids == (im_end,)  # no generation_config.json: EOS alone
    # Qwen chat checkpoints list both; an id outside the vocabulary is left out.
    (directory / "generation_config.json").write_text(
        json.dumps({"eos_token_id": [endoftext, im_end, 10**6]})
    )
    assert HFTokenizer(directory).stop_ids == (im_end, endoftext)
    (directory / "generation_config.json").write_text(json.dumps({"eos_token_id": endoftext}))
    assert HFTokenizer(directory).stop_ids == (im_end, endoftext)
    (directory / "generation_config.json").write_text("{broken")
    with pytest.raises(ValueError, match="generation_config.json: unreadable generation config"):
        HFTokenizer(directory)
    assert CharTokenizer().stop_ids == (CharTokenizer().eos_id,)


def test_hf_tokenizer_without_any_eos(tmp_path):
    directory = make_hf_tokenizer(tmp_path / "tok", specials=["<unk>"])
    with pytest.raises(ValueError, match="cannot find an EOS token"):
        HFTokenizer(directory)


# ---------------------------------------------------------------------------------------
# BOS: exactly one per prompt, whether or not the chat template renders it.

LLAMA3_SPECIALS = ["<|begin_of_text|>", "<|eot_id|>", "<|start_header_id|>", "<|end_header_id|>"]
# The Llama-3 chat layout without its leading {{ bos_token }}.
LLAMA3_TURNS = (
    "{% for m in messages %}"
    "<|start_header_id|>{{ m['role'] }}<|end_header_id|>\n\n{{ m['content'] }}<|eot_id|>"
    "{% endfor %}{% if add_generation_prompt %}"
    "<|start_header_id|>assistant<|end_header_id|>\n\n{% endif %}"
)
LLAMA3_TEMPLATE = "{{ bos_token }}" + LLAMA3_TURNS


def make_llama3_tokenizer(directory, chat_template=LLAMA3_TEMPLATE):
    """A Llama-3-style tokenizer: BOS ``<|begin_of_text|>``, and, as in Llama-3's
    tokenizer.json, a TemplateProcessing post-processor that prepends BOS when
    ``add_special_tokens`` is on."""
    config = {"bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>"}
    if chat_template is not None:
        config["chat_template"] = chat_template
    make_hf_tokenizer(directory, specials=LLAMA3_SPECIALS, config=config)
    tok = Tokenizer.from_file(str(directory / "tokenizer.json"))
    bos = tok.token_to_id("<|begin_of_text|>")
    tok.post_processor = processors.TemplateProcessing(
        single="<|begin_of_text|> $A", special_tokens=[("<|begin_of_text|>", bos)]
    )
    tok.save(str(directory / "tokenizer.json"))
    return HFTokenizer(directory)


def test_llama3_template_bos_is_not_doubled(tmp_path):
    tok = make_llama3_tokenizer(tmp_path / "tok")
    bos = tok._tok.token_to_id("<|begin_of_text|>")
    assert tok.bos_id == bos
    text = tok.apply_chat_template([{"role": "user", "content": "What is 1+1?"}])
    assert text.startswith("<|begin_of_text|><|start_header_id|>user")
    ids = encode_prompt(tok, text)
    assert ids[0] == bos and ids.count(bos) == 1
    assert ids[1] == tok._tok.token_to_id("<|start_header_id|>")
    # encode adds no specials of its own: the post-processor would prepend a second BOS.
    assert tok._tok.encode(text).ids[:2] == [bos, bos]
    assert ids == tok.encode(text) == tok._tok.encode(text, add_special_tokens=False).ids
    assert tok.encode("What is 1+1?")[0] != bos


def test_template_without_bos_token_gets_one_bos_prepended(tmp_path):
    # Same model (it has a BOS), but the template does not render {{ bos_token }}.
    tok = make_llama3_tokenizer(tmp_path / "tok", chat_template=LLAMA3_TURNS)
    text = tok.apply_chat_template([{"role": "user", "content": "What is 1+1?"}])
    assert text.startswith("<|start_header_id|>user")
    ids = encode_prompt(tok, text)
    assert ids == [tok.bos_id, *tok.encode(text)]
    assert ids.count(tok.bos_id) == 1
    # Plain text (no template at all) also gets exactly one BOS.
    assert encode_prompt(tok, "What is 1+1?") == [tok.bos_id, *tok.encode("What is 1+1?")]


def test_qwen_style_template_gets_no_bos(tmp_path):
    # No BOS token in the vocabulary, as Qwen: the ChatML layout, and a jinja template that
    # does mention {{ bos_token }} (rendered as the empty string).
    specials = ["<|eot_id|>", "<|start_header_id|>", "<|end_header_id|>"]
    config = {"eos_token": "<|eot_id|>", "chat_template": LLAMA3_TEMPLATE}
    for tok in (
        HFTokenizer(make_hf_tokenizer(tmp_path / "chatml")),
        HFTokenizer(make_hf_tokenizer(tmp_path / "jinja", specials, config)),
    ):
        assert tok.bos_id is None
        text = tok.apply_chat_template([{"role": "user", "content": "What is 1+1?"}])
        assert text.startswith(("<|im_start|>", "<|start_header_id|>"))
        assert encode_prompt(tok, text) == tok.encode(text)


def test_char_tokenizer_prompt_gets_one_bos():
    # The character vocabulary never encodes text to BOS, so BOS is always prepended.
    tok = CharTokenizer()
    ids = encode_prompt(tok, "1+1=")
    assert ids[0] == BOS_ID and ids.count(BOS_ID) == 1


def test_math_prompt_budget_counts_one_bos_with_llama3_template(tmp_path):
    tok = make_llama3_tokenizer(tmp_path / "tok")
    path = tmp_path / "q.jsonl"
    path.write_text(json.dumps({"question": "What is 1+1?", "answer": "#### 2"}) + "\n")
    text = tok.apply_chat_template([{"role": "user", "content": "What is 1+1?"}])
    n = len(tok.encode(text))  # The template's own BOS is the only one.
    assert len(encode_prompt(tok, text)) == n
    load = dict(fmt="gsm8k", tokenizer=tok, instruction="")
    [example] = load_math_file(path, max_prompt_tokens=n, **load)
    assert example.prompt == text
    with pytest.raises(ValueError, match=f"prompt has {n} tokens, over the limit of {n - 1}"):
        load_math_file(path, max_prompt_tokens=n - 1, **load)


def test_chat_template_kwargs_reach_the_jinja_template(tmp_path):
    template = (
        "{% for m in messages %}[{{ m.role }}]{{ m.content }}{% endfor %}"
        "{% if add_generation_prompt %}[assistant]"
        "{% if enable_thinking is defined and not enable_thinking %}<think></think>{% endif %}"
        "{% endif %}"
    )
    tok = HFTokenizer(make_hf_tokenizer(tmp_path / "tok", config={"chat_template": template}))
    messages = [{"role": "user", "content": "hi"}]
    assert tok.apply_chat_template(messages) == "[user]hi[assistant]"
    off = tok.apply_chat_template(messages, chat_template_kwargs={"enable_thinking": False})
    assert off == "[user]hi[assistant]<think></think>"
    on = tok.apply_chat_template(messages, chat_template_kwargs={"enable_thinking": True})
    assert on == "[user]hi[assistant]"
    with pytest.raises(ValueError, match=r"may not set \['bos_token'\]"):
        tok.apply_chat_template(messages, chat_template_kwargs={"bos_token": "x"})
    chatml = HFTokenizer(make_hf_tokenizer(tmp_path / "chatml"))
    with pytest.raises(ValueError, match=r"\['enable_thinking'\] need a jinja chat template"):
        chatml.apply_chat_template(messages, chat_template_kwargs={"enable_thinking": False})
