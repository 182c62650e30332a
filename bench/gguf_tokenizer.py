"""A Hugging Face tokenizer directory made from a GGUF file's own vocabulary, for load tools
that count tokens client-side (bench/external_load.py gives it to AIPerf as ``--tokenizer``).

Run with the load tool's venv, not the project's: it needs ``gguf``, ``tokenizers`` and
``transformers``, none of which TinyServe depends on.

    build/loadtool-venv/bin/python bench/gguf_tokenizer.py MODEL.gguf OUT_DIR

Why not ``AutoTokenizer.from_pretrained(dir, gguf_file=...)``: transformers 5 reads GGUF
through torch, which the load tool's venv does not have (nor want: it is the GPU stack). The
file holds everything a byte-level BPE needs (tokens already in GPT-2's byte alphabet, merges,
control tokens), so it is rebuilt here with ``tokenizers`` directly. Only byte-level BPE
vocabularies (``tokenizer.ggml.model == "gpt2"``) are handled; others stop with a message.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import gguf
from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

CONTROL = 3  # llama.cpp's LLAMA_TOKEN_TYPE_CONTROL: <|im_start|> and the like

# llama.cpp's pre-tokenizer names whose split differs from GPT-2's regex, as tokenizers
# pieces that run before the byte-level step. "smollm": every digit on its own (the same
# Sequence as SmolLM2's own tokenizer.json).
EXTRA_SPLITS: dict[str, list[Any]] = {
    "smollm": [pre_tokenizers.Digits(individual_digits=True)],
    "gpt2": [],
}


def metadata(path: Path) -> dict[str, Any]:
    """The file's ``tokenizer.*`` keys, as plain Python values."""
    reader = gguf.GGUFReader(str(path))
    return {k: f.contents() for k, f in reader.fields.items() if k.startswith("tokenizer.")}


def build(meta: dict[str, Any]) -> PreTrainedTokenizerFast:
    kind, pre = meta["tokenizer.ggml.model"], meta.get("tokenizer.ggml.pre", "gpt2")
    if kind != "gpt2" or pre not in EXTRA_SPLITS:
        raise SystemExit(f"unsupported GGUF tokenizer: model {kind!r}, pre {pre!r}")
    tokens: list[str] = meta["tokenizer.ggml.tokens"]
    merges = [tuple(m.split(" ", 1)) for m in meta["tokenizer.ggml.merges"]]
    vocab = {token: i for i, token in enumerate(tokens)}
    backend = Tokenizer(models.BPE(vocab, merges, fuse_unk=False, byte_fallback=False))
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    backend.pre_tokenizer = pre_tokenizers.Sequence([*EXTRA_SPLITS[pre], byte_level])
    backend.decoder = decoders.ByteLevel()
    types = meta["tokenizer.ggml.token_type"]
    control = [t for t, of in zip(tokens, types, strict=True) if of == CONTROL]
    backend.add_special_tokens(control)

    def token(key: str) -> str | None:
        index = meta.get(f"tokenizer.ggml.{key}")
        return None if index is None else tokens[index]

    return PreTrainedTokenizerFast(
        tokenizer_object=backend,
        bos_token=token("bos_token_id"),
        eos_token=token("eos_token_id"),
        unk_token=token("unknown_token_id"),
        pad_token=token("padding_token_id"),
        add_bos_token=bool(meta.get("tokenizer.ggml.add_bos_token", False)),
        chat_template=meta.get("tokenizer.chat_template"),
    )


def main() -> None:
    if len(sys.argv) != 3:
        raise SystemExit(__doc__)
    model, out = Path(sys.argv[1]), Path(sys.argv[2])
    build(metadata(model)).save_pretrained(str(out))
    print(f"wrote a tokenizer for {model.name} to {out}")


if __name__ == "__main__":
    main()
