"""The decoding benchmark's peer: Hugging Face ``generate`` on the same weights (needs the ``hf`` extra).

The checkpoint's next-token path (trunk + head 1 + shared norm + unembedding) is exactly a ``LlamaForCausalLM``
(``mtp.interop.llama``; tests/interop checks its logits to 1e-5), so HF greedy decoding is the same function as
mtp's autoregressive decoding: their tokens agree until floating-point rounding breaks a near-tie.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from mtp.interop.llama import head_path_state_dict, llama_config
from mtp.model import MTPModel


@dataclass
class PeerRun:
    outputs: list[list[int]]
    tokens: int
    wall_time_s: float

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.wall_time_s if self.wall_time_s > 0 else 0.0


def hf_llama(model: MTPModel):
    """``transformers.LlamaForCausalLM`` holding ``model``'s next-token path, on its device and in its dtype."""
    import transformers  # optional (the hf extra), and slow to import: only when the peer runs

    config = transformers.LlamaConfig(**llama_config(model.config))
    parameter = next(model.parameters())
    llama = transformers.LlamaForCausalLM(config).to(device=parameter.device, dtype=parameter.dtype).eval()
    llama.load_state_dict(head_path_state_dict(model, 1), strict=True)
    # no special tokens: generation runs to max_new_tokens exactly like mtp's (LlamaConfig's defaults are 1 and 2)
    llama.generation_config.update(bos_token_id=None, eos_token_id=None, pad_token_id=0, do_sample=False)
    return llama


@torch.inference_mode()
def hf_generate(
    llama,
    prompts: list[list[int]],
    max_new_tokens: int,
    prompt_lookup: int = 0,
    static: bool = False,
    eos_id: int | None = None,
) -> PeerRun:
    """Greedy ``generate`` of every prompt alone (batch 1; HF's prompt lookup allows no more), timed together.
    ``static``: with HF's static cache, which ``generate`` itself compiles the decoding step over on CUDA (its
    fastest path: keep the cache as large as the first call's, so later calls reuse it and what was compiled).
    ``eos_id``: a reply stops there, the token itself left out of the output as mtp's decoding leaves it."""
    device = next(llama.parameters()).device
    outputs, wall = [], 0.0
    extra = {"prompt_lookup_num_tokens": prompt_lookup} if prompt_lookup else {}
    if eos_id is not None:
        extra.update(eos_token_id=eos_id, pad_token_id=eos_id)
    if static:
        extra["cache_implementation"] = "static"
    for prompt in prompts:
        ids = torch.tensor([prompt], device=device)
        if device.type == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        out = llama.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_new_tokens, **extra)
        if device.type == "cuda":
            torch.cuda.synchronize()
        wall += time.perf_counter() - start
        output = out[0, len(prompt) :].tolist()
        outputs.append(output[: output.index(eos_id)] if eos_id in output else output)
    return PeerRun(outputs, sum(map(len, outputs)), wall)


def first_divergence(ours: list[list[int]], theirs: list[list[int]]) -> list[tuple[int, int]]:
    """(prompt index, token index) of the first differing token, for every prompt whose outputs differ."""
    found = []
    for i, (a, b) in enumerate(zip(ours, theirs, strict=True)):
        if a != b:
            common = min(len(a), len(b))
            found.append((i, next((j for j in range(common) if a[j] != b[j]), common)))
    return found


@torch.inference_mode()
def top2_margin(model: MTPModel, prompt: list[int], continuation: list[int]) -> float:
    """Head 1's logit margin between its two best tokens after ``prompt + continuation`` (full forward, fp32)."""
    tokens = torch.tensor([prompt + continuation], device=next(model.parameters()).device)
    top = model(tokens)[0, 0, -1].float().topk(2).values
    return float(top[0] - top[1])
