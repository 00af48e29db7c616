"""Build the live tiers' model: a tiny random-weight Qwen3-MoE with a locally trained tokenizer.

    python tools/live/build_tiny_moe.py OUT_DIR [--seed NAME]

Run it with an engine venv's Python (it needs torch, safetensors and tokenizers; transformers is not
needed). No hub: the tokenizer is a byte-level BPE trained here on a corpus this script generates
from a fixed seed, and every weight comes from a torch generator seeded by the tensor's name, so
the same script writes the same bytes on every build (``--check`` prints the digest of the files).
``--seed NAME`` prefixes every tensor's seed with NAME: another checkpoint of the same model (the
same tokenizer and shapes, other weights), which the live tiers load as a weight update.

The shape is what both engines' CPU paths run quickly and what routing replay needs: 2 layers,
8 experts, top-2 routing, hidden 128, about 1.5 M parameters, bf16, safetensors. Weights are random
but not flat: embeddings and the output head have a wider spread than a trained model's init, so
greedy decoding has clear winners (no argmax near-ties that a batch's float order could flip).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import random
import sys
from pathlib import Path

VOCAB = 4096
HIDDEN = 128
LAYERS = 2
HEADS = 4
KV_HEADS = 2
HEAD_DIM = 32
EXPERTS = 8
TOP_K = 2
MOE_INTERMEDIATE = 64
MAX_POSITIONS = 4096
SPECIAL = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")

CONFIG = {
    "architectures": ["Qwen3MoeForCausalLM"],
    "model_type": "qwen3_moe",
    "vocab_size": VOCAB,
    "hidden_size": HIDDEN,
    "intermediate_size": 4 * HIDDEN,
    "moe_intermediate_size": MOE_INTERMEDIATE,
    "num_hidden_layers": LAYERS,
    "num_attention_heads": HEADS,
    "num_key_value_heads": KV_HEADS,
    "head_dim": HEAD_DIM,
    "num_experts": EXPERTS,
    "num_experts_per_tok": TOP_K,
    "decoder_sparse_step": 1,
    "mlp_only_layers": [],
    "norm_topk_prob": True,
    "router_aux_loss_coef": 0.0,
    "output_router_logits": False,
    "hidden_act": "silu",
    "rms_norm_eps": 1e-6,
    "rope_theta": 10000.0,
    "rope_scaling": None,
    "max_position_embeddings": MAX_POSITIONS,
    "max_window_layers": LAYERS,
    "sliding_window": None,
    "use_sliding_window": False,
    "attention_bias": False,
    "attention_dropout": 0.0,
    "initializer_range": 0.02,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
    "bos_token_id": 0,
    "eos_token_id": 0,
    "pad_token_id": 0,
    "use_cache": True,
}


def corpus(lines: int = 20000) -> list[str]:
    """Deterministic text: words of a seeded syllable grammar, with digits and punctuation, so the
    BPE learns multi-byte merges and every byte value still has a token."""
    rng = random.Random(0)
    syllables = [c + v for c in "bcdfghjklmnprstvwz" for v in "aeiou"] + ["th", "sh", "qu", "ng"]
    out = []
    for _ in range(lines):
        words = []
        for _ in range(rng.randint(4, 14)):
            word = "".join(rng.choice(syllables) for _ in range(rng.randint(1, 4)))
            if rng.random() < 0.1:
                word = word.capitalize()
            if rng.random() < 0.05:
                word += str(rng.randint(0, 999))
            words.append(word)
        out.append(" ".join(words) + rng.choice(".,;:!?"))
    return out


def build_tokenizer(out: Path) -> None:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB,
        special_tokens=list(SPECIAL),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(corpus(), trainer=trainer)
    if tokenizer.get_vocab_size() != VOCAB:  # the corpus must be rich enough to fill the vocabulary
        raise SystemExit(f"tokenizer has {tokenizer.get_vocab_size()} entries, not {VOCAB}")
    tokenizer.save(str(out / "tokenizer.json"))
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": None,
        "eos_token": SPECIAL[0],
        "pad_token": SPECIAL[0],
        "unk_token": None,
        "model_max_length": MAX_POSITIONS,
        "clean_up_tokenization_spaces": False,
        "add_bos_token": False,
        "chat_template": (
            "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
            "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
        ),
    }
    (out / "tokenizer_config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    (out / "special_tokens_map.json").write_text(
        json.dumps({"eos_token": SPECIAL[0], "pad_token": SPECIAL[0]}, indent=2) + "\n"
    )


def shapes() -> dict[str, tuple[tuple[int, ...], float]]:
    """Every weight of the checkpoint, in Qwen3-MoE's names: shape and the std of its init (0: ones)."""
    table: dict[str, tuple[tuple[int, ...], float]] = {
        "model.embed_tokens.weight": ((VOCAB, HIDDEN), 1.0),
        "model.norm.weight": ((HIDDEN,), 0.0),
        "lm_head.weight": ((VOCAB, HIDDEN), 0.5),
    }
    for layer in range(LAYERS):
        p = f"model.layers.{layer}."
        table[p + "input_layernorm.weight"] = ((HIDDEN,), 0.0)
        table[p + "post_attention_layernorm.weight"] = ((HIDDEN,), 0.0)
        table[p + "self_attn.q_proj.weight"] = ((HEADS * HEAD_DIM, HIDDEN), 0.08)
        table[p + "self_attn.k_proj.weight"] = ((KV_HEADS * HEAD_DIM, HIDDEN), 0.08)
        table[p + "self_attn.v_proj.weight"] = ((KV_HEADS * HEAD_DIM, HIDDEN), 0.08)
        table[p + "self_attn.o_proj.weight"] = ((HIDDEN, HEADS * HEAD_DIM), 0.08)
        table[p + "self_attn.q_norm.weight"] = ((HEAD_DIM,), 0.0)
        table[p + "self_attn.k_norm.weight"] = ((HEAD_DIM,), 0.0)
        # A wide router spread: tokens go to different experts (routing replay has something to show).
        table[p + "mlp.gate.weight"] = ((EXPERTS, HIDDEN), 0.5)
        for expert in range(EXPERTS):
            e = f"{p}mlp.experts.{expert}."
            table[e + "gate_proj.weight"] = ((MOE_INTERMEDIATE, HIDDEN), 0.08)
            table[e + "up_proj.weight"] = ((MOE_INTERMEDIATE, HIDDEN), 0.08)
            table[e + "down_proj.weight"] = ((HIDDEN, MOE_INTERMEDIATE), 0.08)
    return table


