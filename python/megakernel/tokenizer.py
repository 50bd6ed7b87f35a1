"""Text <-> token ids with a Hugging Face tokenizer.json through mk's C++ tokenizer (ids as `tokenizers` gives)."""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator
from typing import Any

from . import _core
from ._arguments import (INT32, checked_bool, checked_int, checked_path, checked_str, iterated, listed,
                         made_by_the_core)


def _id(value: Any) -> int:
    """A token id as the core's int32, or MkError: int() would truncate 2.7 to the other id 2."""
    return checked_int(value, "token id", INT32)


def _id_list(ids: Any) -> list[int]:
    """A flat list of ints from a list, a numpy array or a torch tensor of ids."""
    if hasattr(ids, "tolist"):
        ids = ids.tolist()
    ids = listed(ids, "ids", "a list of token ids")
    if any(isinstance(i, list) for i in ids):
        raise _core.MkError("token ids must be one flat sequence, got a nested one")
    return [_id(i) for i in ids]


class StreamDecoder:
    """Decodes ids one at a time, emitting only complete UTF-8 characters: a token that ends inside a character yields
    "" until a later token completes it. The pieces joined, plus finish(), equal Tokenizer.decode of all ids."""

    def __init__(self, core: _core.StreamDecoder) -> None:
        self._core = made_by_the_core(core, _core.StreamDecoder, "StreamDecoder", "Tokenizer.stream_decoder()")

    def push(self, token_id: int) -> str:
        """The text this id completes (possibly ""). Raises MkError for an id outside the vocabulary."""
        return self._core.push(_id(token_id))

    def finish(self) -> str:
        """Whatever is still held back (an incomplete character comes out as U+FFFD); then starts afresh."""
        return self._core.finish()


def _pieces(ids: Iterator[Any], decoder: StreamDecoder) -> Iterator[str]:
    for token_id in ids:
        piece = decoder.push(token_id)
        if piece:
            yield piece
    rest = decoder.finish()
    if rest:
        yield rest


class Tokenizer:
    """A tokenizer.json (byte-level BPE as Llama 3 and GPT-2, SentencePiece-style BPE with byte fallback as Llama 2 and
    Mistral), with BOS/EOS from tokenizer_config.json, generation_config.json and config.json beside it."""

    def __init__(self, core: _core.Tokenizer) -> None:
        self._core = made_by_the_core(core, _core.Tokenizer, "Tokenizer",
                                      "Tokenizer.load(path) or Tokenizer.from_json(json_text)")

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> Tokenizer:
        """Loads a tokenizer.json, or the one in a model directory (with its config files)."""
        return cls(_core.Tokenizer.load(checked_path(path, "path")))

    @classmethod
    def from_json(cls, json_text: str) -> Tokenizer:
        """A tokenizer from the text of a tokenizer.json alone (no config files, so no BOS/EOS from them)."""
        return cls(_core.Tokenizer.from_json(checked_str(json_text, "json_text")))

    def encode(self, text: str, add_special_tokens: bool = True, split_special_tokens: bool = False) -> list[int]:
        """Token ids of `text`. add_special_tokens: add what the post-processor adds (Llama: BOS).
        split_special_tokens: tokenize special-token text (say "<|eot_id|>") as plain text."""
        return self._core.encode(checked_str(text, "text"), checked_bool(add_special_tokens, "add_special_tokens"),
                                 checked_bool(split_special_tokens, "split_special_tokens"))

    def decode(self, ids: Iterable[int], skip_special_tokens: bool = False) -> str:
        """The text of `ids` as `tokenizers` decodes them (invalid byte sequences become U+FFFD). Raises MkError for an
        id outside the vocabulary."""
        return self._core.decode(_id_list(ids), checked_bool(skip_special_tokens, "skip_special_tokens"))

    def stream_decoder(self, skip_special_tokens: bool = False) -> StreamDecoder:
        """A decoder to push ids into one at a time (for printing generated tokens as they come)."""
        return StreamDecoder(self._core.stream_decoder(checked_bool(skip_special_tokens, "skip_special_tokens")))

    def stream(self, ids: Iterable[int], skip_special_tokens: bool = False) -> Iterator[str]:
        """Yields the text of `ids` piece by piece as they come, each piece whole UTF-8 characters; nothing is yielded
        for a token that ends inside a character until a later one completes it. `ids` may come lazily (a generator),
        so they are checked as they come, but ids that are no iterable at all raise MkError at once."""
        return _pieces(iterated(ids, "ids", "an iterable of token ids"), self.stream_decoder(skip_special_tokens))

    @property
    def vocab_size(self) -> int:
        """One more than the largest id, model vocabulary and added tokens together."""
        return self._core.vocab_size

    @property
    def bos_id(self) -> int | None:
        """The BOS id, or None when the tokenizer's files name none."""
        return self._core.bos_id

    @property
    def eos_ids(self) -> list[int]:
        """The ids that end generation (empty when the tokenizer's files name none)."""
        return self._core.eos_ids

    @property
    def special_tokens(self) -> dict[str, int]:
        """The special added tokens, text to id."""
        return self._core.special_tokens

    def token_to_id(self, token: str) -> int | None:
        """The id of a vocabulary entry or added token, or None."""
        return self._core.token_to_id(checked_str(token, "token"))

    def id_to_token(self, token_id: int) -> str | None:
        """The vocabulary entry (or added token) of an id, or None outside the vocabulary."""
        return self._core.id_to_token(_id(token_id))

    def is_special(self, token_id: int) -> bool:
        """Whether the id is a special added token (skipped by decode(skip_special_tokens=True))."""
        return self._core.is_special(_id(token_id))

    def __repr__(self) -> str:
        return f"Tokenizer(vocab_size={self.vocab_size}, bos_id={self.bos_id}, eos_ids={self.eos_ids})"
