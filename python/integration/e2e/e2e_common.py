"""What the end-to-end scenarios share: the model, its prompts' shape, the
checks and the helpers reading engine logs, process groups and tier files."""

from __future__ import annotations

import glob
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
SCENARIOS = (
    "restart", "cross", "crash", "damage", "preempt", "connector", "capacity", "server", "fleet", "books",
)
#: Tokens per prompt: 18 blocks of 32.
PROMPT_TOKENS = 576
PROMPTS = 6
MAX_TOKENS = 12
#: The model's shape (see make_model), and so a block file's size: K and V
#: of 32 tokens, 4 heads of 64 float32 values, in each of 2 layers.
LAYERS, KV_HEADS, HEAD_DIM = 2, 4, 64
BLOCK_BYTES = LAYERS * 2 * 32 * KV_HEADS * HEAD_DIM * 4
#: The preemption scenario's requests generate 64 tokens, so each grows to
#: 20 blocks; a KV cache of 38 blocks admits a second 18-block prompt beside
#: a running one but cannot hold both as they grow: whenever two run at
#: once, one is preempted. Their first MAX_TOKENS tokens are compared with
#: the baseline (greedy decoding: a longer generation starts with the
#: shorter one).
PREEMPT_BLOCKS, PREEMPT_TOKENS = 38, 64
#: Largest |Δ logprob| accepted between a loaded and a recomputed prefix
#: (float32; seen: under 5e-6).
LOGPROB_TOLERANCE = 1e-3
#: The one traceback vLLM itself logs in every engine run with
#: ``skip_tokenizer_init``: its chat-template warmup needs a tokenizer.
KNOWN_WARNING = "Chat template warmup failed"


class CheckFailed(Exception):
    pass


def check(condition: bool, message: str) -> None:
    if not condition:
        raise CheckFailed(message)


def make_model(directory: Path) -> None:
    """A 2-layer Llama (hidden 256, 4 heads of 64, vocab 8192) with seeded
    float32 weights, saved as safetensors: nothing is downloaded."""
    if (directory / "model.safetensors").exists():
        return
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=8192,
        hidden_size=256,
        intermediate_size=512,
        num_hidden_layers=LAYERS,
        num_attention_heads=KV_HEADS,
        num_key_value_heads=KV_HEADS,
        head_dim=HEAD_DIM,
        max_position_embeddings=2048,
        torch_dtype="float32",
    )
    torch.manual_seed(1234)
    LlamaForCausalLM(config).save_pretrained(directory, safe_serialization=True)



def check_log(name: str, log: str) -> None:
    """No traceback and no BufferError, but vLLM's own warmup warning (each
    of its lines carries the warning's source location)."""
    allowed = set()
    for line in log.splitlines():
        if KNOWN_WARNING in line:
            allowed.add(line.split(KNOWN_WARNING)[0])
    for line in log.splitlines():
        if "Traceback" in line or "BufferError" in line:
            if any(line.startswith(prefix) for prefix in allowed) and "BufferError" not in line:
                continue
            raise CheckFailed(f"{name}: the engine printed\n{line}\n{tail(log)}")


def kv_drift(a: bytes, b: bytes) -> float:
    """The largest difference between two blocks of float32 KV values."""
    import numpy as np

    return float(np.max(np.abs(np.frombuffer(a, np.float32) - np.frombuffer(b, np.float32))))


def wait_for_group(group: int, timeout: float) -> bool:
    """Waits until no process of process group `group` runs (a zombie
    waiting for its parent to reap it runs nothing)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not any(state != "Z" for state in group_states(group)):
            return True
        time.sleep(0.1)
    return False


def group_states(group: int) -> list[str]:
    """The states of the processes in process group `group` (/proc)."""
    states = []
    for stat in glob.glob("/proc/[0-9]*/stat"):
        try:
            fields = open(stat).read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == group:
            states.append(fields[0])
    return states


def tail(log: str, lines: int = 40) -> str:
    return "\n".join(log.splitlines()[-lines:])


def block_files(root: Path) -> list[Path]:
    return [p for p in root.rglob("*.bin") if p.is_file()]


def relative_blocks(root: Path) -> set:
    return {p.relative_to(root) for p in block_files(root)}


def temp_files(root: Path) -> list[Path]:
    return [p for p in root.rglob("*.tmp")]


def rank_dir(root: Path) -> Path:
    [rank] = [p for p in root.iterdir() if p.is_dir() and p.name.endswith("_r0")]
    return rank
