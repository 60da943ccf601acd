"""The decoding benchmark's peer: Hugging Face ``generate`` on the same weights (needs the ``hf`` extra).

The checkpoint's next-token path (trunk + head 1 + shared norm + unembedding) is exactly a ``LlamaForCausalLM``
(``mtp.interop.llama``; tests/interop checks its logits to 1e-5), so HF greedy decoding is the same function as
mtp's autoregressive decoding: their tokens agree until floating-point rounding breaks a near-tie. :class:`HFPeer`
times it in the benchmark's rounds and compares it with mtp's rows; :func:`peer_table` is its table.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from mtp.benchmarks.decode_runs import output_checks
from mtp.benchmarks.humaneval import HumanEvalScorer
from mtp.benchmarks.methods.heads import CHAIN
from mtp.benchmarks.report import pass_cell, same_cell
from mtp.decode.methods.prompt_lookup import LookupDrafter
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
    top = model.next_token_logits(tokens)[0, -1].float().topk(2).values
    return float(top[0] - top[1])


class HFPeer:
    """HF greedy generate and prompt lookup on the same weights and prompts (batch 1), best of the same rounds."""

    def __init__(
        self, model, prompts: list[list[int]], max_new_tokens: int, static: bool = False, eos_id: int | None = None
    ) -> None:
        """``static``: also generate with HF's static cache (compiled on CUDA), warmed up apart; ``eos_id``: where a
        reply stops (None: at --max-new-tokens)."""
        self.model, self.prompts, self.max_new_tokens, self.eos_id = model, prompts, max_new_tokens, eos_id
        self.llama = hf_llama(model)
        hf_generate(self.llama, prompts[:1], 4)  # warm-up
        self.plain = self.lookup = self.static = None
        self.static_warmup_s = None
        if static:  # the longest prompt in full: the static cache every later call reuses, compiled once
            warmup = hf_generate(self.llama, [max(prompts, key=len)], max_new_tokens, static=True, eos_id=eos_id)
            self.static_warmup_s = warmup.wall_time_s
        self.compiled = static and next(self.llama.parameters()).device.type == "cuda"

    def run_round(self) -> None:
        plain = hf_generate(self.llama, self.prompts, self.max_new_tokens, eos_id=self.eos_id)
        lookup = hf_generate(self.llama, self.prompts, self.max_new_tokens, prompt_lookup=10, eos_id=self.eos_id)
        self.plain, self.lookup = faster(self.plain, plain), faster(self.lookup, lookup)
        line = f"   HF generate {plain.tokens_per_s:.1f} tokens/s, prompt lookup {lookup.tokens_per_s:.1f}"
        if self.static_warmup_s is not None:
            static = hf_generate(self.llama, self.prompts, self.max_new_tokens, static=True, eos_id=self.eos_id)
            self.static = faster(self.static, static)
            line += f", static cache {static.tokens_per_s:.1f}"
        print(line, flush=True)

    def compare(self, rows: list[dict], ours: list[list[int]], scorer: HumanEvalScorer | None = None) -> dict:
        """HF's speed beside mtp's (``rows``), and HF's outputs checked against ``ours``, mtp autoregressive
        decoding's at batch 1 (:func:`~mtp.benchmarks.decode_runs.output_checks`)."""
        model, prompts = self.model, self.prompts
        differences = [
            {"prompt": i, "token": j, "top2_margin": top2_margin(model, prompts[i], ours[i][:j])}
            for i, j in first_divergence(ours, self.plain.outputs)
        ]
        greedy1, captured1 = {}, {}  # by heads: eager steps, and steps captured as CUDA graphs (--step-modes)
        for r in rows:
            if (r["mode"], r["batch_size"], r["method"], r["draft_dtype"]) == ("greedy", 1, CHAIN, "auto"):
                (captured1 if r["cuda_graphs"] else greedy1)[r["heads"]] = r
        greedy1 = greedy1 or captured1
        k = max(greedy1)
        lookups = [
            r
            for r in rows
            if (r["mode"], r["batch_size"], r["method"], r["draft_dtype"])
            == ("greedy", 1, LookupDrafter.method, "auto")
        ]
        lookup = max(lookups, key=lambda r: r["tokens_per_s"], default=None)  # the fastest gamma, as HF's is one
        return {
            "hf_generate_tokens_per_s": self.plain.tokens_per_s,
            "hf_prompt_lookup_tokens_per_s": self.lookup.tokens_per_s,
            "mtp_autoregressive_tokens_per_s": greedy1[1]["tokens_per_s"],
            "mtp_self_speculative_heads": k,
            "mtp_self_speculative_tokens_per_s": greedy1[k]["tokens_per_s"],
            "prompt_lookup_equals_hf_greedy": self.lookup.outputs == self.plain.outputs,
            "prompts": len(prompts),
            "greedy_outputs_differ": differences,
            "hf_generate_checks": output_checks(self.plain.outputs, ours, scorer),
            "hf_prompt_lookup_checks": output_checks(self.lookup.outputs, ours, scorer),
            **(
                {
                    "hf_static_tokens_per_s": self.static.tokens_per_s,
                    "hf_static_warmup_s": self.static_warmup_s,
                    "hf_static_compiled": self.compiled,
                    "hf_static_checks": output_checks(self.static.outputs, ours, scorer),
                }
                if self.static is not None
                else {}
            ),
            "mtp_autoregressive_checks": checks_of(greedy1[1]),
            "mtp_self_speculative_checks": checks_of(greedy1[k]),
            **(
                {
                    "mtp_autoregressive_captured_tokens_per_s": captured1[1]["tokens_per_s"],
                    "mtp_self_speculative_captured_tokens_per_s": captured1[k]["tokens_per_s"],
                    "mtp_autoregressive_captured_checks": checks_of(captured1[1]),
                    "mtp_self_speculative_captured_checks": checks_of(captured1[k]),
                }
                if captured1 and greedy1 is not captured1
                else {}
            ),
            **(
                {
                    "mtp_prompt_lookup_gamma": lookup["gamma"],
                    "mtp_prompt_lookup_tokens_per_s": lookup["tokens_per_s"],
                    "mtp_prompt_lookup_checks": checks_of(lookup),
                }
                if lookup
                else {}
            ),
        }


