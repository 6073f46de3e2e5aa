"""Tokenizers behind one small interface.

Two implementations:

- `CharTokenizer`: a fixed character vocabulary for the synthetic tasks (digits,
  arithmetic operators, punctuation, lowercase letters). Ids 0, 1, 2 are PAD, BOS, EOS.
- `HFTokenizer`: wraps a Hugging Face `tokenizers.Tokenizer` loaded from a local
  ``tokenizer.json`` (no network), with a chat template for real math prompts.

Every tokenizer exposes ``encode(text) -> list[int]``, ``decode(ids) -> str``,
``vocab_size``, ``bos_id`` (``None`` when the model family uses no BOS token, e.g. Qwen),
``eos_id`` and ``pad_id``. Use `encode_prompt` to get the ids a sampler should prefill:
one BOS when the tokenizer has one (not doubled when the chat template renders it).
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Mapping, Sequence
from typing import Any, Protocol, runtime_checkable

PAD_ID = 0
BOS_ID = 1
EOS_ID = 2

# Characters of the synthetic tasks' vocabulary, in id order after the three specials.
# Digits and operators come first so ids stay stable if letters are ever trimmed.
DEFAULT_CHARS = "0123456789+-*/()= ,.;:|>_\n" + "abcdefghijklmnopqrstuvwxyz"


@runtime_checkable
class Tokenizer(Protocol):
    """What the sampler, the tasks and the data pipeline need from a tokenizer."""

    @property
    def vocab_size(self) -> int: ...

    @property
    def bos_id(self) -> int | None: ...

    @property
    def eos_id(self) -> int: ...

    @property
    def stop_ids(self) -> tuple[int, ...]: ...

    @property
    def pad_id(self) -> int: ...

    def encode(self, text: str) -> list[int]: ...

    def decode(self, ids: Sequence[int]) -> str: ...


def encode_prompt(tokenizer: Tokenizer, text: str) -> list[int]:
    """Ids to prefill for a prompt: exactly one BOS (when the tokenizer has one), then the text.

    A chat template may already render the BOS token (Llama-3's starts with
    ``{{ bos_token }}``); `Tokenizer.encode` maps that string to ``bos_id`` and adds no
    specials of its own, so BOS is prepended only when the encoded text does not already
    start with it. Tokenizers without BOS (Qwen) get none.

    Args:
        tokenizer: any `Tokenizer`.
        text: the prompt text (for chat models, already rendered through the chat template).

    Returns:
        The token ids, without EOS.
    """
    ids = tokenizer.encode(text)
    bos = tokenizer.bos_id
    if bos is None or ids[:1] == [bos]:
        return ids
    return [bos, *ids]


class CharTokenizer:
    """One token per character over a fixed vocabulary; ids 0/1/2 are PAD/BOS/EOS.

    Args:
        chars: the characters of the vocabulary, in id order (after the specials).
    """

    def __init__(self, chars: str = DEFAULT_CHARS):
        if len(set(chars)) != len(chars):
            dup = sorted({c for c in chars if chars.count(c) > 1})
            raise ValueError(f"CharTokenizer chars contain duplicates: {dup!r}")
        self.chars = chars
        self._char_to_id = {c: i + 3 for i, c in enumerate(chars)}

    @property
    def vocab_size(self) -> int:
        return len(self.chars) + 3

    @property
    def bos_id(self) -> int:
        return BOS_ID

    @property
    def eos_id(self) -> int:
        return EOS_ID

    @property
    def stop_ids(self) -> tuple[int, ...]:
        """Ids that end a response: EOS only."""
        return (self.eos_id,)

    @property
    def pad_id(self) -> int:
        return PAD_ID

    def encode(self, text: str) -> list[int]:
        """Maps each character to its id; raises ValueError naming an unknown character."""
        try:
            return [self._char_to_id[c] for c in text]
        except KeyError:
            pos = next(i for i, c in enumerate(text) if c not in self._char_to_id)
            raise ValueError(
                f"character {text[pos]!r} at position {pos} of {text!r} is not in the "
                f"CharTokenizer vocabulary {self.chars!r}"
            ) from None

    def decode(self, ids: Sequence[int]) -> str:
        """Maps ids back to text, dropping PAD/BOS/EOS; raises ValueError on ids out of range."""
        out = []
        for i in ids:
            i = int(i)
            if i in (PAD_ID, BOS_ID, EOS_ID):
                continue
            if not 3 <= i < self.vocab_size:
                raise ValueError(f"token id {i} is outside the vocabulary [0, {self.vocab_size})")
            out.append(self.chars[i - 3])
        return "".join(out)


# ---------------------------------------------------------------------------------------
# Hugging Face tokenizer wrapper with a chat template.


@dataclasses.dataclass(frozen=True, kw_only=True)
class ChatTemplate:
    """A chat template as data: each message is ``message.format(role=..., content=...)``.

    Attributes:
        message: format string of one message.
        generation_prompt: text appended when the assistant should answer next.
        default_system: system message inserted when the conversation has none.
    """

    message: str
    generation_prompt: str
    default_system: str | None = None

    def render(
        self, messages: Sequence[Mapping[str, str]], add_generation_prompt: bool = True
    ) -> str:
        msgs = list(messages)
        if self.default_system is not None and (not msgs or msgs[0]["role"] != "system"):
            msgs.insert(0, {"role": "system", "content": self.default_system})
        text = "".join(self.message.format(role=m["role"], content=m["content"]) for m in msgs)
        return text + (self.generation_prompt if add_generation_prompt else "")


# Qwen / ChatML layout (no default system message, as in Qwen3).
CHATML = ChatTemplate(
    message="<|im_start|>{role}\n{content}<|im_end|>\n",
    generation_prompt="<|im_start|>assistant\n",
)

_KNOWN_EOS = ("<|im_end|>", "<|endoftext|>", "</s>", "<eos>", "<|end_of_text|>", "<|eot_id|>")
_KNOWN_BOS = ("<s>", "<bos>", "<|begin_of_text|>")
_KNOWN_PAD = ("<pad>", "<|pad|>", "[PAD]", "<|endoftext|>")


def _token_content(value) -> str | None:
    """tokenizer_config.json stores special tokens as strings or {"content": ...} dicts."""
    if isinstance(value, Mapping):
        return value.get("content")
    return value if isinstance(value, str) else None


def _check_messages(messages: Sequence[Mapping[str, str]]) -> None:
    for i, m in enumerate(messages):
        if not isinstance(m, Mapping) or not isinstance(m.get("role"), str):
            raise ValueError(f"chat message {i} needs a string 'role': {m!r}")
        if not isinstance(m.get("content"), str):
            raise ValueError(f"chat message {i} needs a string 'content': {m!r}")


# Variables of a jinja chat template that `HFTokenizer.apply_chat_template` sets itself.
_RESERVED_TEMPLATE_VARS = frozenset({"messages", "add_generation_prompt", "bos_token", "eos_token"})


def _render_jinja(template: str, messages, add_generation_prompt: bool, **extra) -> str:
    """Renders a Hugging Face jinja chat template the way transformers does."""
    from datetime import datetime

    import jinja2
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"]
    )
    env.filters["tojson"] = lambda x, indent=None, ensure_ascii=False, **_: json.dumps(
        x, indent=indent, ensure_ascii=ensure_ascii
    )
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    return env.from_string(template).render(
        messages=list(messages), add_generation_prompt=add_generation_prompt, **extra
    )


class HFTokenizer:
    """A local Hugging Face ``tokenizer.json`` behind the `Tokenizer` interface.

    Special tokens come from ``tokenizer_config.json`` beside the file when present
    (``bos_token``, ``eos_token``, ``pad_token``), else from well-known token strings in the
    vocabulary; ``"bos_token": null`` there means no BOS. The chat template is, in order
    of preference: the ``chat_template`` argument; the jinja template in
    ``tokenizer_config.json`` / ``chat_template.jinja`` (rendered with jinja2, a core
    dependency); the ChatML layout `CHATML` when the checkpoint has no template.

    Args:
        path: ``tokenizer.json`` or the directory that holds it.
        chat_template: a `ChatTemplate`, a jinja template string, or None (see above).
    """

    def __init__(self, path: str | os.PathLike, chat_template: ChatTemplate | str | None = None):
        from tokenizers import Tokenizer as _HFTok

        path = os.fspath(path)
        file = os.path.join(path, "tokenizer.json") if os.path.isdir(path) else path
        if not os.path.isfile(file):
            raise FileNotFoundError(f"no tokenizer.json at {file}")
        self.path = file
        try:
            self._tok = _HFTok.from_file(file)
        except Exception as e:  # the tokenizers library raises a bare Exception
            raise ValueError(f"{file}: not a readable tokenizer.json ({e})") from None
        config = self._read_config(os.path.dirname(file))

        self._eos_id = self._resolve(config.get("eos_token"), _KNOWN_EOS, "eos")
        if self._eos_id is None:
            raise ValueError(
                f"cannot find an EOS token in {file}: set eos_token in tokenizer_config.json "
                f"or add one of {_KNOWN_EOS}"
            )
        if "bos_token" in config and config["bos_token"] is None:
            self._bos_id = None  # the config says the family has no BOS (Qwen)
        else:
            self._bos_id = self._resolve(config.get("bos_token"), _KNOWN_BOS, "bos")
        pad = self._resolve(config.get("pad_token"), _KNOWN_PAD, "pad")
        self._pad_id = self._eos_id if pad is None else pad
        self._eos_token = self._tok.id_to_token(self._eos_id)
        self._stop_ids = self._generation_stop_ids(os.path.dirname(file))
        self._bos_token = None if self._bos_id is None else self._tok.id_to_token(self._bos_id)

        if chat_template is None:
            jinja_template = self._config_template(config, os.path.dirname(file))
            chat_template = jinja_template
        self.chat_template: ChatTemplate | str = chat_template or CHATML

    @staticmethod
    def _read_config(directory: str) -> dict:
        cfg_file = os.path.join(directory, "tokenizer_config.json")
        if not os.path.isfile(cfg_file):
            return {}
        with open(cfg_file) as f:
            try:
                return json.load(f)
            except json.JSONDecodeError as e:
                raise ValueError(f"{cfg_file}: invalid JSON ({e})") from e

    @staticmethod
    def _config_template(config: dict, directory: str) -> str | None:
        template = config.get("chat_template")
        if isinstance(template, list):  # [{"name": "default", "template": ...}, ...]
            named = {t.get("name"): t.get("template") for t in template}
            template = named.get("default")
        if template is None:
            jinja_file = os.path.join(directory, "chat_template.jinja")
            if os.path.isfile(jinja_file):
                with open(jinja_file) as f:
                    template = f.read()
        return template

    def _resolve(self, configured, fallbacks: Sequence[str], what: str) -> int | None:
        content = _token_content(configured)
        if content is not None:
            token_id = self._tok.token_to_id(content)
            if token_id is None:
                raise ValueError(
                    f"{what}_token {content!r} from tokenizer_config.json is not in {self.path}"
                )
            return token_id
        for token in fallbacks:
            token_id = self._tok.token_to_id(token)
            if token_id is not None:
                return token_id
        return None

    @property
    def vocab_size(self) -> int:
        return self._tok.get_vocab_size(with_added_tokens=True)

    @property
    def bos_id(self) -> int | None:
        return self._bos_id

    @property
    def eos_id(self) -> int:
        return self._eos_id

    @property
    def stop_ids(self) -> tuple[int, ...]:
        """Ids that end a response: EOS, then every ``eos_token_id`` of the checkpoint's
        ``generation_config.json`` (Qwen chat models list ``<|im_end|>`` and
        ``<|endoftext|>``) that is in the vocabulary."""
        return self._stop_ids

    def _generation_stop_ids(self, directory: str) -> tuple[int, ...]:
        path = os.path.join(directory, "generation_config.json")
        listed = []
        if os.path.isfile(path):
            try:
                with open(path) as f:
                    value = json.load(f).get("eos_token_id")
            except (OSError, ValueError) as e:
                raise ValueError(f"{path}: unreadable generation config ({e})") from e
            listed = [value] if isinstance(value, int) else list(value or [])
        vocab = self._tok.get_vocab_size()
        ids = [self._eos_id] + [int(i) for i in listed if isinstance(i, int) and 0 <= i < vocab]
        return tuple(dict.fromkeys(ids))

    @property
    def pad_id(self) -> int:
        return self._pad_id

    def encode(self, text: str) -> list[int]:
        """Token ids of ``text``; special-token strings in it (e.g. ``<|im_start|>``) map to
        their ids, and no BOS/EOS is added."""
        return self._tok.encode(text, add_special_tokens=False).ids

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        """Text of ``ids``; special tokens are dropped unless ``skip_special_tokens=False``."""
        return self._tok.decode([int(i) for i in ids], skip_special_tokens=skip_special_tokens)

    def apply_chat_template(
        self,
        messages: Sequence[Mapping[str, str]],
        add_generation_prompt: bool = True,
        chat_template_kwargs: Mapping[str, Any] | None = None,
    ) -> str:
        """Renders a conversation to prompt text.

        Args:
            messages: ``[{"role": "system"|"user"|"assistant", "content": str}, ...]``.
            add_generation_prompt: append the assistant header so the model answers next.
            chat_template_kwargs: extra variables of a jinja template, as transformers'
                ``apply_chat_template(**kwargs)`` passes them (e.g. Qwen3's
                ``{"enable_thinking": False}``).

        Returns:
            The prompt text (encode it with `encode_prompt`). A jinja template's
            ``{{ bos_token }}`` renders the BOS string, which `encode_prompt` keeps as the
            single BOS.

        Raises:
            ValueError: ``chat_template_kwargs`` with a `ChatTemplate` (no variables), or
                naming a variable the renderer sets itself.
        """
        _check_messages(messages)
        extra = dict(chat_template_kwargs or {})
        if isinstance(self.chat_template, ChatTemplate):
            if extra:
                raise ValueError(
                    f"chat_template_kwargs {sorted(extra)} need a jinja chat template; "
                    f"{self.path} has none (the ChatML layout takes no variables)"
                )
            return self.chat_template.render(messages, add_generation_prompt)
        reserved = sorted(extra.keys() & _RESERVED_TEMPLATE_VARS)
        if reserved:
            raise ValueError(
                f"chat_template_kwargs may not set {reserved}: the renderer sets "
                f"{sorted(_RESERVED_TEMPLATE_VARS)}"
            )
        return _render_jinja(
            self.chat_template,
            messages,
            add_generation_prompt,
            bos_token=self._bos_token or "",
            eos_token=self._eos_token,
            **extra,
        )