def build_weights(out: Path, seed_prefix: str = "") -> int:
    import torch
    from safetensors.torch import save_file

    tensors = {}
    for name, (shape, std) in sorted(shapes().items()):
        if std == 0.0:
            tensors[name] = torch.ones(shape, dtype=torch.bfloat16)
            continue
        # One generator per tensor, seeded by its name: a tensor's bytes never depend on the others.
        seed = int.from_bytes(hashlib.sha256((seed_prefix + name).encode()).digest()[:8], "little")
        generator = torch.Generator().manual_seed(seed)
        tensors[name] = (torch.randn(shape, generator=generator, dtype=torch.float32) * std).to(torch.bfloat16)
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
    return sum(t.numel() for t in tensors.values())


def digest(out: Path) -> str:
    h = hashlib.sha256()
    for path in sorted(out.iterdir()):
        h.update(path.name.encode() + b"\0" + path.read_bytes())
    return h.hexdigest()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", type=Path, help="directory to write (created; existing files are replaced)")
    parser.add_argument("--seed", default="", help="another checkpoint: every weight's seed prefixed with this")
    args = parser.parse_args()
    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)
    build_tokenizer(out)
    params = build_weights(out, args.seed)
    (out / "config.json").write_text(json.dumps(CONFIG, indent=2, sort_keys=True) + "\n")
    generation = {"bos_token_id": 0, "eos_token_id": 0, "do_sample": False}
    (out / "generation_config.json").write_text(json.dumps(generation, indent=2, sort_keys=True) + "\n")
    print(f"{out}: {params / 1e6:.2f} M parameters, digest {digest(out)[:16]}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
