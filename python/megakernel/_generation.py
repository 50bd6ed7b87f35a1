"""Generation behind Model.generate and Model.stream: prompts (text or ids, one or a batch) to the core's generation
loop, its new ids back as ids or text, and streaming through a worker thread (the core runs with the GIL released)."""

from __future__ import annotations

import queue
import reprlib
import threading
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any, Union

import numpy as np

from . import _core
from ._arguments import INT32, INT64, UINT64, checked_bool, checked_engine, checked_float, checked_int, listed

if TYPE_CHECKING:
    from .model import Model
    from .tokenizer import Tokenizer

Prompt = Union[str, Sequence[int], Sequence[str], Sequence[Sequence[int]], Any]


class _Cancelled(Exception):
    """Raised from the step callback to end a generation whose stream was closed."""


def _prompts(model: Model, prompt: Prompt) -> tuple[list[list[int]], bool, bool]:
    """(prompts as ids, whether they were text, whether a batch was given)."""
    if isinstance(prompt, str):
        return [model.encode(prompt)], True, False
    if hasattr(prompt, "tolist"):  # numpy arrays and torch tensors
        prompt = prompt.tolist()
    items = listed(prompt, "prompt", "text, token ids or a list of prompts")
    if items and all(isinstance(p, str) for p in items):
        return [model.encode(p) for p in items], True, True
    scalars = [_is_scalar(p) for p in items]
    if all(scalars):  # one prompt
        return [_whole_ids(items, "prompt")], False, False
    if any(scalars):
        first, second = sorted((scalars.index(True), scalars.index(False)))
        raise _core.MkError(f"prompt must be one prompt's token ids or a list of prompts, not a mix: item {first} "
                            f"is {reprlib.repr(items[first])}, item {second} is {reprlib.repr(items[second])}")
    return [_whole_ids(p, f"prompt {index}") for index, p in enumerate(items)], False, True


def _is_scalar(value: Any) -> bool:
    try:
        return np.ndim(value) == 0
    except ValueError:  # numpy will not measure a ragged nesting, which is no scalar either
        return False


def _whole_ids(values: Any, name: str) -> list[int]:
    """Token ids as ints; a float id (say from a float array) is refused rather than truncated to another id."""
    return [checked_int(value, f"{name}'s token id", INT64) for value in listed(values, name, "a list of token ids")]


def _core_arguments(prompts: list[list[int]], max_new_tokens: int, options: dict[str, Any]) -> tuple[Any, ...]:
    """The core's arguments of a generation (its generate() and check_generate()), the integers checked against their
    C++ types; the core checks the rest (ids against the vocabulary, the sampling's ranges, the cache)."""
    sampling = _core.SamplingParams()
    sampling.temperature = checked_float(options["temperature"], "temperature")
    sampling.top_k = checked_int(options["top_k"], "top_k", (0, INT32[1]))
    sampling.top_p = checked_float(options["top_p"], "top_p")
    sampling.seed = checked_int(options["seed"], "seed", UINT64)
    eos = options["eos_ids"]
    eos_ids = None if eos is None else _whole_ids(eos, "eos_ids")  # None: the model's
    # 0 is the core's "default"; a caller's 0 or negative size would silently get the default too.
    given_context = options["max_context"]
    max_context = 0 if given_context is None else checked_int(given_context, "max_context", (1, INT64[1]))
    return (checked_engine(options["engine"]), prompts, checked_int(max_new_tokens, "max_new_tokens", INT64), sampling,
            eos_ids, max_context)


def _primed_decoder(tokenizer: Tokenizer, prompt: list[int], skip_special_tokens: bool) -> Any:
    """A stream decoder that has seen the prompt, so that the first new piece gets its leading space right."""
    decoder = tokenizer.stream_decoder(skip_special_tokens)
    for token_id in prompt:
        decoder.push(token_id)
    return decoder


def _new_text(tokenizer: Tokenizer, prompt: list[int], new_ids: list[int], skip_special_tokens: bool) -> str:
    decoder = _primed_decoder(tokenizer, prompt, skip_special_tokens)
    return "".join(decoder.push(i) for i in new_ids) + decoder.finish()


def generate_ids(model: Model, prompt: Prompt, max_new_tokens: int, options: dict[str, Any],
                 skip_special_tokens: bool) -> Any:
    """Model.generate: the new ids, or their text for text prompts; a list of them for a batch."""
    skip_special_tokens = checked_bool(skip_special_tokens, "skip_special_tokens")  # also where no text is decoded
    prompts, is_text, is_batch = _prompts(model, prompt)
    results = model._core.generate(*_core_arguments(prompts, max_new_tokens, options), None)
    if is_text:
        tokenizer = model._require_tokenizer()
        out: list[Any] = [_new_text(tokenizer, p, new, skip_special_tokens) for p, (new, _) in zip(prompts, results)]
    else:
        out = [new for new, _ in results]
    return out if is_batch else out[0]


def run_stream(model: Model, prompt: str | Sequence[int], max_new_tokens: int, options: dict[str, Any],
               skip_special_tokens: bool) -> Iterator[Any]:
    """Model.stream: checks every argument now, as generate() does, so that a bad one is raised by the call that gave
    it rather than by a later next(); generates when iterated."""
    skip_special_tokens = checked_bool(skip_special_tokens, "skip_special_tokens")
    prompts, is_text, is_batch = _prompts(model, prompt)
    if is_batch:
        raise _core.MkError("stream() takes one prompt (text or ids); generate() takes a batch")
    arguments = _core_arguments(prompts, max_new_tokens, options)
    model._core.check_generate(*arguments)
    decoder = _primed_decoder(model._require_tokenizer(), prompts[0], skip_special_tokens) if is_text else None
    return _stream(model, arguments, decoder)


def _stream(model: Model, arguments: tuple[Any, ...], decoder: Any) -> Iterator[Any]:
    items: queue.Queue[Any] = queue.Queue()
    closed = threading.Event()
    done = object()

    def on_step(step: int, made: list[int]) -> None:
        if closed.is_set():
            raise _Cancelled()
        if made[0] >= 0:
            items.put(made[0])

    def work() -> None:
        try:
            model._core.generate(*arguments, on_step)
            items.put(done)
        except _Cancelled:
            items.put(done)
        except BaseException as error:  # handed to the consumer, which raises it
            items.put(error)

    worker = threading.Thread(target=work, name="megakernel-generate", daemon=True)
    worker.start()
    try:
        while (item := items.get()) is not done:
            if isinstance(item, BaseException):
                raise item
            if decoder is None:
                yield item
            elif piece := decoder.push(item):
                yield piece
        if decoder is not None and (rest := decoder.finish()):
            yield rest
    finally:
        closed.set()
        worker.join()