def faster(best: PeerRun | None, run: PeerRun) -> PeerRun:
    """The faster of the best round so far and this one (best of rounds, as mtp's rows)."""
    return run if best is None or run.wall_time_s < best.wall_time_s else best


def checks_of(row: dict) -> dict:
    """A row's output checks: prompts, identical outputs and pass@1, those it has."""
    return {key: row[key] for key in ("prompts", "identical_outputs", "pass_at_1") if key in row}


def peer_table(peer: dict) -> str:
    k = peer["mtp_self_speculative_heads"]
    plain, lookup = peer["hf_generate_tokens_per_s"], peer["hf_prompt_lookup_tokens_per_s"]
    same = peer["prompts"] - len(peer["greedy_outputs_differ"])
    notes = "; ".join(
        f"prompt {d['prompt']} from token {d['token']} (head 1's top-2 logit margin there: {d['top2_margin']:.2g})"
        for d in peer["greedy_outputs_differ"]
    )
    scored = "pass_at_1" in peer["hf_generate_checks"]
    static, compiled = peer.get("hf_static_tokens_per_s"), peer.get("hf_static_compiled")
    static_name = "static cache, compiled" if compiled else "static cache"

    def ours(method: str) -> list[tuple[str, str, float]]:  # (label, key suffix, tokens/s): eager, then captured
        rates = [("", "", peer[f"mtp_{method}_tokens_per_s"])]
        if f"mtp_{method}_captured_tokens_per_s" in peer:
            rates.append((", CUDA graphs", "_captured", peer[f"mtp_{method}_captured_tokens_per_s"]))
        return rates

    def checks(name: str) -> str:  # identical outputs (and pass@1) of one line's method
        found = peer[f"{name}_checks"]
        return same_cell(found) + (f" | {pass_cell(found)}" if scored else "")

    return "\n".join(
        [
            "| greedy, batch 1 | tokens/s | mtp / HF | same tokens as mtp k=1 |" + (" pass@1 |" if scored else ""),
            "|---|---:|---:|---:|" + ("---:|" if scored else ""),
            f"| HF generate | {plain:,.1f} | | {checks('hf_generate')} |",
            *([f"| HF generate, {static_name} | {static:,.1f} | | {checks('hf_static')} |"] if static else []),
            *(
                f"| mtp autoregressive (k=1{label}) | {rate:,.1f} | {rate / plain:.2f}x HF generate"
                + (f", {rate / static:.2f}x its {static_name}" if static else "")
                + f" | {checks('mtp_autoregressive' + key)} |"
                for label, key, rate in ours("autoregressive")
            ),
            f"| HF prompt lookup (10 tokens) | {lookup:,.1f} | | {checks('hf_prompt_lookup')} |",
            *(  # a model without heads has no self-speculative row: its k=1 is the autoregressive row above
                [
                    f"| mtp self-speculative (k={k}{label}) | {rate:,.1f} | {rate / lookup:.2f}x HF prompt lookup "
                    f"| {checks('mtp_self_speculative' + key)} |"
                    for label, key, rate in ours("self_speculative")
                ]
                if k > 1
                else []
            ),
            *(
                [
                    f"| mtp prompt lookup (gamma {peer['mtp_prompt_lookup_gamma']}) "
                    f"| {peer['mtp_prompt_lookup_tokens_per_s']:,.1f} "
                    f"| {peer['mtp_prompt_lookup_tokens_per_s'] / lookup:.2f}x HF prompt lookup "
                    f"| {checks('mtp_prompt_lookup')} |"
                ]
                if "mtp_prompt_lookup_tokens_per_s" in peer
                else []
            ),
            "",
            f"HF greedy tokens equal mtp's autoregressive ones for {same} of {peer['prompts']} prompts"
            + (f"; they part where rounding breaks a near-tie: {notes}." if notes else ".")
            + f" HF prompt lookup equals HF greedy: {'yes' if peer['prompt_lookup_equals_hf_greedy'] else 'no'}."
            + (
                f" HF's {static_name}: its warm-up (the longest prompt{', compiled' if compiled else ''}) took "
                f"{peer['hf_static_warmup_s']:.1f} s, outside its rate."
                if static
                else ""
            ),
        ]
    )
