"""Build a tiny Qwen2-architecture model and tokenizer offline, for tests and smoke runs.

``build_tiny_model(out_dir)`` trains a byte-level BPE tokenizer on an embedded corpus, wraps it as
a transformers fast tokenizer with Qwen2.5's special tokens and a Qwen2.5-style chat template,
builds a randomly initialised ``Qwen2ForCausalLM`` of about 0.14M parameters, and saves both with
``save_pretrained``. Nothing is downloaded, and the output is byte-identical for a given seed, so
the saved directory can be cached and compared by file hashes.

The console script ``agentrl-tiny-model OUT_DIR`` does the same from the command line.
"""

from __future__ import annotations

import argparse
import hashlib
import itertools
import json
import logging
import threading
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
from transformers import GenerationConfig, PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

from agentrl_ext import cli
from agentrl_ext.models.chat_template import CHAT_TEMPLATES
from agentrl_ext.models.tiny_corpus import corpus_lines

__all__ = [
    "BUILDER_VERSION",
    "BUILD_RECORD",
    "ENDOFTEXT",
    "IM_END",
    "IM_START",
    "SPECIAL_TOKENS",
    "TOOL_TOKENS",
    "TinyModelSpec",
    "build_model",
    "build_record",
    "build_tiny_model",
    "build_tokenizer",
    "main",
]

logger = logging.getLogger(__name__)

#: Bump whenever the saved output changes for the same arguments (cache keys include it).
BUILDER_VERSION = 1

ENDOFTEXT = "<|endoftext|>"
IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
#: Control tokens, marked special (dropped by ``decode(skip_special_tokens=True)``), as in Qwen2.5.
SPECIAL_TOKENS = (ENDOFTEXT, IM_START, IM_END)
#: Tool-call markup; added as single tokens but *not* special, as in Qwen2.5, so decoding keeps them.
TOOL_TOKENS = ("<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>")

