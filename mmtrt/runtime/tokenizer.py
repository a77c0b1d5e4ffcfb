"""The bundle's tokenizer without transformers: `tokenizers` reads tokenizer.json, jinja2 renders the chat template.

Importing transformers (and the torch it pulls in) costs about half a GiB of RSS, so the runtime repeats the
parts of its fast tokenizer it uses: encode with or without the post-processor's special tokens, decode, and
`apply_chat_template` rendered in the sandbox and with the globals transformers gives templates.
"""

from __future__ import annotations

import json
from datetime import datetime
from functools import lru_cache
from pathlib import Path
from typing import Any

import jinja2
from jinja2.ext import Extension, loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment
from tokenizers import Tokenizer

# transformers' SPECIAL_TOKENS_ATTRIBUTES: the names every chat template sees
NAMED_TOKENS = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token")


class BundleTokenizer:
    """The subset of a transformers fast tokenizer the runtime and the eval suites call."""

    def __init__(self, folder: Path):
        self.backend = _backend(folder, split_special_tokens=False)
        self.splitting = _backend(folder, split_special_tokens=True)  # its own: no flag flipped under other threads
        config = json.loads((folder / "tokenizer_config.json").read_text())
        self.special_tokens = {name: _content(config[name]) for name in NAMED_TOKENS if config.get(name) is not None}
        self.bos_token = self.special_tokens.get("bos_token")
        self.added_tokens_decoder = self.backend.get_added_tokens_decoder()  # id -> AddedToken, as transformers'
        self.special_ids = {t.content: i for i, t in self.added_tokens_decoder.items() if t.special}
        self.eos_token = self.special_tokens.get("eos_token")
        self.clean_up = bool(config.get("clean_up_tokenization_spaces")) and \
            type(self.backend.model).__name__ != "BPE"  # transformers skips the clean-up for BPE models

    def __len__(self) -> int:
        return self.backend.get_vocab_size(with_added_tokens=True)

    def __call__(self, text: str, add_special_tokens: bool = True, split_special_tokens: bool = False
                 ) -> dict[str, list[int]]:
        """`split_special_tokens`: special tokens in `text` are text, as transformers' option of that name."""
        backend = self.splitting if split_special_tokens else self.backend
        return {"input_ids": backend.encode(text, add_special_tokens=add_special_tokens).ids}

    def decode(self, ids: list[int], skip_special_tokens: bool = False) -> str:
        text = self.backend.decode(list(ids), skip_special_tokens=skip_special_tokens)
        return _clean_up_tokenization(text) if self.clean_up else text

    def apply_chat_template(self, messages: list[dict[str, Any]], chat_template: str,
                            add_generation_prompt: bool = False, tokenize: bool = False) -> str:
        if tokenize:
            raise ValueError("BundleTokenizer.apply_chat_template renders text only; tokenize the result")
        messages = [{k: v for k, v in m.items() if v is not None} for m in messages]
        return _compile(chat_template).render(messages=messages, tools=None, documents=None,
                                              add_generation_prompt=add_generation_prompt, **self.special_tokens)


def _backend(folder: Path, split_special_tokens: bool) -> Tokenizer:
    backend = Tokenizer.from_file(str(folder / "tokenizer.json"))
    backend.no_padding()
    backend.no_truncation()
    backend.encode_special_tokens = split_special_tokens
    return backend


def _content(token: Any) -> str:
    """A special token as tokenizer_config.json writes it: a string or a serialized AddedToken."""
    return token["content"] if isinstance(token, dict) else str(token)


def _clean_up_tokenization(text: str) -> str:
    for before, after in ((" .", "."), (" ?", "?"), (" !", "!"), (" ,", ","), (" ' ", "'"), (" n't", "n't"),
                          (" 'm", "'m"), (" 's", "'s"), (" 've", "'ve"), (" 're", "'re")):
        text = text.replace(before, after)
    return text


def _raise_exception(message: str):
    raise jinja2.exceptions.TemplateError(message)


def _tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    """transformers' tojson: no HTML escaping, unlike jinja's own."""
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


class GenerationBlock(Extension):
    """`{% generation %}...{% endgeneration %}` renders its body, as transformers does when no mask is asked for."""

    tags = {"generation"}

    def parse(self, parser):
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(["name:endgeneration"], drop_needle=True)
        return jinja2.nodes.CallBlock(self.call_method("_body"), [], [], body).set_lineno(lineno)

    def _body(self, caller):
        return caller()


@lru_cache
def _compile(chat_template: str) -> jinja2.Template:
    """The environment transformers renders chat templates in (templates from a hub are untrusted code)."""
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[GenerationBlock, loopcontrols])
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    return env.from_string(chat_template)
