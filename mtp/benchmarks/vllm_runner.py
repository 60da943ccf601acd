"""vLLM's side of the vLLM peer (mtp.benchmarks.vllm_peer): run by the python of vLLM's own virtual environment
(tools/vllm_cpu.sh), never imported by mtp, importing nothing of mtp (that environment has vLLM and not mtp).

    VENV/bin/python mtp/benchmarks/vllm_runner.py SPEC.json OUT.json

SPEC.json: ``{"model": HF_DIR, "speculative_config": {...} or null, "prompts": [[token ids], ...], "max_tokens": N,
"stop_token_ids": [...], "max_model_len": L, "dtype": "float32", "batch_one": true}``. Every prompt is given as token
ids (vLLM's ``TokensPrompt``), so vLLM reads the tokens mtp's decoders read; decoding is greedy (temperature 0),
stopping at ``stop_token_ids`` (and at end-of-text unless ``ignore_eos``). The first prompt is decoded once unmeasured
(vLLM's first steps compile and allocate), then every prompt is decoded, timed: one at a time with ``batch_one`` (a
batch of one, as the benchmark's peers compare), else all in one call; tokens per second over the summed wall time.
OUT.json: each prompt's generated token ids, the wall time, the tokens, and
vLLM's speculative-decoding counters from ``LLM.get_metrics()`` (drafts, draft tokens, accepted tokens and accepted
tokens per draft position), or an ``error`` with vLLM's message when it refused the model.

The engine starts under ``if __name__ == "__main__"``: vLLM spawns its engine process, which imports this module again.
"""

from __future__ import annotations

import json
import sys
import time
import traceback


def counters(llm) -> dict:
    """vLLM's speculative-decoding counters (v1 engine metrics), summed over everything the engine has decoded."""
    from vllm.v1.metrics.reader import Counter, Vector  # vLLM's environment only

    found: dict = {}
    for metric in llm.get_metrics():
        name = metric.name.removeprefix("vllm:")
        if not name.startswith("spec_decode"):
            continue
        if isinstance(metric, Counter):
            found[name] = found.get(name, 0) + metric.value
        elif isinstance(metric, Vector):
            previous = found.get(name, [0] * len(metric.values))
            found[name] = [a + b for a, b in zip(previous, metric.values, strict=False)]
    return found


def run(spec: dict) -> dict:
    from vllm import LLM, SamplingParams  # vLLM's environment only
    from vllm.inputs import TokensPrompt

    llm = LLM(
        model=spec["model"],
        tokenizer=spec.get("tokenizer", spec["model"]),
        speculative_config=spec.get("speculative_config"),
        dtype=spec.get("dtype", "float32"),
        max_model_len=spec.get("max_model_len", 2048),
        seed=0,
        disable_log_stats=False,
        enforce_eager=spec.get("enforce_eager", False),
    )
    params = SamplingParams(
        temperature=0.0,
        max_tokens=spec["max_tokens"],
        ignore_eos=spec.get("ignore_eos", False),
        stop_token_ids=spec.get("stop_token_ids") or None,
    )
    prompts = [TokensPrompt(prompt_token_ids=ids) for ids in spec["prompts"]]
    # batch 1: one prompt a call, as the peers' comparison decodes; otherwise every prompt in one call
    batches = [[prompt] for prompt in prompts] if spec.get("batch_one", True) else [prompts]
    llm.generate(batches[0], params, use_tqdm=False)  # warm-up: compiled steps and allocations, unmeasured
    before = counters(llm)
    outputs, wall = [], 0.0
    for batch in batches:
        start = time.perf_counter()
        outputs += llm.generate(batch, params, use_tqdm=False)
        wall += time.perf_counter() - start
    after = counters(llm)
    spec_counters = {
        name: [a - b for a, b in zip(value, before.get(name, [0] * len(value)), strict=False)]
        if isinstance(value, list)
        else value - before.get(name, 0)
        for name, value in after.items()
    }
    tokens = [list(output.outputs[0].token_ids) for output in outputs]
    return {"tokens": tokens, "wall_s": wall, "generated": sum(map(len, tokens)), "counters": spec_counters}


def main(argv: list[str]) -> int:
    spec_path, out_path = argv
    with open(spec_path) as f:
        spec = json.load(f)
    try:
        result = run(spec)
    except Exception as err:  # vLLM's refusal, quoted on the results page
        result = {"error": f"{type(err).__name__}: {err}", "traceback": traceback.format_exc()[-4000:]}
    with open(out_path, "w") as f:
        json.dump(result, f)
    return 0 if "error" not in result else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
