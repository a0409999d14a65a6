"""Builds the random-weight Llamas that the real vLLM CPU engine serves in tests and benchmarks.

No model hub is reachable from these machines, so the models and their tokenizer are made
locally and deterministically (fixed seeds): a byte-level BPE tokenizer trained on generated
text and a bf16 LlamaForCausalLM with random weights. Two models, two regimes:

- `tiny` (2 layers, hidden 128, 940 KB): recompute is cheap, the tests' engine.
- `dear` (8 layers, hidden 512, 27 M parameters, 54 MB): a recompute of an agent program's
  context costs tens of decode steps on a CPU core, the order of a large model on GPUs
  (docs/simulator.md, "Two real regimes", has the measured ratio).

Run it with the vLLM venv's python (it needs torch, transformers and tokenizers):

    .cache/vllm-venv/bin/python scripts/build_tiny_model.py [MODEL_DIR] [--model tiny|dear]

Idempotent: a folder that already holds a finished build of the model's recipe is left alone.
Random initialisation of the dear model takes a few seconds: cheap enough for CI.
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import sys
import tempfile
from pathlib import Path

# Bump when the recipe changes so cached builds of an older recipe are rebuilt.
RECIPE_VERSION = 1
MARKER = ".thunder-mw-tiny-model"
CACHE = Path(__file__).resolve().parent.parent / ".cache"
DEFAULT_DIR = CACHE / "tiny-model"
DEAR_DIR = CACHE / "dear-model"

VOCAB_SIZE = 1000
SPECIAL_TOKENS = ["<unk>", "<s>", "</s>", "<pad>"]
# The CPU attention backend accepts head sizes 32, 64, 80, ...: 128 hidden / 4 heads = 32.
MODEL_SHAPE = {
    "hidden_size": 128,
    "num_attention_heads": 4,
    "num_key_value_heads": 4,
    "intermediate_size": 256,
    "num_hidden_layers": 2,
    "max_position_embeddings": 4096,
}
# Same recipe, a model whose prefill costs tens of decode steps: 512 / 8 heads = 64 per head.
DEAR_SHAPE = {
    "hidden_size": 512,
    "num_attention_heads": 8,
    "num_key_value_heads": 8,
    "intermediate_size": 1536,
    "num_hidden_layers": 8,
    "max_position_embeddings": 8192,
}
# model name -> (shape, recipe version, default folder). The tiny model's marker predates
# the name field, so a marker without one is the tiny model's.
MODELS: dict[str, tuple[dict[str, int], int, Path]] = {
    "tiny": (MODEL_SHAPE, RECIPE_VERSION, DEFAULT_DIR),
    "dear": (DEAR_SHAPE, 1, DEAR_DIR),
}
CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% for message in messages %}"
    "<|{{ message['role'] }}|>\n"
    "{% if message['content'] is string %}{{ message['content'] }}"
    "{% elif message['content'] is iterable %}"
    "{% for part in message['content'] %}{% if part['type'] == 'text' %}{{ part['text'] }}"
    "{% endif %}{% endfor %}"
    "{% endif %}"
    "{{ eos_token }}\n"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)

_WORDS = (
    "the a an agent tool call result program request response engine cache block token "
    "prefix schedule pause resume migrate container docker shell python file read write "
    "search test error retry plan step think answer user system assistant model gpu cpu "
    "memory kv context window batch queue latency throughput json yaml http server client "
    "def return import class for while if else in is not and or with as try except raise"
).split()


def is_built(model_dir: Path, model: str = "tiny") -> bool:
    """True when `model_dir` holds a finished build of `model`'s current recipe."""
    marker = model_dir / MARKER
    if not marker.is_file():
        return False
    try:
        done: dict[str, object] = json.loads(marker.read_text())
    except ValueError:
        return False
    return done.get("recipe") == MODELS[model][1] and done.get("model", "tiny") == model


def _corpus(seed: int, lines: int = 4000) -> list[str]:
    """Generated text mixing words, digits, code-like punctuation and JSON snippets."""
    rng = random.Random(seed)
    out = []
    for i in range(lines):
        words = [rng.choice(_WORDS) for _ in range(rng.randint(4, 16))]
        if i % 5 == 0:
            words.append(f"{{'id': {rng.randint(0, 9999)}, 'ok': true}}")
        if i % 7 == 0:
            words.append(f"x_{rng.randint(0, 99)} = f({rng.random():.3f})")
        out.append(" ".join(words).capitalize() + rng.choice([".", "?", "!", ":", ";"]))
    return out


def _build_tokenizer(target: Path, max_length: int) -> object:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_corpus(seed=0), trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token="<s>",
        eos_token="</s>",
        unk_token="<unk>",
        pad_token="<pad>",
        model_max_length=max_length,
    )
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(target)
    return fast


def _build_model(target: Path, tokenizer: object, shape: dict[str, int]) -> None:
    import torch
    from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=len(tokenizer),  # type: ignore[arg-type]
        bos_token_id=tokenizer.bos_token_id,  # type: ignore[attr-defined]
        eos_token_id=tokenizer.eos_token_id,  # type: ignore[attr-defined]
        pad_token_id=tokenizer.pad_token_id,  # type: ignore[attr-defined]
        tie_word_embeddings=False,
        **shape,
    )
    model = LlamaForCausalLM(config).to(torch.bfloat16)
    model.config.dtype = torch.bfloat16
    model.save_pretrained(target, safe_serialization=True)
    GenerationConfig(
        bos_token_id=config.bos_token_id,
        eos_token_id=config.eos_token_id,
        pad_token_id=config.pad_token_id,
    ).save_pretrained(target)


def build(model_dir: Path, model: str = "tiny") -> Path:
    """Builds `model` into `model_dir` unless it is already there; returns the folder."""
    shape, recipe, _ = MODELS[model]
    model_dir = model_dir.resolve()
    if is_built(model_dir, model):
        return model_dir
    model_dir.parent.mkdir(parents=True, exist_ok=True)
    # Build beside the target and rename, so an interrupted build never looks finished.
    staging = Path(tempfile.mkdtemp(prefix=".tiny-model-", dir=model_dir.parent))
    staging.chmod(0o755)
    try:
        tokenizer = _build_tokenizer(staging, shape["max_position_embeddings"])
        _build_model(staging, tokenizer, shape)
        (staging / MARKER).write_text(json.dumps({"recipe": recipe, "model": model}) + "\n")
        if model_dir.exists():
            shutil.rmtree(model_dir)
        staging.rename(model_dir)
    finally:
        if staging.exists():
            shutil.rmtree(staging)
    return model_dir


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description="Builds a local random-weight Llama.")
    parser.add_argument("model_dir", nargs="?", type=Path, help="target folder")
    parser.add_argument("--model", choices=sorted(MODELS), default="tiny")
    args = parser.parse_args(argv[1:])
    target = args.model_dir or MODELS[args.model][2]
    already = is_built(target, args.model)
    built = build(target, args.model)
    print(f"{args.model} model {'already built' if already else 'built'} at {built}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