# Qwen2's pre-tokenizer split: contractions, words, single digits, punctuation runs, newlines.
_PRETOKENIZE_REGEX = r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"""
_VOCAB_MULTIPLE = 64
# Weight init draws from torch's global RNG; serialise seeded builds so threads cannot interleave.
_SEEDED_INIT_LOCK = threading.Lock()


@dataclass(frozen=True)
class TinyModelSpec:
    """Sizes of the tiny model; the defaults give about 0.14M parameters.

    ``vocab_size`` is the BPE training target (256 byte tokens plus merges), before the 7 added
    chat tokens. The embedded corpus supports about 1,340, so larger targets stop early (with a
    warning). The model's embedding has ``len(tokenizer)`` rows rounded up to a multiple of 64.
    """

    vocab_size: int = 1024
    hidden_size: int = 64
    num_layers: int = 2
    num_heads: int = 4
    num_kv_heads: int = 2
    intermediate_size: int = 128
    max_position_embeddings: int = 4096
    #: the embedding's rows are ``len(tokenizer)`` rounded up to a multiple of this; the padded rows
    #: are never a token, but an untrained model gives them probability, which verl's vLLM rollout
    #: masks and its FSDP actor does not (docs/cpu_backend.md): 1 pads nothing
    vocab_multiple: int = _VOCAB_MULTIPLE
    #: every integer ``0 .. number_tokens - 1`` is one token (0: digit by digit, as Qwen2.5 splits
    #: numbers). GPT-4's and Llama 3's tokenizers give every group of 1-3 digits one token; 1000
    #: does that here, so a model copies a number from its context as one token
    number_tokens: int = 0

    def __post_init__(self) -> None:
        for name, value in asdict(self).items():
            if value < 0 or (value == 0 and name != "number_tokens"):
                raise ValueError(f"TinyModelSpec.{name} must be positive, got {value}")
        if self.vocab_size < 256 + 1:
            raise ValueError(
                f"TinyModelSpec.vocab_size must exceed the 256 byte tokens, got {self.vocab_size}"
            )
        if self.hidden_size % self.num_heads:
            raise ValueError(
                f"TinyModelSpec.hidden_size ({self.hidden_size}) must be divisible by num_heads ({self.num_heads})"
            )
        if self.num_heads % self.num_kv_heads:
            raise ValueError(
                f"TinyModelSpec.num_heads ({self.num_heads}) must be divisible by num_kv_heads ({self.num_kv_heads})"
            )


def _train_bpe(vocab_size: int, extra_corpus: Sequence[str] = ()) -> Tokenizer:
    """Train a byte-level BPE on the embedded corpus (and ``extra_corpus``), with Qwen2's
    normalizer and pre-tokenizer."""
    tokenizer = Tokenizer(models.BPE(unk_token=None, fuse_unk=False, byte_fallback=False))
    tokenizer.normalizer = normalizers.NFC()
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(_PRETOKENIZE_REGEX), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=1,
        show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        special_tokens=[],
    )
    tokenizer.train_from_iterator(itertools.chain(corpus_lines(), extra_corpus), trainer=trainer)
    if tokenizer.get_vocab_size() < vocab_size:
        logger.warning(
            "vocab_size %d is more than the embedded corpus supports; the BPE vocabulary has %d tokens",
            vocab_size,
            tokenizer.get_vocab_size(),
        )
    # Added tokens get ids after the learned vocabulary, in this order, as in Qwen2.5.
    tokenizer.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in SPECIAL_TOKENS])
    tokenizer.add_tokens([AddedToken(t, special=False, normalized=False) for t in TOOL_TOKENS])
    return tokenizer


def build_tokenizer(
    vocab_size: int = TinyModelSpec.vocab_size,
    extra_corpus: Sequence[str] = (),
    chat_template: str = "qwen25",
    number_tokens: int = 0,
) -> PreTrainedTokenizerFast:
    """Return the tiny chat tokenizer: byte-level BPE, Qwen2.5 special tokens and chat template.

    ``eos_token`` is ``<|im_end|>`` (the end of a chat turn, where generation stops) and
    ``pad_token`` is ``<|endoftext|>``; there is no BOS token, as in Qwen2.5-Instruct. Training is
    deterministic, so the same ``vocab_size`` and ``extra_corpus`` always give the same files.
    ``extra_corpus``: more training text, e.g. the rendered episodes of the tasks the model will
    play, so that their prompts and tool calls take few tokens (as a real model's tokenizer,
    trained on far more text, would); see ``agentrl.assets.tokenizer_expert_episodes``.
    ``chat_template``: a name of :data:`~agentrl_ext.models.chat_template.CHAT_TEMPLATES`.
    ``number_tokens``: see :attr:`TinyModelSpec.number_tokens`. The numbers are added tokens (not
    special), matched longest first before the pre-tokenizer: ``1234`` is ``123`` + ``4``.
    """
    tokenizer = _train_bpe(vocab_size, extra_corpus)
    if number_tokens:
        tokenizer.add_tokens(
            [AddedToken(str(n), special=False, normalized=False) for n in range(number_tokens)]
        )
    return PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        eos_token=IM_END,
        pad_token=ENDOFTEXT,
        unk_token=None,
        bos_token=None,
        chat_template=chat_template_named(chat_template),
        clean_up_tokenization_spaces=False,
        split_special_tokens=False,
    )


def chat_template_named(name: str) -> str:
    """The chat template called ``name`` (``qwen25`` or ``compact``), naming the choices otherwise."""
    try:
        return CHAT_TEMPLATES[name]
    except KeyError:
        raise ValueError(
            f"unknown tiny-model chat template {name!r}; choose one of {', '.join(sorted(CHAT_TEMPLATES))}"
        ) from None


def _token_id(tokenizer: PreTrainedTokenizerFast, token: str) -> int:
    token_id = tokenizer.convert_tokens_to_ids(token)
    if not isinstance(token_id, int):
        raise ValueError(f"tokenizer has no single id for {token!r}: got {token_id!r}")
    return token_id


def _round_up(value: int, multiple: int) -> int:
    return -(-value // multiple) * multiple


def build_model(
    tokenizer: PreTrainedTokenizerFast, spec: TinyModelSpec, *, seed: int = 0
) -> Qwen2ForCausalLM:
    """Return a randomly initialised float32 ``Qwen2ForCausalLM`` sized by ``spec`` for ``tokenizer``.

    Weights depend only on ``seed`` and ``spec``; the caller's global torch RNG state is left as it
    was. Token ids follow Qwen2.5-Instruct: ``bos`` and ``pad`` are ``<|endoftext|>``, ``eos`` is
    ``<|im_end|>``, and generation also stops at ``<|endoftext|>``.
    """
    endoftext_id = _token_id(tokenizer, ENDOFTEXT)
    im_end_id = _token_id(tokenizer, IM_END)
    config = Qwen2Config(
        vocab_size=_round_up(len(tokenizer), spec.vocab_multiple),
        hidden_size=spec.hidden_size,
        intermediate_size=spec.intermediate_size,
        num_hidden_layers=spec.num_layers,
        num_attention_heads=spec.num_heads,
        num_key_value_heads=spec.num_kv_heads,
        max_position_embeddings=spec.max_position_embeddings,
        max_window_layers=spec.num_layers,
        tie_word_embeddings=True,
        use_cache=True,
        bos_token_id=endoftext_id,
        eos_token_id=im_end_id,
        pad_token_id=endoftext_id,
        dtype="float32",
    )
    with _SEEDED_INIT_LOCK, torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = Qwen2ForCausalLM(config).float()  # float32 even if the default dtype was changed
    model.generation_config = GenerationConfig(
        bos_token_id=endoftext_id,
        eos_token_id=[im_end_id, endoftext_id],
        pad_token_id=endoftext_id,
    )
    model.eval()
    return model


def build_tiny_model(
    out_dir: str | Path,
    *,
    seed: int = 0,
    vocab_size: int = TinyModelSpec.vocab_size,
    hidden_size: int = TinyModelSpec.hidden_size,
    num_layers: int = TinyModelSpec.num_layers,
    num_heads: int = TinyModelSpec.num_heads,
    num_kv_heads: int = TinyModelSpec.num_kv_heads,
    intermediate_size: int = TinyModelSpec.intermediate_size,
    max_position_embeddings: int = TinyModelSpec.max_position_embeddings,
    vocab_multiple: int = TinyModelSpec.vocab_multiple,
    number_tokens: int = TinyModelSpec.number_tokens,
    extra_corpus: Sequence[str] = (),
    chat_template: str = "qwen25",
) -> Path:
    """Build the tiny tokenizer and model and ``save_pretrained`` both into ``out_dir``.

    The directory loads with ``AutoTokenizer.from_pretrained`` and
    ``AutoModelForCausalLM.from_pretrained`` without network access. The same arguments always
    write byte-identical files. ``extra_corpus`` and ``chat_template``: see :func:`build_tokenizer`. Besides the HF
    files, ``out_dir/BUILD_RECORD`` records the arguments (:func:`build_record`), so that a caller can
    tell a model built with other arguments. Returns ``out_dir`` as a ``Path``.
    """
    spec = TinyModelSpec(
        vocab_size=vocab_size,
        hidden_size=hidden_size,
        num_layers=num_layers,
        num_heads=num_heads,
        num_kv_heads=num_kv_heads,
        intermediate_size=intermediate_size,
        max_position_embeddings=max_position_embeddings,
        vocab_multiple=vocab_multiple,
        number_tokens=number_tokens,
    )
    out = Path(out_dir)
    started = time.perf_counter()
    tokenizer = build_tokenizer(spec.vocab_size, extra_corpus, chat_template, spec.number_tokens)
    tokenizer.model_max_length = spec.max_position_embeddings
    model = build_model(tokenizer, spec, seed=seed)
    out.mkdir(parents=True, exist_ok=True)
    tokenizer.save_pretrained(out)
    model.save_pretrained(out)
    (out / BUILD_RECORD).write_text(
        json.dumps(build_record(spec, seed, extra_corpus, chat_template), indent=2) + "\n"
    )
    logger.info(
        "built tiny model in %s: %d tokens, %d parameters, seed %d, %.2f s",
        out,
        len(tokenizer),
        model.num_parameters(),
        seed,
        time.perf_counter() - started,
    )
    return out


#: the file in a built model's folder that records what it was built from
BUILD_RECORD = "agentrl_tiny_model.json"


def build_record(
    spec: TinyModelSpec, seed: int, extra_corpus: Sequence[str] = (), chat_template: str = "qwen25"
) -> dict[str, Any]:
    """What :func:`build_tiny_model` writes to ``BUILD_RECORD``: the builder version, the spec, the
    seed, a digest of the extra corpus and the chat template (when not the default). Equal records
    mean equal builds."""
    digest = hashlib.sha256("\n".join(extra_corpus).encode()).hexdigest()[:16] if extra_corpus else None
    sizes = asdict(spec)
    if not spec.number_tokens:
        del sizes["number_tokens"]  # records of builds before the option stay valid
    record = {"builder_version": BUILDER_VERSION, "spec": sizes, "seed": seed, "extra_corpus": digest}
    if chat_template != "qwen25":
        record["chat_template"] = chat_template
    return record


def _parse_args(argv: list[str] | None) -> argparse.Namespace:
    defaults = TinyModelSpec()
    parser = cli.parser(
        "agentrl-tiny-model",
        "Build a tiny Qwen2-architecture model and chat tokenizer offline into OUT_DIR; prints OUT_DIR.",
    )
    parser.add_argument("out_dir", metavar="OUT_DIR", type=Path, help="directory to save_pretrained into")
    parser.add_argument("--seed", type=int, default=0, help="weight initialisation seed")
    parser.add_argument("--vocab-size", type=int, default=defaults.vocab_size, help="BPE training target")
    parser.add_argument("--hidden-size", type=int, default=defaults.hidden_size)
    parser.add_argument("--num-layers", type=int, default=defaults.num_layers)
    parser.add_argument("--num-heads", type=int, default=defaults.num_heads)
    parser.add_argument("--num-kv-heads", type=int, default=defaults.num_kv_heads)
    parser.add_argument("--intermediate-size", type=int, default=defaults.intermediate_size)
    parser.add_argument("--max-position-embeddings", type=int, default=defaults.max_position_embeddings)
    parser.add_argument(
        "--number-tokens",
        type=int,
        default=defaults.number_tokens,
        help="every integer below this is one token (0: digits)",
    )
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    """Console entry point: ``agentrl-tiny-model OUT_DIR [--seed N] [--vocab-size V] ...``."""
    args = _parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    try:
        out = build_tiny_model(
            args.out_dir,
            seed=args.seed,
            vocab_size=args.vocab_size,
            hidden_size=args.hidden_size,
            num_layers=args.num_layers,
            num_heads=args.num_heads,
            num_kv_heads=args.num_kv_heads,
            intermediate_size=args.intermediate_size,
            max_position_embeddings=args.max_position_embeddings,
            number_tokens=args.number_tokens,
        )
    except ValueError as err:
        raise SystemExit(f"agentrl-tiny-model: {err}") from err
    print(out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
