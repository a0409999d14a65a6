"""Builds the tiny random-weight Llama that the real vLLM CPU engine serves in tests.

No model hub is reachable from these machines, so the model and its tokenizer are made
locally and deterministically (fixed seeds): a byte-level BPE tokenizer trained on generated
text and a bf16 LlamaForCausalLM with random weights. Run it with the vLLM venv's python
(it needs torch, transformers and tokenizers):

    .cache/vllm-venv/bin/python scripts/build_tiny_model.py [MODEL_DIR]

Idempotent: a folder that already holds a finished build of this recipe is left alone.
"""

from __future__ import annotations

import json
import random
import shutil
import sys
import tempfile
from pathlib import Path

# Bump when the recipe changes so cached builds of an older recipe are rebuilt.
RECIPE_VERSION = 1
MARKER = ".thunder-mw-tiny-model"
DEFAULT_DIR = Path(__file__).resolve().parent.parent / ".cache" / "tiny-model"

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


def is_built(model_dir: Path) -> bool:
    """True when `model_dir` holds a finished build of the current recipe."""
    marker = model_dir / MARKER
    if not marker.is_file():
        return False
    try:
        return json.loads(marker.read_text()).get("recipe") == RECIPE_VERSION
    except ValueError:
        return False


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


def _build_tokenizer(target: Path) -> object:
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
        model_max_length=MODEL_SHAPE["max_position_embeddings"],
    )
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(target)
    return fast


def _build_model(target: Path, tokenizer: object) -> None:
    import torch
    from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=len(tokenizer),  # type: ignore[arg-type]
        bos_token_id=tokenizer.bos_token_id,  # type: ignore[attr-defined]
        eos_token_id=tokenizer.eos_token_id,  # type: ignore[attr-defined]
        pad_token_id=tokenizer.pad_token_id,  # type: ignore[attr-defined]
        tie_word_embeddings=False,
        **MODEL_SHAPE,
    )
    model = LlamaForCausalLM(config).to(torch.bfloat16)
    model.config.dtype = torch.bfloat16
    model.save_pretrained(target, safe_serialization=True)
    GenerationConfig(
        bos_token_id=config.bos_token_id,
        eos_token_id=config.eos_token_id,
        pad_token_id=config.pad_token_id,
    ).save_pretrained(target)


def build(model_dir: Path) -> Path:
    """Builds the tiny model into `model_dir` unless it is already there; returns the folder."""
    model_dir = model_dir.resolve()
    if is_built(model_dir):
        return model_dir
    model_dir.parent.mkdir(parents=True, exist_ok=True)
    # Build beside the target and rename, so an interrupted build never looks finished.
    staging = Path(tempfile.mkdtemp(prefix=".tiny-model-", dir=model_dir.parent))
    staging.chmod(0o755)
    try:
        tokenizer = _build_tokenizer(staging)
        _build_model(staging, tokenizer)
        (staging / MARKER).write_text(json.dumps({"recipe": RECIPE_VERSION}) + "\n")
        if model_dir.exists():
            shutil.rmtree(model_dir)
        staging.rename(model_dir)
    finally:
        if staging.exists():
            shutil.rmtree(staging)
    return model_dir


def main(argv: list[str]) -> int:
    target = Path(argv[1]) if len(argv) > 1 else DEFAULT_DIR
    already = is_built(target)
    built = build(target)
    print(f"tiny model {'already built' if already else 'built'} at {built}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
