"""Build a tiny random-weight Llama and its tokenizer for running a real vLLM engine on a CPU-only machine.

    .cache/vllm-venv/bin/python deploy/local/make_tiny_model.py OUT_DIR

Nothing comes from a model hub: the tokenizer is a byte-level BPE trained here on generated text, and the
weights are random. The shape matches tests/data/tiny-llama/config.json (the CPU attention backend needs
head_dim >= 32), so the capacity model can be checked against what the engine allocates. Idempotent: an
existing complete OUT_DIR is left alone, and the model is written to a sibling folder first and renamed into
place, so OUT_DIR is never seen half-written.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import random
import shutil
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerFast

VOCAB_SIZE = 1000
SPECIAL_TOKENS = ("<s>", "</s>", "<pad>")
REQUIRED_FILES = ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json")
SEED = 0
CHAT_TEMPLATE = (
    "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}assistant:{% endif %}"
)
# The tokenizer's training text: these words, and made-up words built from these syllables.
DOMAIN_WORDS = (
    "the quick brown fox jumps over the lazy dog paged attention kv cache block token request server metrics "
    "prometheus latency throughput prefill decode batch queue preemption headroom saturation gpu memory"
)
SYLLABLES = "ka lo mi ne ru sa te vo zi qua bre cho dri fla gro plu sni tra wex yon"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out_dir", type=Path, help="folder to write the model and tokenizer into")
    out_dir = parser.parse_args().out_dir.resolve()
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    with _exclusive(out_dir.with_name(out_dir.name + ".lock")):
        if _is_complete(out_dir):
            print(f"make_tiny_model: already built in {out_dir}", file=sys.stderr)
            return 0
        started = time.monotonic()
        _build_into(out_dir)
    print(f"make_tiny_model: built {out_dir} in {time.monotonic() - started:.1f} s", file=sys.stderr)
    return 0


@contextlib.contextmanager
def _exclusive(lock_path: Path) -> Iterator[None]:
    # Two callers (a test session and `make demo`) may race to build the same model; the second waits.
    with lock_path.open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def _is_complete(out_dir: Path) -> bool:
    return all((out_dir / name).is_file() for name in REQUIRED_FILES)


def _build_into(out_dir: Path) -> None:
    staging = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}-", dir=out_dir.parent))
    try:
        _write_model(staging)
        # A leftover OUT_DIR without all its files is from an interrupted build; the staged one replaces it.
        shutil.rmtree(out_dir, ignore_errors=True)
        staging.rename(out_dir)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def _write_model(folder: Path) -> None:
    # Imported here so that the already-built case does not pay ~5 s for importing torch and transformers.
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    tokenizer = _train_tokenizer()
    tokenizer.save_pretrained(folder)
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=32,
        max_position_embeddings=2048,
        rms_norm_eps=1e-6,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        tie_word_embeddings=False,
        dtype="float32",
    )
    torch.manual_seed(SEED)
    LlamaForCausalLM(config).save_pretrained(folder)


def _train_tokenizer() -> PreTrainedTokenizerFast:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    tokenizer = Tokenizer(models.BPE(unk_token=None))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    # The full byte alphabet first means any text encodes, and ids 3..258 are always single bytes.
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(_training_text(), trainer)
    bos = SPECIAL_TOKENS[0]
    tokenizer.post_processor = processors.TemplateProcessing(
        single=f"{bos} $A", pair=f"{bos} $A {bos} $B", special_tokens=[(bos, tokenizer.token_to_id(bos))]
    )
    if tokenizer.get_vocab_size() != VOCAB_SIZE:
        raise RuntimeError(f"trained vocabulary has {tokenizer.get_vocab_size()} tokens, expected {VOCAB_SIZE}")
    fast = PreTrainedTokenizerFast(tokenizer_object=tokenizer, bos_token="<s>", eos_token="</s>", pad_token="<pad>")
    fast.chat_template = CHAT_TEMPLATE
    return fast


def _training_text() -> Iterator[str]:
    # Domain words alone give too few merges to fill the vocabulary; made-up words from syllables add variety.
    rng = random.Random(SEED)
    syllables = SYLLABLES.split()
    words = DOMAIN_WORDS.split() + ["".join(rng.choices(syllables, k=rng.randint(1, 4))) for _ in range(2000)]
    for _ in range(3000):
        yield " ".join(rng.choices(words, k=30))


if __name__ == "__main__":
    sys.exit(main())
