"""A GGUF file's tokenizer on its own, without loading the weights."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Optional, Sequence, Union

from . import _args, _core

__all__ = ["Tokenizer"]


class Tokenizer:
    """The tokenizer a GGUF file describes (``tokenizer.ggml.*``), built without reading any
    tensor data, so it also works on vocabulary-only files such as llama.cpp's
    ``ggml-vocab-*.gguf``. It tokenizes exactly as llama.cpp does: byte-level BPE
    (``tokenizer.ggml.model = "gpt2"`` with the pre-tokenizers ``llama-bpe``, ``qwen2``,
    ``qwen35``, ``gpt-2``, ``smollm``) and SentencePiece (``"llama"``: Llama 2, Mistral,
    TinyLlama, Phi-3, Gemma). Other tokenizers raise :class:`~reprolm.UnsupportedError`
    naming them.

    >>> tok = reprolm.Tokenizer.from_gguf("ggml-vocab-llama-spm.gguf")  # doctest: +SKIP
    >>> tok.encode("Hello world")                                       # doctest: +SKIP
    [1, 15043, 3186]
    """

    def __init__(self, core: _core.Tokenizer) -> None:
        self._core = core

    @classmethod
    def from_gguf(cls, path: Union[str, os.PathLike[str]]) -> "Tokenizer":
        """Reads the tokenizer of the GGUF file at ``path``."""
        return cls(_core.Tokenizer(_args.path(path, "path")))

    @property
    def vocab_size(self) -> int:
        """Number of tokens; valid ids are ``0..vocab_size - 1``."""
        return self._core.vocab_size

    @property
    def kind(self) -> str:
        """``"sentencepiece"``, or ``"bpe:"`` and the pre-tokenizer (``"bpe:llama-bpe"``,
        ``"bpe:qwen2"``, ``"bpe:qwen35"``, ``"bpe:gpt-2"``, ``"bpe:smollm"``)."""
        return self._core.kind

    @property
    def bos_id(self) -> Optional[int]:
        return self._core.bos_id

    @property
    def eos_id(self) -> Optional[int]:
        return self._core.eos_id

    def encode(self, text: str, *, special: bool = False, add_special: bool = True) -> list[int]:
        """Token ids of ``text``. With ``special=True``, special-token strings such as
        ``<|im_start|>`` become their single ids; otherwise they are tokenized as text.
        With ``add_special`` (the default), the BOS/EOS ids are added where the file asks for
        them (``add_bos_token`` / ``add_eos_token``, else llama.cpp's default for the kind)."""
        _args.text(text, "text")
        return self._core.encode(text, special=bool(special), add_special=bool(add_special))

    def decode(self, ids: Sequence[int]) -> str:
        """The text of ``ids``: the bytes of their pieces joined, then decoded as UTF-8.
        Special tokens appear as their text; the space SentencePiece puts before the text is
        kept (``decode(encode("Hi", add_special=False))`` is ``" Hi"`` for Llama 2)."""
        return self._core.decode(_args.token_ids(ids, "ids", self.vocab_size))

    def token_bytes(self, token_id: int) -> bytes:
        """The raw bytes of one token (possibly part of a UTF-8 character)."""
        return self._core.token_bytes(_args.token_id(token_id, "token_id", self.vocab_size))

    def is_special(self, token_id: int) -> bool:
        """Whether ``token_id`` is a control or unknown token (false outside the vocabulary)."""
        return self._core.is_special(_args.token_id(token_id, "token_id", self.vocab_size))

    def __repr__(self) -> str:
        return f"Tokenizer(kind={self.kind!r}, vocab_size={self.vocab_size})"
