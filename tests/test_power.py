"""Tests with power: plausible one-line bugs, each applied to a copy of the project, must make the suite fail.

A test proves a promise only if a plausible bug makes it fail. Every entry of MUTATIONS names one such bug: where
it goes (the function or class of that qualified name, in whichever module defines it, so that moving code between
modules keeps the entry), the exact text it replaces (once there; a change to that text fails here and gets the
entry updated) and the tests that guard that behaviour. The slow test applies each mutation to
a fresh copy of the project and runs those tests against the copy (in a child forked from one runner process
that has imported torch once, tests/mutation_runner.py): they must fail. Add an
entry with every exactness promise you add (a new drafter, verifier, cache operation or loss mode).
"""

from __future__ import annotations

import ast
import functools
import json
import os
import re
import shutil
import subprocess
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
COPIED = ("mtp", "tests", "conf", "scripts", "pyproject.toml")

LOSSLESS = "tests/decode/test_lossless.py::test_self_speculative_sampling_has_the_autoregressive_distribution"
PROCESSING = "tests/decode/test_lossless.py::test_processed_probs_equal_the_reference"
GREEDY = "tests/decode/test_generate.py"
LAYOUT = "tests/decode/test_generate.py::test_greedy_decoding_equals_the_reference_in_either_matrix_layout"
GREEDY_BY_CHANCE = f"{GREEDY}::test_greedy_self_speculative_equals_autoregressive_when_drafts_pass_and_fail_at_random"
GREEDY_EXACT = (  # greedy decoding against the cache-free reference (not the file: it also compiles)
    f"{GREEDY}::test_greedy_decoding_equals_the_cache_free_reference_on_a_random_model",
    f"{GREEDY}::test_greedy_decoding_equals_the_cache_free_reference_when_drafts_pass",
    GREEDY_BY_CHANCE,
)
CACHE = "tests/decode/test_cache.py"
EAGLE3_BY_HAND = "tests/test_model.py::test_eagle3_heads_draft_as_eagle3_decodes"
ENGINES = "tests/interop/test_engines.py"
MIMO = "tests/interop/test_mimo.py"
REFERENCE = "tests/interop/test_llama_reference.py"
MODEL = "tests/test_model.py"
LEGACY = "tests/test_legacy_checkpoints.py"
LOSS = "tests/test_loss.py"
RELIABILITY = "tests/test_reliability.py"
CONCURRENT = "tests/data/test_concurrent_prepare.py"
TREE_GREEDY = ("tests/decode/test_tree.py::test_greedy_tree_decoding_equals_autoregressive",)
TREE = "tests/decode/test_tree.py"
HEADS_CHOICE = "tests/decode/test_heads_choice.py"
CURVE = "tests/test_task_curve.py"
SWEEPS = "tests/test_sweeps.py"
TP_GRADIENTS = "tests/test_tensor_parallel.py::test_tensor_parallel_gradients_equal_one_process"
EVAL_TASK = "tests/test_eval_task.py"
CORPUS_LOSS = f"{EVAL_TASK}::test_a_corpus_model_is_scored_by_its_held_out_loss_as_training_validates_and_by_its_drafts"
TREE_LOSSLESS = (
    "tests/decode/test_lossless.py::test_tree_and_adaptive_sampling_have_the_autoregressive_distribution",
    "tests/decode/test_lossless.py::test_tree_and_cut_sampling_lossless_with_head_blocks",
    "tests/decode/test_lossless.py::test_tree_sampling_with_leaves_unembedded_apart",
)
DRAFTERS = "tests/decode/test_drafters.py"
DRAFTER_CACHE = (f"{DRAFTERS}::test_draft_model_proposals_follow_the_accepted_tokens",)
DRAFTED_LOSSLESS = f"{DRAFTERS}::test_drafted_sampling_has_the_autoregressive_distribution"
INT8 = "tests/decode/test_int8.py"
QUANTIZE = "tests/decode/test_quantize.py"
LAYER_SKIP = "tests/decode/test_layer_skip.py"
SUBLAYER_LOGITS = (f"{LAYER_SKIP}::test_sublayer_draft_logits_equal_the_modules_with_those_sublayers_skipped",)
SUBLAYER_SEARCH = f"{LAYER_SKIP}::test_the_sublayer_search_finds_the_same_set_twice_within_its_budget"
META_LOGITS = "tests/interop/test_meta.py::test_imported_meta_checkpoint_computes_what_meta_code_computes"
META_TOKENIZER = "tests/interop/test_meta.py::test_meta_tokenizer_converts_to_the_same_ids_and_text"
GGUF = "tests/interop/test_gguf.py"
GGUF_LOGITS = f"{GGUF}::test_logits_and_ids_equal_transformers_gguf_loader[output]"
GGUF_TIED = f"{GGUF}::test_logits_and_ids_equal_transformers_gguf_loader[tied]"
HF_ROUND_TRIP = "tests/interop/test_hf.py::test_round_trip_gives_every_tensor_back_and_names_any_lost_one[transformer]"
SPECTR = "tests/decode/test_spectr.py"
SPECTR_LOSSLESS = (
    f"{SPECTR}::test_several_sequences_of_the_heads_sample_the_autoregressive_distribution",
    f"{SPECTR}::test_spectr_lossless_with_head_blocks",
)
BOUNDED = "tests/decode/test_acceptance.py::test_bounded_chain_tests_decide_as_the_processed_distributions_do"
BOUNDED_TREE = "tests/decode/test_acceptance.py::test_bounded_tree_tests_decide_as_the_processed_distributions_do"
DISTINCT_RULE = "tests/decode/test_acceptance.py::test_a_distinct_sibling_is_tested_without_the_elder_ones"
DISTINCT_RAN_OUT = "tests/decode/test_acceptance.py::test_a_distinct_sibling_drawn_after_its_law_ran_out_is_not_tried"
DISTINCT_DRAWS = (
    "tests/decode/test_acceptance.py::test_distinct_draws_take_the_inverse_cdf_of_what_is_left",
    "tests/decode/test_acceptance.py::test_distinct_draws_have_the_law_of_sampling_without_replacement",
)
TOP_DRAFTS_LOSSLESS = (
    f"{LOSSLESS}[3heads_T0.7_topp0.9_top_drafts]",
    "tests/decode/test_lossless.py::test_tree_and_adaptive_sampling_have_the_autoregressive_distribution[tree_top_drafts]",
    "tests/decode/test_lossless.py::test_tree_and_cut_sampling_lossless_with_head_blocks[tree-causal-top_drafts]",
    "tests/decode/test_lossless.py::test_tree_and_cut_sampling_lossless_with_head_blocks[chain-transformer-top_drafts]",
)
LLAMA_CPP = "tests/benchmarks/test_llama_cpp.py"
RESUME = "tests/test_train.py::test_resume_mid_epoch_continues_the_data_order[validation1]"  # no validation save


@dataclass(frozen=True)
class Mutation:
    name: str
    within: str
    """Where the text is: the function or class of that qualified name (``KVCache.begin``, ``outer.inner``), in
    whichever module of mtp/ defines it, so that moving code between modules keeps the entry; text at a module's top
    level names the module (``mtp.interop.tokenizer``)."""
    original: str
    """Text that occurs exactly once there."""
    mutated: str
    guards: tuple[str, ...]
    """Tests (pytest node ids or files) of which at least one must fail."""


JAIL_TESTS = "tests/benchmarks/test_jail.py"
HOSTILE = f"{JAIL_TESTS}::test_a_hostile_program_ends_contained"
KERNEL_REFUSES = f"{JAIL_TESTS}::test_the_kernel_refuses_below_the_python_guards"
TASKS_TESTS = "tests/data/test_tasks.py"
BENCHMARK_CHECK = f"{TASKS_TESTS}::test_the_check_finds_a_humaneval_problem_whatever_its_spacing_and_name"
FOLDER_REFUSED = f"{TASKS_TESTS}::test_a_folder_holding_a_humaneval_problem_is_refused_naming_the_function"
CHAT_CARRIED = "tests/test_init_from.py::test_the_start_models_chat_template_travels_with_the_heads_trained_on_it"
SPANS_ROUNDED = (
    "tests/decode/test_cache.py::test_cached_steps_with_spans_rounded_up_equal_the_full_forward",
    "tests/decode/test_tree.py::test_tree_decoding_with_spans_rounded_up_equals_autoregressive",
)
METHODS = "tests/test_methods.py"
PROMPT_STEP = "tests/decode/test_memory.py::test_a_prompts_step_is_sized_by_the_logits_it_reads_its_last_position"
GRAPHS = "tests/decode/test_graphs.py"
MUTATIONS = [
    # -- the commands' compiled step by default
    Mutation(
        "the commands' step eager on a CPU unless --compile is given (the device never decides)",
        "compiled",
        "return device.type in COMPILED_ON if asked is None else asked",
        "return bool(asked)",
        (
            "tests/test_decode_scripts.py::test_the_commands_compile_a_cpus_step_unless_told_not_to_and_a_cuda_step_when_told_to",
        ),
    ),
    Mutation(
        "the benchmark's step takes --compile as typed, never compiled by default",
        "settings_of",
        'compile_ = compiled(values["compile"], device)',
        'compile_ = bool(values["compile"])',
        ("tests/test_bench_schema.py::test_the_benchmark_compiles_a_cpus_step_unless_told_not_to",),
    ),
    Mutation(
        "decode.py compiles and measures its layouts inside its timed decode (no warm-up)",
        "warm_up",
        "    for plan in plans:\n        generate(",
        "    for plan in ():\n        generate(",
        ("tests/test_decode_scripts.py::test_decode_warms_its_steps_up_before_the_timed_decodes",),
    ),
    # -- captured steps
    Mutation(
        "a replay reads the cache's slots, positions and mask of the step it was captured on",
        "_Graph.__call__",
        "getattr(self.view, name).copy_(getattr(cache, name))",
        "pass",
        (GRAPHS,),
    ),
    Mutation(
        "a replay reads the tokens it was captured on",
        "_Graph.__call__",
        "owned.copy_(tensor)",
        "pass",
        (GRAPHS,),
    ),
    Mutation(
        "graphs keyed without the cache's per-step shapes (a longer span replays a shorter one's graph)",
        "StepGraphs.run",
        "key = (name, cache.keys.data_ptr(), shapes, cached)",
        "key = (name, cache.keys.data_ptr(), shapes[:1])",
        (GRAPHS,),
    ),
    Mutation(
        "each cache gets new storage, so that no graph is replayed across calls",
        "StepGraphs.cache_storage",
        "if key not in self.storage:",
        "if True:",
        (GRAPHS,),
    ),
    Mutation(
        "rows that leave the batch are compacted into new storage, so that no later call replays a smaller batch",
        "KVCache.keep_rows",
        "if self.storage is not None:  # into the storage's first rows",
        "if False:",
        (GRAPHS,),
    ),
    Mutation(
        "the time spent capturing steps counted in the decoding rate",
        "DecodeStats.decoding_s",
        "return self.wall_time_s - self.capture_s",
        "return self.wall_time_s",
        ("tests/decode/test_stats.py",),
    ),
    Mutation(
        "graphs of storages no longer kept are never let go",
        "StepGraphs.forget",
        "self.graphs = {key: graph for key, graph in self.graphs.items() if key[1] in kept}",
        "pass",
        (GRAPHS,),
    ),
    # -- lossless sampling
    Mutation(
        "accept with probability min(1, q) instead of min(1, q/p)",
        "accept_drafts",
        "return uniforms * proposal < target",
        "return uniforms < target",
        (LOSSLESS,),
    ),
    Mutation(
        "after a rejection, sample from q instead of the residual",
        "correction_probs",
        "residual = (target - proposal * rejected[:, None]).clamp_(min=0)",
        "residual = target.clone()",
        (LOSSLESS,),
    ),
    Mutation(
        "bonus token from the residual although every draft passed",
        "correction_probs",
        "residual = (target - proposal * rejected[:, None]).clamp_(min=0)",
        "residual = (target - proposal).clamp_(min=0)",
        (LOSSLESS,),
    ),
    Mutation(
        "temperature / top-k / top-p on the proposal but not on the target",
        "Rule.target",
        "return processed_probs(logits, c.temperature, c.top_k, c.top_p)",
        "return processed_probs(logits, 1.0)",
        (LOSSLESS,),
    ),
    Mutation(
        "residual built from the first draft's proposal instead of the rejected one's",
        "Lossless.chain",
        "p_first_rejected = proposals[rows, first_rejected]  # (B, V)",
        "p_first_rejected = proposals[rows, 0]",
        (LOSSLESS,),
    ),
    Mutation(
        "a top-ranked draft tested against half its target probability (a proposal of mass 2)",
        "Lossless.chain",
        "p = torch.ones(drafts.shape, device=drafts.device)",
        "p = torch.full(drafts.shape, 2.0, device=drafts.device)",
        TOP_DRAFTS_LOSSLESS,
    ),
    Mutation(
        "a rejected top-ranked draft left in the law the next token is drawn from",
        "one_hot_law",
        "return F.one_hot(tokens, like.size(-1)).to(like.dtype)",
        "return torch.zeros_like(like)",
        TOP_DRAFTS_LOSSLESS,
    ),
    Mutation(
        "a draw without replacement scaled to the whole mass, not what is left",
        "sample_distinct",
        "point = point * (total - mass.sum(dim=-1)).clamp(min=0)",
        "point = point * total",
        (*TREE_LOSSLESS, *DISTINCT_DRAWS),
    ),
    Mutation(
        "a tree's sibling drawn without replacement tested against the full law, as if drawn independently",
        "without_drawn",
        "rest = proposal.scatter(1, drawn, 0.0)",
        "rest = proposal",
        (*TREE_LOSSLESS, DISTINCT_RULE),
    ),
    Mutation(
        "the heads' proposal does not say its tree's siblings were drawn without replacement",
        "HeadsProposer.draft_in_step",
        "distinct=tree is not None and distinct)",
        "distinct=False)",
        TREE_LOSSLESS,
    ),
    Mutation(
        "a distinct sibling drawn after its law ran out is tried, with no proposal mass",
        "Lossless.tree",
        "trying = trying & (p > 0)  # a child",
        "trying = trying  # a child",
        (*TREE_LOSSLESS, DISTINCT_RAN_OUT),
    ),
    Mutation(
        "a draw without replacement not moved past the tokens drawn before it",
        "sample_distinct",
        "point = point + mass[..., i] * (point >= start[..., i])",
        "point = point + 0 * mass[..., i] * (point >= start[..., i])",
        (*TREE_LOSSLESS, *DISTINCT_DRAWS),
    ),
    Mutation(
        "a top-ranked tree node's one-hot proposal put on its parent's token",
        "Lossless.tree",
        "proposal = laws.of(child, tree) if laws is not None else one_hot_law(token, remaining)",
        "proposal = laws.of(child, tree) if laws is not None else one_hot_law(inputs[rows, node], remaining)",
        TOP_DRAFTS_LOSSLESS,
    ),
    Mutation(
        "a bounded test passes a draft outside head 1's nucleus",
        "nucleus_passes",
        "surely_passes = inside & accept_drafts(uniforms, proposal, sx)",
        "surely_passes = accept_drafts(uniforms, proposal, sx)",
        (LOSSLESS, BOUNDED),
    ),
    Mutation(
        "a bounded test takes the nucleus' mass as 1 when deciding a failure",
        "nucleus_passes",
        "surely_fails = ~inside | ~accept_drafts(uniforms, proposal, sx / np.maximum(above + sx, top_p))",
        "surely_fails = ~inside | ~accept_drafts(uniforms, proposal, sx)",
        (LOSSLESS, BOUNDED),
    ),
    Mutation(
        "a bounded tree try passes a first child outside head 1's nucleus",
        "Lossless._surely_pass",
        "passes = (above < self.sampling.top_p) & accept_drafts(uniform.numpy(), p.float().numpy(), sx)",
        "passes = accept_drafts(uniform.numpy(), p.float().numpy(), sx)",
        (BOUNDED_TREE,),
    ),
    Mutation(
        "a bounded tree try decided by one row for all",
        "Lossless._surely_pass",
        "return bool((passes | ~trying.numpy()).all())",
        "return bool((passes | ~trying.numpy()).any())",
        (BOUNDED_TREE,),
    ),
    Mutation(
        "rows a tree's exact try moves keep the law of the node they left",
        "Lossless.tree",
        "fresh = moved if fresh is None else fresh | moved",
        "fresh = fresh",
        (BOUNDED_TREE,),
    ),
    Mutation(
        "a tree walk that ends on a node whose law was never processed samples from nothing there",
        "Lossless.tree",
        "if fresh is not None and (fresh & ~at_leaf).any():",
        "if False:",
        (BOUNDED_TREE,),
    ),
    Mutation(
        "a node's proposal probability read from the wrong law",
        "NodeLaws.probability",
        "return self.probs[rows, self.law_index(tree, nodes.device)[nodes], tokens]",
        "return self.probs[rows, self.law_index(tree, nodes.device)[nodes - 1], tokens]",
        (BOUNDED_TREE,),
    ),
    Mutation(
        "an undecided bounded test taken as a failure instead of falling back",
        "nucleus_passes",
        "    return torch.from_numpy(surely_passes), torch.from_numpy((undecided & decisive).any(axis=1))",
        "    return torch.from_numpy(surely_passes), torch.zeros(len(sx), dtype=torch.bool)",
        (BOUNDED,),
    ),
    Mutation(
        "the law after the accepted drafts read after the first draft whatever was accepted",
        "Lossless.chain",
        "else self.target(head1[rows, accepted])",
        "else self.target(head1[rows, accepted.clamp(max=0)])",
        (LOSSLESS,),
    ),
    Mutation(
        "tempered drafts drawn from the law with top-p (a law that is not the one returned)",
        "Plan.proposal_top_p",
        'return 1.0 if choice == "tempered" or auto_tempered else self.sampling.top_p',
        "return self.sampling.top_p",
        ("tests/decode/test_lossless.py::test_sampled_drafts_come_from_the_law_the_choice_names",),
    ),
    Mutation(
        "the token after the drafts reuses the first acceptance uniform",
        "Lossless.chain",
        "return accepted, sample_from(law, self.layout.next_token(draws))",
        "return accepted, sample_from(law, draws[:, 0])",
        (LOSSLESS,),
    ),
    Mutation(
        "one seed for every row",
        "RowUniforms.__init__",
        "torch.Generator().manual_seed(seed + row)",
        "torch.Generator().manual_seed(seed)",
        (LOSSLESS, f"{GREEDY}::test_each_row_equals_decoding_it_alone"),
    ),
    Mutation(
        "top-p drops the token that crosses the threshold",
        "nucleus_floor",
        "kept = (before < top_p).sum(dim=-1, keepdim=True)  # at least 1: nothing is ahead of the first",
        "kept = (before + ordered < top_p).sum(dim=-1, keepdim=True)",
        (PROCESSING,),
    ),
    Mutation(
        "the CPU nucleus' candidates leave out tokens that can be in a nucleus",
        "nucleus_candidates",
        "m = max(1, int((probs > (1 - top_p) / V).sum(dim=-1).max()))",
        "m = max(1, int((probs > (1 - top_p) / 16).sum(dim=-1).max()))",
        ("tests/decode/test_lossless.py::test_top_p_over_a_large_vocabulary_equals_the_full_sort",),
    ),
    Mutation(
        "the CPU argmax takes the last of equal maxima",
        "top_tokens",
        "return torch.from_numpy(np.asarray(np.argmax(logits.detach().numpy(), axis=-1)))",
        "return logits.size(-1) - 1 - torch.from_numpy(np.asarray(np.argmax(logits.numpy()[..., ::-1], axis=-1)))",
        ("tests/decode/test_acceptance.py::test_top_tokens_are_torch_argmax_the_first_of_equal_maxima",),
    ),
    Mutation(
        "the CPU argmax over the wrong dimension",
        "top_tokens",
        "return torch.from_numpy(np.asarray(np.argmax(logits.detach().numpy(), axis=-1)))",
        "return torch.from_numpy(np.asarray(np.argmax(logits.detach().numpy(), axis=0)))",
        (
            "tests/decode/test_acceptance.py::test_top_tokens_are_torch_argmax_the_first_of_equal_maxima",
            GREEDY_BY_CHANCE,
        ),
    ),
    Mutation(
        "a tree's test after an untried sibling reads that sibling's uniform",
        "Lossless.tree",
        "                    test += 1\n                    continue",
        "                    continue",
        (
            "tests/decode/test_acceptance.py::test_lossless_tree_each_test_reads_its_own_uniform_when_siblings_go_untried",
        ),
    ),
    Mutation(
        "a failed tree try leaves the target as it was on CPU",
        "Lossless.tree",
        "if not skips or rejected.any():  # a row's target changes only when its try fails",
        "if not skips:  # a row's target changes only when its try fails",
        (
            "tests/decode/test_acceptance.py::test_lossless_tree_each_test_reads_its_own_uniform_when_siblings_go_untried",
        ),
    ),
    Mutation(
        "top-k drops the k-th token",
        "processed_probs",
        'logits = logits.masked_fill(logits < kth, float("-inf"))',
        'logits = logits.masked_fill(logits <= kth, float("-inf"))',
        (PROCESSING,),
    ),
    # -- greedy exactness
    Mutation(
        "greedy accepts one draft more than match",
        "Greedy.chain",
        "accepted = accepted_prefix((drafts == choice[:, :-1]) & present)",
        "accepted = (accepted_prefix((drafts == choice[:, :-1]) & present) + 1).clamp(max=drafts.size(1))",
        GREEDY_EXACT,
    ),
    Mutation(
        "greedy counts every matching draft, not the matching prefix",
        "accepted_prefix",
        "return passes.long().cumprod(dim=1).sum(dim=1)",
        "return passes.long().sum(dim=1)",
        (GREEDY_BY_CHANCE,),
    ),
    # -- KV cache
    Mutation(
        "the cache keeps one position too few after verification",
        "_Run.commit",
        "cache.rollback(kept, held_on_device + base + accepted + 1)",
        "cache.rollback(kept, held_on_device + base + accepted)",
        GREEDY_EXACT,
    ),
    Mutation(
        "the cache's host-side lengths keep one position too few",
        "_Run.commit",
        "kept = [held[i] + h[0] + 1 + step.first_base[i] for i, h in enumerate(host)]",
        "kept = [held[i] + h[0] + step.first_base[i] for i, h in enumerate(host)]",
        GREEDY_EXACT,
    ),
    Mutation(
        "a new position does not attend to itself",
        "KVCache.begin",
        "self.mask = keys[None, None, None, :] <= positions[:, None, :, None]",
        "self.mask = keys[None, None, None, :] < positions[:, None, :, None]",
        (CACHE,),
    ),
    Mutation(
        "cached positions are off by one for rotary",
        "KVCache.begin",
        "positions = self.lengths[:, None] + torch.arange(new, device=device)",
        "positions = self.lengths[:, None] + 1 + torch.arange(new, device=device)",
        (CACHE,),
    ),
    # -- draft trees
    Mutation(
        "tree nodes at their slot's position instead of the root's plus their depth",
        "KVCache.begin",
        'self.rotary = self.lengths[:, None] + tree["depth"][:new]',
        "self.rotary = positions",
        TREE_GREEDY,
    ),
    Mutation(
        "tree nodes attend to every earlier node, not only their ancestors",
        "KVCache.begin",
        'attends = tree["attends"][:new, :new]  # (S, S)',
        "attends = torch.ones(new, new, dtype=torch.bool, device=device).tril()",
        TREE_GREEDY,
    ),
    Mutation(
        "the accepted path's keys and values are left where the tree put them",
        "KVCache.keep_path",
        "source = self.lengths[:, None] + path",
        "source = self.lengths[:, None] + torch.arange(path.size(1), device=path.device)",
        TREE_GREEDY,
    ),
    Mutation(
        "a tree node is accepted without its parent",
        "_deepest_path",
        "ok[:, nodes] &= ok[:, parent[nodes]]",
        "ok[:, nodes] &= True",
        TREE_GREEDY,
    ),
    Mutation(
        "siblings are tested against the unnormalized rest of the target",
        "sibling_passes",
        "return uniform * proposal * remaining.sum(dim=-1) < token_probability",
        "return uniform * proposal < token_probability",
        TREE_LOSSLESS,
    ),
    Mutation(
        "a rejected sibling's proposal is not taken out of the target",
        "residual_after_rejection",
        "return torch.where(rejected[:, None], residual, remaining)",
        "return remaining",
        TREE_LOSSLESS,
    ),
    Mutation(
        "a row that ends at a leaf takes its bonus token from the root's distribution",
        "Lossless.tree",
        "at_leaf = slot[node] < 0",
        "at_leaf = slot[node] < -1",
        TREE_LOSSLESS,
    ),
    Mutation(
        "the residual after a rejection applies to a draft that was cut",
        "Lossless.chain",
        "law = correction_probs(after, p_first_rejected, accepted < live)",
        "law = correction_probs(after, p_first_rejected, accepted < D)",
        TREE_LOSSLESS,
    ),
    # -- the packed inference form
    Mutation(
        "rotary pairs packed as (2i, 2i + 1) of the original layout",
        "rotary_permutation",
        "return torch.stack([torch.arange(half), torch.arange(half) + half], dim=1).flatten()",
        "return torch.arange(head_dim)",
        (CACHE,),
    ),
    Mutation(
        "the attention norm's weight is not folded into q/k/v",
        "PackedBlocks.__init__.qkv",
        "return block.attention_norm.weight[:, None] * w",
        "return w",
        (CACHE,),
    ),
    Mutation(
        "a weight-major product's rows come back in the wrong layout (right shape)",
        "product",
        "    return out[..., :rows].transpose(1, 2).contiguous() if by_weight else out",
        "    return out[..., :rows].reshape(x.size(0), x.size(1), -1) if by_weight else out",
        (LAYOUT,),
    ),
    Mutation(
        "the blocks' derived copies leave the attention output matrix as it was (the weight-major one: (in, out))",
        "PackedBlocks._with",
        'for name in ("qkv", "wo", "gate_up", "down"):',
        'for name in ("qkv", "gate_up", "down"):',
        (LAYOUT,),
    ),
    Mutation(
        "the unembedding's weight-major logits come back in the wrong layout (right shape)",
        "Unembedding.rows_by_weight",
        "return torch.mm(self.weight, paired(rows).T)[:, : rows.size(0)].T.contiguous()",
        "return torch.mm(self.weight, paired(rows).T)[:, : rows.size(0)].reshape(rows.size(0), -1)",
        (LAYOUT, CACHE),
    ),
    Mutation(
        "the final norm's weight is not folded into head 1's unembedding",
        "InferenceModel.__init__",
        "self.head1_output = Unembedding(model.unembedding(1).weight * final_norm)",
        "self.head1_output = Unembedding(model.unembedding(1).weight)",
        (CACHE,),
    ),
    Mutation(
        "draft heads stacked in reverse order",
        "ParallelBlocks.__init__",
        "[model.head_block(k) for k in range(2, form.heads + 1)]",
        "[model.head_block(k) for k in range(form.heads, 1, -1)]",
        (CACHE,),
    ),
    Mutation(
        "the draft heads' attention output is read at the step's first position",
        "block_step",
        "x, q, mask, S = x[:, rows, last, None], q[:, rows, last, None], mask[rows, :, last][:, :, None], 1",
        "x, q, mask, S = x[:, rows, last, None], q[:, rows, 0, None], mask[rows, :, last][:, :, None], 1",
        (CACHE,),
    ),
    Mutation(
        "the draft heads' one query attends under the step's first position's mask",
        "block_step",
        "x, q, mask, S = x[:, rows, last, None], q[:, rows, last, None], mask[rows, :, last][:, :, None], 1",
        "x, q, mask, S = x[:, rows, last, None], q[:, rows, last, None], mask[:, :, 0][:, :, None], 1",
        (CACHE,),
    ),
    Mutation(
        "the compiled step's rotary turns the wrong way",
        "rotate",
        "a * sin + b * cos",
        "a * sin - b * cos",
        (f"{CACHE}::test_cached_steps_equal_the_full_forward_for_ragged_rows[transformer-compiled]",),
    ),
    Mutation(
        "drafts made after the step's first input instead of the last accepted one",
        "_Run.verify",
        "last = step.base + verdict.accepted",
        "last = step.base",
        (f"{GREEDY}::test_greedy_decoding_equals_the_cache_free_reference_when_drafts_pass",),
    ),
    Mutation(
        "the prompt's step reads head 1 at every position",
        "_verify",
        "inference.verify(inputs, cache, None if n_drafts else base[:, None])",
        "inference.verify(inputs, cache, None)",
        GREEDY_EXACT,
    ),
    Mutation(
        "every step reuses the first step's uniforms",
        "RowUniforms.next",
        "self.step += 1",
        "self.step += 0",
        (LOSSLESS,),
    ),
    # -- the model against an independent reference
    Mutation(
        "sign of one rotary term flipped",
        "apply_rotary",
        "x1 * sin + x2 * cos",
        "x1 * sin - x2 * cos",
        (REFERENCE,),
    ),
    Mutation(
        "SwiGLU gate and up projections swapped",
        "FeedForward.forward",
        "return self.w2(F.silu(self.w1(x)) * self.w3(x))",
        "return self.w2(F.silu(self.w3(x)) * self.w1(x))",
        (REFERENCE,),
    ),
    Mutation(
        "RMSNorm forgets its weight",
        "rms_norm",
        "return normed.type_as(x) * weight",
        "return normed.type_as(x)",
        (REFERENCE,),
    ),
    Mutation(
        "attention output without the residual",
        "Block.forward",
        "x = x + self.attention(self.attention_norm(x), cos, sin)",
        "x = self.attention(self.attention_norm(x), cos, sin)",
        (REFERENCE,),
    ),
    Mutation(
        "attention is not causal",
        "Attention.forward",
        "y = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=self.grouped)",
        "y = F.scaled_dot_product_attention(q, k, v, is_causal=False, enable_gqa=self.grouped)",
        (MODEL,),
    ),
    Mutation(
        "parallel heads' blocks in reverse order",
        "ParallelHeads.block",
        "return self.layers[k - 2]",
        "return self.layers[-(k - 1)]",
        (MODEL,),
    ),
    Mutation(
        "the key adapter drops the prefix a state dict's keys carry (a resumed run's LightningModule: model.)",
        "current_names",
        "name = prefix + new + name[len(prefix + old) :]",
        "name = new + name[len(prefix + old) :]",
        (f"{LEGACY}::test_every_legacy_tensor_lands_in_todays_layout",),
    ),
    Mutation(
        "the model does not adapt the keys of checkpoints of the earlier layout",
        "MTPModel.__init__",
        "self.register_load_state_dict_pre_hook(_current_names)",
        "pass",
        (f"{LEGACY}::test_a_legacy_checkpoint_decodes_what_it_decoded",),
    ),
    Mutation(
        "a sharded folder of the earlier layout is read under today's names",
        "_load_sharded_weights",
        "stored_as = old if legacy else name",
        "stored_as = name",
        (f"{LEGACY}::test_a_legacy_sharded_folder_loads",),
    ),
    Mutation(
        "causal depths' blocks in reverse order",
        "CausalHeads.block",
        "return self.layers[0 if self.share_depth else k - 2]",
        "return self.layers[0 if self.share_depth else -(k - 1)]",
        (MODEL,),
    ),
    Mutation(
        "causal depths read the hidden state first and the embedding second",
        "CausalInput.forward",
        "return self.eh_proj(torch.cat([self.enorm(embedded), self.hnorm(hidden)], dim=-1))",
        "return self.eh_proj(torch.cat([self.hnorm(hidden), self.enorm(embedded)], dim=-1))",
        (f"{MODEL}::test_causal_heads_follow_deepseek_v3",),
    ),
    Mutation(
        "causal heads condition on their own target",
        "window_states",
        "model.head_states(inputs, targets[:-1], trunk_output, draft_rate, detach_heads)",
        "model.head_states(inputs, targets[1:], trunk_output, draft_rate, detach_heads)",
        (f"{LOSS}::test_no_head_sees_its_target",),
    ),
    Mutation(
        "medusa heads lose their residual connection",
        "MedusaHead.forward",
        "x = x + F.silu(layer(x))",
        "x = F.silu(layer(x))",
        (CACHE,),
    ),
    Mutation(
        "EAGLE-3's training-time test: a later step attends to every earlier step's keys causally, not at its position",
        "Eagle3Layer.forward",
        "mask = torch.cat([causal] + [same] * (steps - 1), dim=1)",
        "mask = torch.cat([causal] * steps, dim=1)",
        (CACHE, EAGLE3_BY_HAND),
    ),
    Mutation(
        "EAGLE-3's unrolled steps rotated at the first step's positions",
        "Eagle3Heads.states",
        "*x.rotary(step)",
        "*x.rotary(0)",
        (CACHE, EAGLE3_BY_HAND),
    ),
    Mutation(
        "EAGLE-3's first step reads a draft under drafted inputs (decoding feeds it head 1's own next token)",
        "Eagle3Heads.states",
        "reads is None or step == 0",
        "reads is None",
        (f"{LOSS}::test_drafted_causal_inputs_are_each_depths_argmax_fed_to_the_next[eagle3]",),
    ),
    Mutation(
        "EAGLE-3 fuses the layers' inputs in layer order, not the order its fc was trained on",
        "MTPModel.trunk_features",
        "torch.cat([inputs[i] for i in layers] + [x], dim=-1)",
        "torch.cat([inputs[i] for i in sorted(layers)] + [x], dim=-1)",
        (EAGLE3_BY_HAND,),
    ),
    Mutation(
        "EAGLE-3 decodes from the layers' outputs instead of their inputs",
        "Eagle3Chain.reads",
        "return list(model.config.feature_layers)",
        "return [layer + 1 for layer in model.config.feature_layers]",
        (CACHE,),
    ),
    Mutation(
        "EAGLE-3's chain drafts each token from one position early",
        "Eagle3Chain.draft",
        "position = held + last + j",
        "position = held + last + j - 1",
        (CACHE,),
    ),
    Mutation(
        "EAGLE-3's first draft reads the step's next input instead of the token after the last accepted one",
        "Eagle3Chain.first",
        "after[rows, last] = next_token",
        "after[rows, last] = after[rows, last]",
        (CACHE,),
    ),
    Mutation(
        "a trunk cache file of another model is trained on",
        "TrunkCache.check_written_for",
        "if trunk != self.trunk or wide != self.width:",
        "if False:",
        ("tests/test_trunk_cache.py::test_a_cache_file_of_another_trunk_or_other_layers_is_refused_in_one_sentence",),
    ),
    Mutation(
        "the EAGLE-3 export names the embedding's norm as the state's",
        "mtp.interop.engines",
        '"attention_norm.embedding_norm.weight": "input_layernorm.weight",',
        '"attention_norm.embedding_norm.weight": "hidden_norm.weight",',
        (ENGINES,),
    ),
    Mutation(
        "the EAGLE-3 export's d2t holds target ids where the engines read offsets",
        "vocabulary_maps",
        "(vocab - torch.arange(vocab.numel(), device=vocab.device)).long()",
        "vocab.long()",
        (ENGINES,),
    ),
    Mutation(
        "the Medusa export leaves out the map of its truncated vocabulary",
        "medusa_layout",
        'tensors["token_map"] = vocab.long()',
        "pass",
        (ENGINES,),
    ),
    Mutation(
        "the MiMo export's input_proj keeps eh_proj's order (embedding first) where vLLM reads the hidden state first",
        "mimo_layout",
        "torch.cat([eh_proj[:, d:], eh_proj[:, :d]], dim=1)  # [hidden; embedding]",
        "eh_proj",
        (MIMO,),
    ),
    Mutation(
        "the MiMo export leaves out the MTP layer's zero q/k/v biases",
        "mimo_layout",
        '        tensors[f"{MTP_LAYER}{bias}"] = _zero_bias(tensors, f"{MTP_LAYER}{bias}")',
        "        pass",
        (MIMO,),
    ),
    Mutation(
        "causal depths read the token at position 0 under causal_first_token=zero (vLLM's MiMo layer zeroes it)",
        "CausalHeads.states",
        "            if self.zero_first_token:",
        "            if False:",
        (MIMO, MODEL),
    ),
    Mutation(
        "a causal draft reads the token at position 0 under causal_first_token=zero, as training does not",
        "CausalChain.draft",
        "            if self.zero_first_token:",
        "            if False:",
        (CACHE,),
    ),
    Mutation(
        "detached heads still train the shared norm",
        "MTPModel.head_states",
        "norm = partial(rms_norm, weight=self.norm.weight.detach(), eps=self.norm.eps)",
        "norm = self.norm",
        (LOSS,),
    ),
    Mutation(
        "detached heads still train the unembedding they share with head 1",
        "detached_unembedding",
        "return detach_heads and k > 1 and model.unembedding(k) is model.unembedding(1)",
        "return False",
        (LOSS,),
    ),
    Mutation(
        "a forward curriculum trains one head fewer than its part of the run",
        "LossConfig.weights_at",
        'trained = part + 1 if self.loss_weights_schedule == "forward" else n_future - part',
        'trained = part if self.loss_weights_schedule == "forward" else n_future - part',
        (LOSS,),
    ),
    Mutation(
        "a curriculum's parts are n - 1, not n, equal parts of the run",
        "LossConfig.weights_at",
        "part = min(int(min(max(progress, 0.0), 1.0) * n_future), n_future - 1)",
        "part = min(int(min(max(progress, 0.0), 1.0) * (n_future - 1)), n_future - 1)",
        (LOSS,),
    ),
    Mutation(
        "head 1's targets after the next are taken one token early",
        "Head1Targets.of_window",
        "targets[j - 2, :, :span] = window[:, j : j + span]",
        "targets[j - 2, :, :span] = window[:, j - 1 : j - 1 + span]",
        (LOSS,),
    ),
    Mutation(
        "the sequential loss's gradient of head 1's later targets leaves out their softmax part",
        "_HeadsCrossEntropy.forward",
        "grad_ce.mul_(shares.sum(dim=-1, keepdim=True))",
        "grad_ce.mul_(shares[..., :1])",
        (LOSS,),
    ),
    Mutation(
        "a causal draft conditions on the token one position early",
        "CausalChain.draft",
        "(positions + k - 1 - held[:, None])",
        "(positions + k - 2 - held[:, None])",
        (CACHE,),
    ),
    Mutation(
        "the last causal depth drafts from its window's first position instead of the last accepted one",
        "CausalChain.draft",
        "at_last = form.run_blocks(self.blocks[k - 2], x[None], rotation, depth_cache, slice(0, 1), read)[0]",
        "at_last = form.run_blocks(self.blocks[k - 2], x[None], rotation, depth_cache, slice(0, 1), read * 0)[0]",
        (CACHE,),
    ),
    Mutation(
        "causal depths keep one drafted entry as if it were final",
        "ChainCache.rollback",
        "cache.rollback([max(0, n - k + 2) for n in lengths], (device_lengths - k + 2).clamp(min=0))",
        "cache.rollback([max(0, n - k + 3) for n in lengths], (device_lengths - k + 3).clamp(min=0))",
        (CACHE,),
    ),
    Mutation(
        "the next causal depth does not see the previous depth's draft",
        "CausalChain.draft",
        "stream[rows[:, 0], last + k] = token",
        "stream[rows[:, 0], last + k - 1] = token",
        (CACHE,),
    ),
    Mutation(
        "freezing does nothing",
        "freeze",
        "parameter.requires_grad_(False)",
        "parameter.requires_grad_(True)",
        ("tests/test_init_from.py::test_freeze_stops_exactly_the_gradients_of_its_part",),
    ),
    # -- a reduced draft vocabulary
    Mutation(
        "draft logits spread over the wrong token ids",
        "InferenceModel.full_vocab",
        "return full.index_copy_(-1, self.draft_tokens, logits)",
        "return full.index_copy_(-1, self.draft_tokens.sort().indices, logits)",
        (CACHE,),
    ),
    Mutation(
        "targets outside a reduced draft vocabulary still pull on the sequential loss's gradients",
        "_HeadsCrossEntropy.forward",
        ".mul_(valid * scale)",
        ".mul_(scale)",
        (LOSS,),
    ),
    Mutation(
        "a draft head's targets indexed by token id rather than by their place in its vocabulary",
        "MTPModel.head_targets",
        "index[vocab] = torch.arange(vocab.numel(), device=targets.device)",
        "index[vocab] = vocab.flip(0)",
        (f"{LOSS}::test_a_reduced_draft_vocabulary_scores_only_its_tokens",),
    ),
    Mutation(
        "a draft vocabulary chosen at decoding scores the last token ids' rows under the first ids' names",
        "InferenceModel.__init__",
        "self.draft_output = Unembedding(self.head1_output.weight[:draft_first_ids])",
        "self.draft_output = Unembedding(self.head1_output.weight[-draft_first_ids:])",
        (f"{CACHE}::test_a_draft_vocabulary_chosen_at_decoding_scores_the_first_token_ids",),
    ),
    Mutation(
        "linear and medusa heads score every row of their own unembeddings under a draft vocabulary chosen at decoding",
        "InferenceModel.__init__",
        "self.draft_rows = slice(draft_first_ids)",
        "self.draft_rows = slice(None)",
        (f"{CACHE}::test_a_draft_vocabulary_chosen_at_decoding_scores_the_first_token_ids",),
    ),
    Mutation(
        "a form built for one draft vocabulary reused for another",
        "InferenceModel.of",
        "key = (heads, compile, draft_first_ids if heads > 1 else 0, cuda_graphs)",
        "key = (heads, compile, cuda_graphs)",
        (f"{CACHE}::test_a_draft_vocabulary_chosen_at_decoding_scores_the_first_token_ids",),
    ),
    Mutation(
        "the draft vocabulary made of the least frequent tokens",
        "MTPLitModule.choose_draft_tokens",
        "most = torch.sort(counts, descending=True, stable=True)",
        "most = torch.sort(counts, descending=False, stable=True)",
        (
            "tests/test_train.py::"
            "test_a_reduced_draft_vocabulary_is_the_training_datas_most_frequent_and_travels_in_the_checkpoint",
        ),
    ),
    Mutation(
        "a head whose unembedding trains is skipped because its state is frozen",
        "trained_heads",
        "needed = [k for k in every if states[k - 1].requires_grad or model.unembedding(k).weight.requires_grad]",
        "needed = [k for k in every if states[k - 1].requires_grad]",
        (f"{LOSS}::test_a_frozen_head_is_not_computed_in_training",),
    ),
    Mutation(
        "the trunk cache hands back its rows in the wrong order",
        "MemoryRows.get",
        "return torch.stack([self.rows[key] for key in keys])",
        "return torch.stack([self.rows[key] for key in reversed(keys)])",
        ("tests/test_trunk_cache.py::test_a_cached_step_computes_exactly_the_uncached_one",),
    ),
    Mutation(
        "the trunk cache's file hands back the row at the batch's place, not the key's",
        "FileRows.get",
        "self.index[key] * self.row_bytes)",
        "i * self.row_bytes)",
        ("tests/test_trunk_cache.py::test_a_cached_step_computes_exactly_the_uncached_one",),
    ),
    Mutation(
        "rows a stopped run wrote past its index stay in the trunk cache's file",
        "TrunkCache.open",
        "rows.keep_first(count)",
        "pass",
        ("tests/test_trunk_cache.py::test_rows_written_after_the_last_index_are_dropped_and_the_rest_serve",),
    ),
    # -- the loss
    Mutation(
        "head targets shifted by one",
        "split_window",
        "targets = torch.stack([window[:, k : k + seq_len] for k in range(1, n_future + 1)])",
        "targets = torch.stack([window[:, k : k + seq_len] for k in range(0, n_future)])",
        (LOSS,),
    ),
    Mutation(
        "the sequential backward ignores the loss scale",
        "_HeadsCrossEntropy.backward",
        "g.mul_(grad_total.to(g.dtype))",
        "g.mul_(1.0)",
        (LOSS,),
    ),
    Mutation(
        "the sequential gradients ignore the head weights",
        "_HeadsCrossEntropy.forward",
        "scale = weights[k] * relative / counted",
        "scale = relative / counted",
        (LOSS,),
    ),
    Mutation(
        "the one-hot term of the cross-entropy gradient has the wrong sign",
        "_HeadsCrossEntropy.forward",
        "torch.full_like(log_norm, -1.0)",
        "torch.full_like(log_norm, 1.0)",
        (LOSS,),
    ),
    Mutation(
        "the shared unembedding keeps only the last piece's gradient",
        "_HeadsCrossEntropy.forward",
        'grad_weights[index] += torch.einsum("bcv,bcd->vd", grad_logits, piece)',
        'grad_weights[index] = torch.einsum("bcv,bcd->vd", grad_logits, piece)',
        (LOSS,),
    ),
    Mutation(
        "the chunked loss skips the last partial chunk",
        "_HeadsCrossEntropy.forward",
        "for start in range(0, T, step):",
        "for start in range(0, T - step + 1, step):",
        (LOSS,),
    ),
    Mutation(
        "linear heads all read the first unembedding",
        "sequential_loss",
        "which.append(position[key])",
        "which.append(0)",
        (LOSS,),
    ),
    # -- heads trained for acceptance
    Mutation(
        "head k learns head 1's distribution at its own position instead of where head 1 predicts the same token",
        "Teacher.for_head",
        "shift = k - 1",
        "shift = k - 2",
        (f"{LOSS}::test_distillation_is_the_kl_from_head1s_top_k_at_the_position_it_predicts_the_same_token",),
    ),
    Mutation(
        "the teacher's top K not renormalised",
        "Teacher.of_head1",
        "probs.append(top.softmax(dim=-1))",
        "probs.append(logits.softmax(dim=-1).gather(-1, index))",
        (f"{LOSS}::test_distillation_is_the_kl_from_head1s_top_k_at_the_position_it_predicts_the_same_token",),
    ),
    Mutation(
        "the sequential distillation gradient misses the temperature's factor",
        "_HeadsCrossEntropy.forward",
        "distill_scale = weights[k] * t / distill_counted",
        "distill_scale = weights[k] / distill_counted",
        (f"{LOSS}::test_distilled_sequential_gradients_equal_naive",),
    ),
    Mutation(
        "positions past the window still pull on the distillation gradient",
        "_HeadsCrossEntropy.forward",
        ".mul_(taught * distill_scale)",
        ".mul_(distill_scale)",
        (f"{LOSS}::test_distilled_sequential_gradients_equal_naive",),
    ),
    Mutation(
        "every causal depth reads head 1's draft instead of the previous depth's",
        "CausalHeads.states",
        "reads(k, states[-1], following[k - 2])",
        "reads(k, states[0], following[k - 2])",
        (f"{LOSS}::test_drafted_causal_inputs_are_each_depths_argmax_fed_to_the_next",),
    ),
    Mutation(
        "mixed causal inputs ignore the rate asked",
        "MTPModel.drafted_inputs",
        "torch.rand(true.shape, device=true.device) < rate",
        "torch.rand(true.shape, device=true.device) < 0.5",
        (f"{LOSS}::test_mixed_causal_inputs_read_drafts_at_the_rate_asked",),
    ),
    Mutation(
        "training ignores the head weight schedule",
        "MTPLitModule.training_step",
        "trunk=self.trunk_cache, weights=weights, answers=",
        "trunk=self.trunk_cache, answers=",
        ("tests/test_train.py::test_training_follows_the_head_weight_schedule_and_distils",),
    ),
    Mutation(
        "training scores every token under loss.answers_after",
        "MTPLitModule.training_step",
        "weights=weights, answers=self.answer_tokens",
        "weights=weights",
        ("tests/test_train.py::test_training_and_validation_score_only_the_answers",),
    ),
    Mutation(
        "online updates train head 1's unembedding too",
        "draft_head_parameters",
        "return [p for p in model.heads.parameters() if p is not head1]",
        "return list(model.heads.parameters())",
        ("tests/test_online.py::test_updates_raise_acceptance_and_leave_the_output_what_head_1_decodes",),
    ),
    Mutation(
        "online rejections compare a draft with the token before the one it drafts",
        "OnlineHeads.rejections",
        "rejected[k - 2, t] = drafts[t] != tokens[t + k]",
        "rejected[k - 2, t] = drafts[t] != tokens[t + k - 1]",
        ("tests/test_online.py::test_rejections_are_where_a_heads_draft_differs_from_the_emitted_token",),
    ),
    Mutation(
        "online updates never step the optimizer",
        "OnlineHeads.update",
        "            self.optimizer.step()",
        "            self.optimizer.zero_grad()",
        ("tests/test_online.py::test_updates_raise_acceptance_and_leave_the_output_what_head_1_decodes",),
    ),
    # -- metrics and data order
    Mutation(
        "teacher-forced acceptance compares against the wrong head-1 position",
        "accepted_prefix_lengths",
        "[predictions[k - 1, :, :span] == predictions[0, :, k - 1 : k - 1 + span] for k in range(2, n + 1)]",
        "[predictions[k - 1, :, :span] == predictions[0, :, k - 2 : k - 2 + span] for k in range(2, n + 1)]",
        ("tests/test_metrics.py",),
    ),
    Mutation(
        "a resumed run replays the epoch from its start",
        "ResumableShuffle.__iter__",
        "start, self.skipped = self.skipped[1], None",
        "start, self.skipped = 0, None",
        (RESUME,),
    ),
    Mutation(
        "the loader's state counts one batch too many",
        "ResumableLoader._batches_skipped",
        "return sampler.skipped[1] // (self.batch_size * sampler.num_replicas)",
        "return sampler.skipped[1] // (self.batch_size * sampler.num_replicas) + 1",
        ("tests/data/test_datamodule.py::test_a_loaded_state_continues_every_rank_where_the_run_stopped",),
    ),
    Mutation(
        "Lightning's train-end save replaces the final-step last.ckpt",
        "ResumableCheckpoint.on_train_end",
        "if not self.saved_final_step:",
        "if True:",
        (RESUME,),
    ),
    # -- scale
    Mutation(
        "activation checkpointing does nothing",
        "apply_activation_checkpointing",
        "block.forward = _checkpointed(block.forward)",
        "block.forward = block.forward",
        ("tests/test_parallel.py::test_activation_checkpointing_keeps_gradients_and_drops_saved_activations",),
    ),
    Mutation(
        "compile does nothing",
        "apply_compile",
        "block.compile(fullgraph=True)",
        "block.train()",
        ("tests/test_parallel.py::test_compiled_blocks_train_like_eager[transformer]",),
    ),
    Mutation(
        "a draft model keeps one read draft more than the target accepted",
        "ModelDrafter.advance",
        "kept = [min(n, read) for n, read in zip(accepted, self.read_drafts, strict=True)]",
        "kept = [min(n + 1, read) for n, read in zip(accepted, self.read_drafts, strict=True)]",
        DRAFTER_CACHE,
    ),
    Mutation(
        "a draft model keeps the padding of its ragged first forward",
        "ModelDrafter.draft_chains",
        "cache.rollback(self.held)  # drop the padding",
        "pass",
        DRAFTER_CACHE,
    ),
    Mutation(
        "prompt lookup's drafts verified as if drawn uniformly",
        "LookupDrafter.propose",
        "probs = F.one_hot(drafts, self.vocab_size).float() if self.sampled else None",
        "probs = torch.full((*drafts.shape, self.vocab_size), 1 / self.vocab_size) if self.sampled else None",
        (f"{DRAFTED_LOSSLESS}[lookup]",),
    ),
    Mutation(
        "a drafter's proposals taken from the step's acceptance uniforms",
        "_Run.propose",
        "rule.layout.drafter(draws) if draws is not None else None",
        "draws if draws is not None else None",
        (f"{DRAFTED_LOSSLESS}[draft]",),
    ),
    # -- int8 drafting
    Mutation(
        "int8 drafts: head 1's unembedding quantized along with the draft heads' (they share it)",
        "InferenceModel.with_int8_drafts.quantize",
        "form.draft_output = self.draft_output.to_precision(INT8_DRAFTS)",
        "form.draft_output = form.head1_output = self.draft_output.to_precision(INT8_DRAFTS)",
        (
            f"{INT8}::test_greedy_with_int8_heads_equals_autoregressive",
            f"{INT8}::test_int8_draft_logits_are_close_to_full_precision",
        ),
    ),
    Mutation(
        "int8 blocks quantized in place: a layer-skip draft turns the target's own blocks int8",
        "PackedBlocks._with",
        "        other = copy.copy(self)\n        for name in",
        "        other = self\n        for name in",
        (
            f"{INT8}::test_greedy_with_an_int8_drafter_equals_autoregressive",
            f"{INT8}::test_int8_drafters_draft_with_int8_weights_and_leave_the_target_alone",
        ),
    ),
    Mutation(
        "an int8 drafter drafts with its float form",
        "ModelDrafter.draft_chains",
        "form, cache, plan, k = self.drafting, self.cache, self.plan, self.branches",
        "form, cache, plan, k = self.form, self.cache, self.plan, self.branches",
        (f"{INT8}::test_int8_drafters_draft_with_int8_weights_and_leave_the_target_alone",),
    ),
    Mutation(
        "prompt lookup's drafts given int8 and other draft-choice twins, as if a model drew them",
        "PromptLookupBench",
        "    drafts_with_a_model = draws_drafts = False",
        "    drafts_with_a_model = draws_drafts = True",
        (
            "tests/test_decode_scripts.py::test_bench_decode_puts_int8_drafts_beside_float_ones",
            "tests/test_decode_scripts.py::test_bench_decode_puts_top_ranked_drafts_beside_sampled_ones",
        ),
    ),
    Mutation(
        "a draft model's rows without Leviathan et al.'s predicted speed-up",
        "DraftModelBench",
        '    predicted = ("draft",)',
        "    predicted = ()",
        ("tests/test_decode_scripts.py::test_bench_decode_writes_results",),
    ),
    # -- quantized targets
    Mutation(
        "a quantized target verifies with its float path while its heads draft quantized",
        "InferenceModel._all_in.quantize",
        "form.path = [blocks.to_precision(precision) for blocks in self.path]",
        "form.path = self.path",
        (
            f"{QUANTIZE}::test_greedy_with_quantized_heads_equals_that_precisions_autoregressive",
            f"{QUANTIZE}::test_verifying_and_drafting_read_the_same_quantized_weights",
        ),
    ),
    Mutation(
        "a quantized target's head 1 unembeds with the float weights",
        "InferenceModel._all_in.quantize",
        "form.head1_output = self.head1_output.to_precision(precision)",
        "form.head1_output = self.head1_output",
        (
            f"{QUANTIZE}::test_greedy_with_quantized_heads_equals_that_precisions_autoregressive",
            f"{QUANTIZE}::test_verifying_and_drafting_read_the_same_quantized_weights",
        ),
    ),
    Mutation(
        "a quantized target's heads draft with their float weights",
        "InferenceModel._all_in.quantize",
        "                form.drafter = self.drafter.to_precision(form, precision)",
        "                form.drafter = self.drafter",
        (f"{QUANTIZE}::test_verifying_and_drafting_read_the_same_quantized_weights",),
    ),
    Mutation(
        "a draft model beside a quantized target drafts with its float weights",
        "ModelDrafter.start",
        "            self.drafting = self.form.quantized(quantize)",
        "            self.drafting = self.form",
        (f"{QUANTIZE}::test_greedy_with_a_quantized_drafter_equals_that_precisions_autoregressive",),
    ),
    Mutation(
        "quantize's limits checked only once the weights are converted",
        "_Run.__init__",
        "        plan.check_weights(model.config, device, model.tok_embeddings.weight.dtype)\n",
        "",
        (f"{QUANTIZE}::test_quantize_where_the_kernels_do_not_run_is_one_sentence_before_any_weight_is_converted",),
    ),
    Mutation(
        "quantize's limits checked on the target but not on its draft model",
        "Plan.check_weights",
        "            self.drafter.check_weights(self)",
        "            pass",
        (f"{QUANTIZE}::test_quantize_where_the_kernels_do_not_run_is_one_sentence_before_any_weight_is_converted",),
    ),
    # -- llama.cpp beside mtp, a target per GGUF type (tests/benchmarks/test_llama_cpp.py)
    Mutation(
        "mtp's int8 rows set against llama.cpp's f32 plain decoding instead of Q8_0's",
        "mtp.benchmarks.llama_cpp",
        '"int8": "q8_0"',
        '"int8": "f32"',
        (f"{LLAMA_CPP}::test_mtps_rows_are_set_against_llama_cpps_plain_decoding_at_the_same_precision",),
    ),
    Mutation(
        "the q4_0 target written by llama.cpp's converter (which writes no 4-bit type) instead of its llama-quantize",
        "target_ggufs",
        "if gguf_type in QUANTIZED_FROM_F32:",
        "if False:",
        (f"{LLAMA_CPP}::test_each_type_is_written_by_llama_cpps_converter_or_its_quantizer",),
    ),
    Mutation(
        "llama.cpp's table shows mtp's rows with its own weights only, never the quantized ones beside Q8_0 and Q4_0",
        "DecodeBench.write",
        "llama_cpp_table(cpp, chain1)",
        "llama_cpp_table(cpp, greedy1)",
        (f"{LLAMA_CPP}::test_bench_decode_times_a_target_per_type_beside_mtps_quantized_rows",),
    ),
    # -- layer skip over sublayers, and its searches
    Mutation(
        "a sublayer draft skips the MLP where attention was asked, and the attention where the MLP was",
        "SkippingForm.__init__",
        "attention, feed_forward = (i, ATTENTION) not in skip, (i, FEED_FORWARD) not in skip",
        "attention, feed_forward = (i, FEED_FORWARD) not in skip, (i, ATTENTION) not in skip",
        SUBLAYER_LOGITS,
    ),
    Mutation(
        "a block whose attention is skipped is dropped whole (its MLP not run)",
        "SkippingForm.__init__",
        "if attention or feed_forward:",
        "if attention:",
        SUBLAYER_LOGITS,
    ),
    Mutation(
        "a block whose MLP is skipped still runs it",
        "SkippingForm.run_path",
        "x = target.run_blocks(blocks, x, rotation, cache, slots, feed_forward=feed_forward)",
        "x = target.run_blocks(blocks, x, rotation, cache, slots)",
        SUBLAYER_LOGITS,
    ),
    Mutation(
        "an int8 layer-skip draft keeps its blocks in float",
        "SkippingForm.__init__",
        "self.path.append(blocks.to_precision(precision) if precision else blocks)",
        "self.path.append(blocks)",
        (f"{INT8}::test_int8_drafters_draft_with_int8_weights_and_leave_the_target_alone",),
    ),
    Mutation(
        "a sublayer draft's attending blocks share one cache slot",
        "SkippingForm.__init__",
        "slice(self.attending, self.attending + 1) if attention else None",
        "slice(0, 1) if attention else None",
        SUBLAYER_LOGITS,
    ),
    Mutation(
        "--skip-layers 3a read as all of block 3",
        "parse_skip_layers",
        "skip = sublayers_of(int(p[1]) if not p[2] else (int(p[1]), p[2]) for p in parts)",
        "skip = sublayers_of(int(p[1]) for p in parts)",
        (f"{LAYER_SKIP}::test_skip_sets_parse",),
    ),
    Mutation(
        "the sublayer search's sampler is not seeded",
        "search_sublayers",
        "TPESampler(seed=seed,",
        "TPESampler(seed=None,",
        (f"{SUBLAYER_SEARCH}[0.0]",),
    ),
    Mutation(
        "the sublayer search keeps the slowest set",
        "search_sublayers",
        'direction="minimize"',
        'direction="maximize"',
        (f"{SUBLAYER_SEARCH}[1.0]",),
    ),
    Mutation(
        "the block search's rounds skip the slowest block",
        "search_blocks",
        "cost, block = min(round_)",
        "cost, block = max(round_)",
        (f"{LAYER_SKIP}::test_the_block_search_is_greedy_forward_selection",),
    ),
    # -- interop
    Mutation(
        "Meta's and GGUF's q and k rows taken as they are (interleaved rotary read as half-split)",
        "interleaved_to_halves",
        "return weight.view(n, head_dim // 2, 2, in_features).transpose(1, 2).reshape(out_features, in_features)",
        "return weight",
        (META_LOGITS, GGUF_LOGITS),
    ),
    Mutation(
        "sentencepiece converted as transformers does it (a leading space dropped)",
        "converted_sentencepiece",
        "tokenizer.pre_tokenizer = None",
        "return tokenizer",
        (META_TOKENIZER,),
    ),
    Mutation(
        "a GGUF file's own output.weight replaced by the embedding (mtp's name looked up among GGUF's)",
        "read_gguf",
        'if "output.weight" not in tensors:',
        'if "heads.outputs.0.weight" not in tensors:',
        (GGUF_LOGITS,),
    ),
    Mutation(
        "a tied GGUF file's unembedding not copied from the embedding",
        "read_gguf",
        'weights["heads.outputs.0.weight"] = tied',
        "pass",
        (GGUF_TIED,),
    ),
    Mutation(
        "GGUF tensors reshaped in GGUF's (columns, rows) order",
        "dequantized",
        "shape = tuple(int(n) for n in reversed(tensor.shape.tolist()))",
        "shape = tuple(int(n) for n in tensor.shape.tolist())",
        (GGUF_LOGITS,),
    ),
    Mutation(
        "the smollm pre-tokenizer without llama.cpp's digit split",
        "mtp.interop.tokenizer",
        '"smollm": [r"\\p{N}", GPT2_SPLIT],',
        '"smollm": [GPT2_SPLIT],',
        (f"{GGUF}::test_byte_level_ids_split_as_llama_cpp_splits[smollm]",),
    ),
    Mutation(
        "a GGUF file's control tokens taken for its unknown ones (type 2), so not matched whole in the text",
        "mtp.interop.tokenizer",
        "UNKNOWN, CONTROL, USER_DEFINED = 2, 3, 4",
        "UNKNOWN, CONTROL, USER_DEFINED = 2, 2, 4",
        (f"{GGUF}::test_byte_level_ids_split_as_llama_cpp_splits[gpt2]",),
    ),
    Mutation(
        "a GGUF file's control tokens added as ordinary tokens (kept in decoded text)",
        "gguf_tokenizer",
        "tokenizer.add_special_tokens(special)",
        "tokenizer.add_tokens([AddedToken(t.content, special=False, normalized=False) for t in special])",
        (GGUF_LOGITS,),
    ),
    Mutation(
        "a GGUF sentencepiece vocabulary split as transformers' Metaspace does (no space before a leading space)",
        "_sentencepiece_bpe",
        'tokenizer.normalizer = normalizers.Sequence([*prefix, normalizers.Replace(" ", SPACE)])',
        'tokenizer.normalizer, tokenizer.pre_tokenizer = normalizers.Replace(" ", SPACE), '
        'pre_tokenizers.Metaspace(prepend_scheme="first", split=False)',
        (f"{GGUF}::test_sentencepiece_ids_equal_sentencepiece_and_llama_cpp",),
    ),
    Mutation(
        "no BOS for Llama 3's splits when a GGUF file does not say (llama.cpp adds one)",
        "gguf_tokenizer",
        'meta.get("tokenizer.ggml.pre") in LLAMA3_NAMES',
        "False",
        (f"{GGUF}::test_bos_starts_a_text_where_llama_cpp_adds_it[llama-bpe-None-True]",),
    ),
    Mutation(
        "the unembedding taken from the embedding whenever config.json mentions tying",
        "read_hf",
        'if "lm_head.weight" not in tensors and hf.get("tie_word_embeddings") and',
        'if "tie_word_embeddings" in hf and',
        (HF_ROUND_TRIP,),
    ),
    # -- reliability
    Mutation(
        "a SIGTERM stops the run without writing last.ckpt",
        "ResumableCheckpoint.on_exception",
        "if not isinstance(exception, SIGTERMException) or",
        "if not isinstance(exception, KeyboardInterrupt) or",
        (f"{RELIABILITY}::test_a_signal_saves_last_ckpt_and_the_resumed_run_is_the_uninterrupted_one[ctrl-c]",),
    ),
    Mutation(
        "the non-finite guard reads the loss only, not the gradient norm",
        "NonFiniteGuard.on_before_optimizer_step",
        "finite = torch.isfinite(norm) if norm is not None else",
        "finite = torch.ones((), dtype=torch.bool) if norm is not None else",
        (f"{RELIABILITY}::test_a_non_finite_step_stops_the_run_naming_it_and_the_last_good_checkpoint[gradient]",),
    ),
    Mutation(
        "a skipped batch's gradients are zeroed, so AdamW's momentum and decay still move the weights",
        "NonFiniteGuard.on_before_optimizer_step",
        "optimizer.zero_grad(set_to_none=True)",
        "optimizer.zero_grad(set_to_none=False)",
        (f"{RELIABILITY}::test_skip_nonfinite_drops_the_bad_update_and_says_so_then_stops_at_the_next",),
    ),
    Mutation(
        "no periodic last.ckpt",
        "ResumableCheckpoint.on_train_batch_end",
        "periodic = self.last_every_n_steps > 0 and step % self.last_every_n_steps == 0",
        "periodic = False",
        (f"{RELIABILITY}::test_last_ckpt_is_written_every_n_steps_and_at_the_final_step",),
    ),
    Mutation(
        "the data cache is built without its lock",
        "_exclusive",
        "fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)",
        "pass",
        (f"{CONCURRENT}::test_processes_preparing_at_once_share_one_build",),
    ),
    Mutation(
        "a killed builder's partial folder is never removed",
        "_build_into_place",
        "if remove_stale:",
        "if False:",
        (f"{CONCURRENT}::test_a_builder_killed_mid_build_leaves_nothing_trusted",),
    ),
    Mutation(
        "a full disk at a shard's last flush escapes as a raw OSError",
        "_write_shard",
        "with writing_to_cache(path):  # a full disk may show only here",
        "if True:  # a full disk may show only here",
        (f"{CONCURRENT}::test_a_full_disk_is_one_sentence_and_leaves_nothing",),
    ),
    Mutation(
        "validation weighs each batch equally, not by its tokens",
        "MTPLitModule.validation_step",
        "self.val_loss[k - 1].update(cross_entropy(logits, target), weight=(target != IGNORE).sum())",
        "self.val_loss[k - 1].update(cross_entropy(logits, target))",
        ("tests/test_train.py::test_validation_perplexity_is_exp_of_the_token_weighted_head1_loss",),
    ),
    Mutation(
        "a chain's rows the bounds left undecided keep the bounds' outcome",
        "Lossless.chain",
        "                passes[at] = accept_drafts(uniforms[at], p[at], q)",
        "                pass",
        (BOUNDED,),
    ),
    Mutation(
        "the training module does not say its optimizer step changed the weights: decoding in training is stale",
        "MTPLitModule.optimizer_step",
        "        self.model.weights_changed()",
        "        pass",
        ("tests/test_train.py::test_fused_adamw_trains_in_bf16_mixed_with_gradient_clipping",),
    ),
    Mutation(
        "decoding ignores the model's word that its weights changed",
        "InferenceModel.of",
        "        weights = (model.weights_version, placed)",
        "        weights = (0, placed)",
        (
            f"{GREEDY}::test_decoding_follows_weights_written_where_no_counter_sees_once_the_model_is_told",
            "tests/test_train.py::test_decoding_after_a_fused_step_decodes_the_new_weights",
        ),
    ),
    Mutation(
        "each head count's form packs the weights again: a benchmark's rows at k = 1..4 hold four copies",
        "InferenceModel.of",
        "sharing = next((form for _, form in built.values()), None)",
        "sharing = None",
        (f"{GREEDY}::test_the_forms_of_one_models_weights_share_one_packed_path_and_drop_it_when_the_weights_change",),
    ),
    Mutation(
        "the forms of weights the model no longer has are kept, and decode the old weights",
        "InferenceModel.of",
        "for stale in [key for key, (seen, _) in built.items() if seen != weights]:",
        "for stale in []:",
        (f"{GREEDY}::test_decoding_follows_weights_changed_in_place_once_the_model_is_told",),
    ),
    Mutation(
        "a fused optimizer's gradients are not clipped",
        "MTPLitModule.configure_gradient_clipping",
        "            torch.nn.utils.clip_grad_norm_(params, gradient_clip_val)",
        "            pass",
        ("tests/test_train.py::test_a_fused_optimizers_gradients_are_clipped_as_lightning_clips",),
    ),
    Mutation(
        "validation keeps the previous head's logits alive",
        "MTPLitModule.validation_step",
        "del logits  # before the next head's are computed: one head's (B, T, V) alive at a time",
        "pass",
        ("tests/test_train.py::test_validation_keeps_one_heads_logits_alive_at_a_time",),
    ),
    Mutation(
        "cli: an OSError escapes with a traceback",
        "errors_reported",
        "    except (UserError, OSError) as err:",
        "    except UserError as err:",
        ("tests/test_cli.py::test_an_os_error_is_one_line_naming_the_path_and_the_cause",),
    ),
    Mutation(
        "distill: the last line names the budget that stopped the run by the library's setting, not the flag",
        "stop_reason",
        "RENAMED_FLAGS.get(stopped, flag_of(stopped)) if stopped in settings else stopped",
        "stopped",
        ("tests/test_distill.py::test_a_spent_time_budget_stops_before_decoding",),
    ),
    Mutation(
        "cli: a bad decoding setting named by its field, not its flag",
        "settings_named_by_flags",
        'settings_named(lambda field: named.get(field, flag_of(field)), " ", training_key)',
        'settings_named(str, "=")',
        ("tests/test_cli.py::test_a_bad_decoding_setting_is_reported_under_its_flag",),
    ),
    Mutation(
        "GenerationConfig: top_p 0 accepted",
        "GenerationConfig.__post_init__",
        "        if not 0 < self.top_p <= 1:",
        "        if not 0 <= self.top_p <= 1:",
        ("tests/test_cli.py::test_a_bad_decoding_setting_is_reported_under_its_flag",),
    ),
    # -- several draft sequences (SpecTr), hybrids, staged drafts (tests/decode/test_spectr.py)
    Mutation(
        "SpecTr: rho solved for one candidate whatever the number of candidates (min(1, q/p) for each of k)",
        "spectr_rho",
        "    k = k.to(target.dtype).clamp(min=1)\n    low, high",
        "    k = torch.ones_like(k, dtype=target.dtype)\n    low, high",
        (f"{SPECTR}::test_rho_and_residual_of_two_candidates_by_hand", *SPECTR_LOSSLESS),
    ),
    Mutation(
        "SpecTr: the residual of one failed candidate after k failed ones",
        "spectr_residual",
        "(1 - (1 - beta) ** k[:, None]) / beta.clamp(min=1e-30)",
        "(1 - (1 - beta) ** 1) / beta.clamp(min=1e-30)",
        (f"{SPECTR}::test_one_candidate_of_k_or_the_residual_is_distributed_as_the_target", *SPECTR_LOSSLESS),
    ),
    Mutation(
        "SpecTr: candidates below every node of the depth, agreeing with the accepted prefix or not",
        "SpecTr.tree",
        "            candidates = agrees[:, parent[nodes]] & (depth[nodes]",
        "            candidates = agrees[:, parent[nodes]].fill_(True) & (depth[nodes]",
        SPECTR_LOSSLESS,
    ),
    Mutation(
        "SpecTr: candidates only below the accepted node, not below the nodes that agree with it",
        "SpecTr.tree",
        "agrees[:, nodes] = candidates & (tokens == token[:, None]) & moved[:, None]",
        "agrees[:, nodes] = (nodes == chosen[:, None]) & moved[:, None]",
        (f"{SPECTR}::test_spectr_takes_a_child_of_any_node_that_agrees_with_the_accepted_token",),
    ),
    Mutation(
        "a draft model's k sequences drawn with one sequence's uniforms",
        "ModelDrafter.draft_chains",
        "draws = draws[:, : k * gamma].reshape(B, k, gamma).reshape(B * k, gamma)",
        "draws = draws[:, :gamma].repeat_interleave(k, dim=0)",
        (f"{SPECTR}::test_draft_sequences_and_hybrids_sample_the_autoregressive_distribution",),
    ),
    Mutation(
        "a tree's node laws read by depth though the drafter gave each node its own",
        "NodeLaws.law_index",
        '        if self.index is None:\n            return tree.tensors(device)["depth_law"]',
        '        if True:\n            return tree.tensors(device)["depth_law"]',
        (f"{SPECTR}::test_draft_sequences_and_hybrids_sample_the_autoregressive_distribution",),
    ),
    Mutation(
        "a hybrid step's drafts verified against laws in chain order, not the tree's node order",
        "HybridProposer.propose",
        "law_index=self.order if probs is not None else None",
        "law_index=None",
        (f"{SPECTR}::test_draft_sequences_and_hybrids_sample_the_autoregressive_distribution",),
    ),
    Mutation(
        "the path's blocks packed for MKL from their matrices' rows in the wrong order",
        "PackedMatrices.__init__",
        "        self.weights = [matrix.T for matrix in stacked]",
        "        self.weights = [matrix.T.flip(0) for matrix in stacked]",
        ("tests/decode/test_cache.py::test_cached_steps_equal_the_full_forward_in_every_block_layout",),
    ),
    Mutation(
        "packed copies of the blocks and the unembeddings kept for every row count a decode meets",
        "recently_used",
        "        while len(copies) >= PACKED_COPIES:",
        "        while False:",
        (
            "tests/decode/test_cache.py::test_packed_copies_of_the_blocks_are_kept_for_a_few_row_counts",
            f"{CACHE}::test_the_unembedding_packs_for_a_few_row_counts_of_float32_where_memory_allows",
        ),
    ),
    Mutation(
        "the unembedding packed though its copies would not fit in memory",
        "Unembedding.packs",
        "            self._room = available is None or copies <= available // 4",
        "            self._room = True",
        (f"{CACHE}::test_the_unembedding_packs_for_a_few_row_counts_of_float32_where_memory_allows",),
    ),
    Mutation(
        "a packed block's attention output added as x @ W though its matrices are packed",
        "block_step",
        "    if isinstance(w.wo, OWN_PRODUCTS) or w.by_weight:",
        "    if isinstance(w.wo, (Int8Matrices, QuantizedMatrices)) or w.by_weight:",
        ("tests/decode/test_cache.py::test_cached_steps_equal_the_full_forward_in_every_block_layout",),
    ),
    Mutation(
        "a compiled CPU step's one-row products left to Inductor's own loop (the bmm it decomposes)",
        "product",
        '    if torch.compiler.is_compiling() and x.device.type == "cpu":  # the BLAS call, not Inductor\'s loop',
        "    if False:",
        ("tests/decode/test_cache.py::test_a_compiled_product_of_one_row_stays_a_blas_call_on_cpu",),
    ),
    Mutation(
        "prompt lookup beside the heads: its chain's laws spread over the vocabulary, not its drafted tokens",
        "LookupDrafter.draft_chains",
        "        return proposal.tokens, proposal.probs",
        "        return proposal.tokens, None if proposal.probs is None else proposal.probs * 0 + 1 / self.vocab_size",
        (f"{SPECTR}::test_prompt_lookup_beside_the_heads_samples_the_autoregressive_distribution",),
    ),
    Mutation(
        "prompt lookup beside the heads: its chain dropped (padding verified in its place)",
        "LookupDrafter.draft_chains",
        "        return proposal.tokens, proposal.probs",
        "        return proposal.tokens * 0, proposal.probs",
        (f"{SPECTR}::test_prompt_lookup_beside_the_heads_accepts_where_either_is_right",),
    ),
    Mutation(
        "staged drafting: the draft's own drafts verified greedily when sampling",
        "StagedDrafter.start",
        "self.rule = Greedy(sampling, layout) if sampling.greedy else Lossless(sampling, layout)",
        "self.rule = Greedy(sampling, layout)",
        (f"{SPECTR}::test_staged_sampling_has_the_autoregressive_distribution",),
    ),
    # -- the fastest tree size
    Mutation(
        "a fastest fit sized by expected tokens alone, not per millisecond",
        "fit_to_model",
        "best = max(range(len(fits)), key=lambda i: trials[i].tokens_per_ms)",
        "best = max(range(len(fits)), key=lambda i: trials[i].expected_tokens)",
        (f"{TREE}::test_a_fastest_fit_takes_the_size_with_the_most_expected_tokens_per_ms",),
    ),
    Mutation(
        "the heads' chain taken as faster when it is slower",
        "FittedTree.chain_faster",
        "self.chain.tokens_per_ms > best.tokens_per_ms",
        "self.chain.tokens_per_ms < best.tokens_per_ms",
        (f"{TREE}::test_a_fastest_fit_takes_the_size_with_the_most_expected_tokens_per_ms",),
    ),
    Mutation(
        "timings pooled where they rise, not where they fall",
        "nondecreasing",
        "blocks[-2][0] / blocks[-2][1] > blocks[-1][0] / blocks[-1][1]",
        "blocks[-2][0] / blocks[-2][1] < blocks[-1][0] / blocks[-1][1]",
        (f"{TREE}::test_nondecreasing_pools_a_timing_spike_with_its_neighbours",),
    ),
    Mutation(
        "the count of drafting heads with the fewest expected tokens per ms chosen",
        "HeadsChoice.best",
        "max(self.trials, key=lambda t: t.tokens_per_ms)",
        "min(self.trials, key=lambda t: t.tokens_per_ms)",
        (
            f"{HEADS_CHOICE}::test_the_count_with_the_most_expected_tokens_per_ms_drafts",
            f"{HEADS_CHOICE}::test_autoregressive_decoding_wins_where_the_drafts_do_not_pay_for_their_steps",
        ),
    ),
    Mutation(
        "expected tokens per step multiplying the acceptances, which are already cumulative",
        "expected_tokens",
        "return 1.0 + sum(acceptance[: heads - 1])",
        "return 1.0 + sum(a * (acceptance[j - 1] if j else 1.0) for j, a in enumerate(acceptance[: heads - 1]))",
        (f"{HEADS_CHOICE}::test_expected_tokens_sum_the_acceptance_of_each_position_which_is_already_cumulative",),
    ),
    # -- the default corpus
    Mutation(
        "a standard library without its test suite not warned of when the data is prepared",
        "_build",
        'if source.kind == "stdlib" and (warning := stdlib_without_tests()):',
        'if source.kind == "files" and (warning := stdlib_without_tests()):',
        (
            "tests/data/test_sources.py::test_a_standard_library_without_its_test_suite_is_warned_of_once_when_the_data_is_prepared",
        ),
    ),
    Mutation(
        "the test suite looked for where the standard library keeps none",
        "stdlib_without_tests",
        'if len(list((root / "test").glob("test_*.py"))) >= TEST_SUITE_MIN:',
        'if len(list(root.glob("*.py"))) >= 1:',
        (
            "tests/data/test_sources.py::test_a_standard_library_without_its_test_suite_is_warned_of_once_when_the_data_is_prepared",
        ),
    ),
    # -- the HumanEval runner's jail
    Mutation(
        "the system-call filter lets a process fork (clone passes)",
        "mtp.benchmarks.jail",
        "            clone=56, fork=57,",
        "            clone=9056, fork=57,",
        (HOSTILE, KERNEL_REFUSES),
    ),
    Mutation(
        "the folder's Landlock rule given to the whole file system",
        "restrict_files",
        "rules = [(workdir, fs), ",
        'rules = [("/", fs), ',
        (HOSTILE,),
    ),
    Mutation(
        "Landlock lets the child read everywhere",
        "mtp.benchmarks.jail",
        'READ_TREES = ("/usr", ',
        'READ_TREES = ("/", "/usr", ',
        (HOSTILE,),
    ),
    Mutation(
        "the filter lets a signal reach any process",
        "filter_program",
        "op(BPF_JEQ_K, pid, 1, 0)",
        "op(BPF_JEQ_K, pid, 1, 1)",
        (HOSTILE, KERNEL_REFUSES),
    ),
    Mutation(
        "a file's times left to change (utimensat passes)",
        "mtp.benchmarks.jail",
        " utimensat=280,",
        " utimensat=9280,",
        (HOSTILE,),
    ),
    Mutation(
        "capabilities kept in the jail",
        "enter_jail",
        "    drop_capabilities()\n",
        "    pass\n",
        (KERNEL_REFUSES,),
    ),
    Mutation(
        "no network namespace of its own",
        "enter_jail",
        "enter_namespaces(workdir, CLONE_NEWNET | CLONE_NEWIPC",
        "enter_namespaces(workdir, CLONE_NEWIPC",
        (KERNEL_REFUSES,),
    ),
    Mutation(
        "a child whose parent died before it asked to die with it runs on",
        "main",
        "os._exit(1)  # the parent died",
        "pass  # the parent died",
        (f"{JAIL_TESTS}::test_a_child_whose_parent_died_before_it_asked_to_die_with_it_ends_at_once",),
    ),
    Mutation(
        "a child left running when its parent dies",
        "main",
        "libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)",
        "pass",
        (f"{JAIL_TESTS}::test_a_child_dies_with_its_parent",),
    ),
    Mutation(
        "pass@1 run without the jail where it cannot be built, unasked",
        "check_sandbox",
        'if sandbox == "jail" and (why := jail_layers()[1]):',
        "if False and (why := jail_layers()[1]):",
        (f"{JAIL_TESTS}::test_without_a_jail_pass_at_1_refuses_unless_the_weaker_guard_is_asked_for",),
    ),
    # -- HumanEval's problems kept out of the distillation prompts
    Mutation(
        "the benchmark check finds no problem",
        "benchmark_match",
        "task_id = FINGERPRINTS.get(key)",
        "task_id = None",
        (BENCHMARK_CHECK, FOLDER_REFUSED),
    ),
    Mutation(
        "the benchmark check compares text with its whitespace as written",
        "normalized",
        'return " ".join(text.split())',
        "return text.strip()",
        (BENCHMARK_CHECK,),
    ),
    Mutation(
        "the benchmark check ignores docstrings",
        "text_fingerprints",
        "normalized(text)), *docstring_fingerprints(text), *def_fingerprints(text)]",
        "normalized(text)), *def_fingerprints(text)]",
        (BENCHMARK_CHECK,),
    ),
    Mutation(
        "a benchmark function too short to be a task is dropped instead of refused",
        "module_tasks",
        "problem = benchmark_match(prompt)",
        "problem = benchmark_match(prompt) if why_not(node, lines, statements, prompt) is None else None",
        (FOLDER_REFUSED,),
    ),
    Mutation(
        "a benchmark function in a folder the user names is let through",
        "task_extraction",
        "if named and extraction.benchmark:",
        "if False and extraction.benchmark:",
        (FOLDER_REFUSED,),
    ),
    Mutation(
        "a prompt file is not checked for benchmark problems",
        "distill_command",
        "        check_prompt_file(args.prompts, args.prompt_field)\n",
        "        pass\n",
        (f"{TASKS_TESTS}::test_a_prompt_file_holding_a_humaneval_problem_is_refused",),
    ),
    Mutation(
        "a checkpoint trained from a model with a chat template does not carry it",
        "MTPLitModule.on_save_checkpoint",
        'checkpoint[CHECKPOINT_KEY]["chat"] = self.chat.to_dict()',
        "pass",
        (CHAT_CARRIED,),
    ),
    Mutation(
        "the recipe benchmarks its checkpoint in the raw format though the start model declares a chat template",
        "settings_of",
        'prompt_format = resolve_prompt_format(prompt_set, values["prompt_format"], template_from or checkpoint)',
        'prompt_format = resolve_prompt_format(prompt_set, values["prompt_format"], checkpoint)',
        ("tests/test_recipe.py::test_the_recipes_benchmark_speaks_as_the_start_model_does",),
    ),
    Mutation(
        "an mtp checkpoint's chat template is not read back",
        "model_chat",
        '[CHECKPOINT_KEY].get("chat"))',
        '[CHECKPOINT_KEY].get("chats"))',
        (CHAT_CARRIED,),
    ),
    Mutation(
        "typical acceptance benchmarked greedy too (where it is the chain's rule, not typical)",
        "typical_rows",
        '    if bench.mode != "sampling":',
        "    if False:",
        ("tests/test_decode_scripts.py::test_bench_decode_writes_results",),
    ),
    Mutation(
        "typical acceptance's rows not labelled lossy",
        "result_row",
        '        "lossy": plan.sampling.typical,',
        '        "lossy": False,',
        ("tests/test_decode_scripts.py::test_bench_decode_writes_results",),
    ),
    # -- who drafts: a drafter carries its gamma, the settings none
    Mutation(
        "a drafter that drafts nothing per step decodes without a word",
        "Plan.__post_init__",
        "        if self.drafter is not None and gamma < 1:",
        "        if False:",
        (f"{DRAFTERS}::test_bad_drafter_settings_are_refused",),
    ),
    Mutation(
        "the plan drafts the default count, not the drafter's gamma",
        "Plan.gamma",
        "return self.drafter.gamma if self.drafter is not None else 0",
        "return 4 if self.drafter is not None else 0",
        (f"{DRAFTERS}::test_the_target_as_its_own_draft_accepts_every_draft",),
    ),
    Mutation(
        "a registered method's proposer drafts without the --gamma asked for",
        "DecodingMethod.drafter",
        "        return self.proposer(target).with_gamma(target.gamma)",
        "        return self.proposer(target)",
        ("tests/test_methods.py::test_a_method_of_a_test_file_gets_flags_a_decode_run_and_its_swept_benchmark_rows",),
    ),
    Mutation(
        "a drafter's chains accepted beside a tree or a draft cut",
        "Plan.__post_init__",
        "        if self.drafter is not None and (heads.tree is not None or heads.draft_p_min > 0):",
        "        if False:",
        (
            f"{DRAFTERS}::test_bad_drafter_settings_are_refused",
            "tests/test_cli.py::test_generation_config_names_its_fields",
        ),
    ),
    # -- each part's settings check their own fields (mtp/decode/settings.py, a method's settings)
    Mutation(
        "HeadsSettings: no heads at all accepted (heads=0)",
        "HeadsSettings.__post_init__",
        "        if self.heads < 1:",
        "        if self.heads < 0:",
        (f"{GREEDY}::test_generation_config_holds_sampling_and_acceptance_only",),
    ),
    Mutation(
        "DraftSettings: no draft sequence per step accepted (drafts_per_step=0)",
        "DraftSettings.__post_init__",
        "        if self.drafts_per_step < 1:",
        "        if self.drafts_per_step < 0:",
        (
            f"{GREEDY}::test_generation_config_holds_sampling_and_acceptance_only",
            f"{SPECTR}::test_bad_settings_of_several_drafts_are_refused",
        ),
    ),
    Mutation(
        "Plan: SpecTr's rule accepted in a hybrid step (two proposers' drafts taken for one law's)",
        "Plan.__post_init__",
        '        if sampling.acceptance == "spectr" and self.hybrid:',
        "        if False:",
        (f"{SPECTR}::test_bad_settings_of_several_drafts_are_refused",),
    ),
    Mutation(
        "LayerSkipSettings: --skip-sublayers accepted beside a given set, which it would not search",
        "LayerSkipSettings.__post_init__",
        '        if self.skip_layers != "auto":',
        "        if False:",
        (f"{LAYER_SKIP}::test_bad_search_settings_are_one_sentence_naming_their_flags",),
    ),
    # -- a step's memory
    Mutation(
        "the prompts' step sized by logits at every prompt position (refusing batches that fit)",
        "_Run.__init__",
        "check_step_fits(model.config, len(prompts), max_len, longest, 0, device, dtype, logit_positions=1)",
        "check_step_fits(model.config, len(prompts), max_len, longest, 0, device, dtype)",
        (PROMPT_STEP,),
    ),
    Mutation(
        "an eager step's span rounded down to its multiple (attention misses the newest positions)",
        "KVCache.begin",
        "min(self.max_len, -(-needed // multiple) * multiple)",
        "min(self.max_len, max(needed // multiple * multiple, multiple))",
        SPANS_ROUNDED,
    ),
    # -- drafting methods as objects
    Mutation(
        "two drafting methods chosen at once, the second silently ignored",
        "chosen_methods",
        "if len(chosen) > 1:",
        "if len(chosen) > 2:",
        (f"{METHODS}::test_two_drafting_methods_at_once_are_refused_before_anything_loads",),
    ),
    Mutation(
        "a method whose settings reuse another's flag registered (argparse would clash, or one would shadow it)",
        "register",
        "clash = sorted(name for name in flag_fields(cls) if name in taken)",
        "clash = []",
        (f"{METHODS}::test_a_method_whose_name_or_flags_clash_is_refused",),
    ),
    Mutation(
        "a benchmark part whose sweep reuses another method's flag registered (bench_decode's parser would clash)",
        "register_bench",
        "clash = sorted(flag for flag in flag_names(cls) if flag in taken)",
        "clash = []",
        (f"{METHODS}::test_a_benchmark_part_needs_its_method_and_must_not_clash",),
    ),
    # -- tensor parallelism: the vocabulary-parallel loss
    Mutation(
        "the vocabulary-parallel log-sum-exp takes each shard's own for the whole vocabulary's",
        "logsumexp",
        "all_reduce(top, group, dist.ReduceOp.MAX)",
        "top.clone()",
        (TP_GRADIENTS,),
    ),
    Mutation(
        "a state's gradient keeps only its process's part of the vocabulary's sum",
        "_HeadsCrossEntropy.forward",
        "all_reduce(grad_states[k], part.group)",
        "grad_states[k]",
        (TP_GRADIENTS,),
    ),
    Mutation(
        "every process takes its rows for the vocabulary's first ones",
        "vocab_part",
        "mesh.get_local_rank() * local.size(0)",
        "0",
        (TP_GRADIENTS,),
    ),
    Mutation(
        "the distillation teacher's top k keeps shard-local ids",
        "top_k",
        "index = index + part.offset",
        "index = index + 0",
        (TP_GRADIENTS,),
    ),
    # -- the experiments: task curves and the evaluation of a corpus model
    Mutation(
        "the task curve misses the run's last step",
        "TaskCurve.on_train_batch_end",
        "due = step % self.every_n_steps == 0 or step == trainer.max_steps",
        "due = step % self.every_n_steps == 0",
        (f"{CURVE}::test_the_curve_logs_at_the_asked_steps_and_equals_the_evaluation_of_the_same_checkpoint",),
    ),
    Mutation(
        "a resumed run starts its task curve afresh",
        "TaskCurve.load_state_dict",
        "self.points = list(state_dict.get(TASK_CURVE, []))",
        "self.points = []",
        (f"{CURVE}::test_a_resumed_run_continues_its_curve",),
    ),
    Mutation(
        "the task curve scores the whole evaluation set, not the subset asked",
        "TaskCurve.__init__",
        "TaskSettings(scored_ops, problems, 1, batch_size)",
        "TaskSettings(scored_ops, None, 1, batch_size)",
        (f"{CURVE}::test_the_curve_logs_at_the_asked_steps_and_equals_the_evaluation_of_the_same_checkpoint",),
    ),
    Mutation(
        "the held-out loss scores the padding of a short last window",
        "held_out_loss",
        "target[row, len(c) - 1 :] = -100",
        "pass",
        (CORPUS_LOSS,),
    ),
    Mutation(
        "bits per byte divide by the whole split's bytes whatever was scored",
        "evaluate_corpus",
        "scored_bytes = n_bytes * scored / len(ids)",
        "scored_bytes = n_bytes",
        ("tests/test_eval_task.py::test_a_corpus_model_drafts_with_every_head_and_bytes_are_bits_per_byte",),
    ),
    Mutation(
        "the evaluation's head 1 reads the last head's state",
        "MTPModel.next_token_logits",
        "return self.head_logits(1, self.norm(self._head1(self.trunk(idx))))",
        "return self.head_logits(1, self.head_states(idx)[-1])",
        (CORPUS_LOSS,),
    ),
    Mutation(
        "the size plot draws every setting of an n with one marker, a one-point setting told apart by nothing",
        "plot_corpus",
        '"marker": markers[index % len(markers)]',
        '"marker": markers[0]',
        ("tests/test_sweeps.py::test_the_size_plot_ticks_the_sizes_run_and_tells_every_setting_apart",),
    ),
    # -- results that last: each finished job's summary, committed; pages from them; reruns skip them
    Mutation(
        "a rerun ignores the summaries kept in the results folder and trains the job again",
        "continue_sweep_job",
        "if summary is not None and summary.exists():",
        "if False:",
        (f"{SWEEPS}::test_a_rerun_skips_a_job_whose_summary_is_kept_and_runs_one_without",),
    ),
    Mutation(
        "a finished sweep job keeps no summary",
        "train_in_run_dir",
        "if score_trained(bench, evaluation) and summary is not None:",
        "if score_trained(bench, evaluation) and False:",
        (f"{SWEEPS}::test_a_sweep_job_keeps_its_summary_once_scored_and_a_rerun_elsewhere_does_not_train_it",),
    ),
    Mutation(
        "a page from the summaries groups a control with the runs as configured",
        "settings_run",
        'others = sorted(o for o in overrides if o.split("=", 1)[0].lstrip("+~") not in apart)',
        "others = []",
        (
            f"{SWEEPS}::test_a_page_made_from_the_kept_summaries_equals_the_page_made_from_the_job_folders",
            f"{SWEEPS}::test_runs_of_other_settings_are_not_averaged_together",
        ),  # fmt: skip
    ),
    Mutation(
        "llama.cpp's download builds every build dependency from source",
        "LlamaCpp.at",
        '"--no-binary", "llama-cpp-python",',
        '"--no-binary", ":all:",',
        ("tests/benchmarks/test_llama_cpp.py::test_the_source_is_fetched_alone_its_build_tools_as_wheels",),
    ),
    Mutation(
        "a lever's table sets its runs against its own n=1 (none), not plain training",
        "corpus_tables",
        "if setting != plain and plain_ns:",
        "if False:",
        (f"{SWEEPS}::test_a_lever_is_set_against_plain_training_of_its_size_at_every_n",),
    ),
    Mutation(
        "a lever's difference is to plain n=1's first seed alone",
        "corpus_tables",
        'return [metric(run, "loss") for run in groups.get((key[0], size, key[1]), [])]',
        'return [metric(run, "loss") for run in groups.get((key[0], size, key[1]), [])][:1]',
        (f"{SWEEPS}::test_a_lever_is_set_against_plain_training_of_its_size_at_every_n",),
    ),
    Mutation(
        "a summary folder without its results.json is passed over, not refused",
        "job_folders",
        "if path.is_dir() and not hidden and not has_subfolders(path):",
        "if (path / SUMMARY).is_file() and not hidden:",
        (f"{SWEEPS}::test_a_bad_summary_is_one_sentence_naming_the_file_and_the_fix",),
    ),
    Mutation(
        "a run at exactly the stated threshold is not counted as having formed induction",
        "formed_table",
        "formed = sum(final >= INDUCTION_FORMED for final in finals)",
        "formed = sum(final > INDUCTION_FORMED for final in finals)",
        (f"{SWEEPS}::test_an_induction_page_counts_the_seeds_that_formed_induction_at_the_stated_threshold",),
    ),
    Mutation(
        "induction counted as formed by a curve's best point, not the run's final one",
        "formed_table",
        'finals = [run.results["rows"][0]["accuracy"] for run in runs]',
        "finals = [max(a for _, _, a in run.curve()) for run in runs]",
        (f"{SWEEPS}::test_an_induction_page_counts_the_seeds_that_formed_induction_at_the_stated_threshold",),
    ),
    Mutation(
        "a trunk cache folder bounded by its disk's free space alone, as if its rows were not there to be written over",
        "cache_room",
        "return free + held,",
        "return free,",
        ("tests/test_trunk_cache.py::test_a_cache_folder_is_bounded_by_its_free_disk_and_what_its_rows_already_hold",),
    ),
    Mutation(
        "the trunk cache holds its whole budget whatever memory the machine has",
        "cache_budget",
        "if available is None or asked <= MEMORY_SHARE * available:",
        "if True:",
        ("tests/test_trunk_cache.py::test_the_cache_holds_at_most_half_the_memory_the_machine_has_available",),
    ),
    Mutation(
        "a phase's peak is the run's so far, not its own (the mark never reset)",
        "reset_peak",
        'CLEAR_REFS.write_text("5")',
        "pass",
        ("tests/benchmarks/test_memory.py",),
    ),
    Mutation(
        "the run's peak forgets what a phase held before the next phase reset the mark",
        "reset_peak",
        "_cleared = max(_cleared, mark or 0)",
        "_cleared = 0",
        ("tests/benchmarks/test_memory.py::test_the_runs_peak_keeps_the_mark_a_phase_cleared",),
    ),
    Mutation(
        "a phase run in a process of its own says this process's peak, not that one's",
        "in_own_process",
        "_processes.append(peak)",
        "pass",
        (
            "tests/benchmarks/test_memory.py::test_a_phase_run_in_its_own_process_hands_its_memory_back_and_counts_its_peak",
        ),
    ),
    Mutation(
        "a UserError in a process of its own comes back as a result, not as the error",
        "in_own_process",
        "raise UserError(result.sentence)",
        "return result",
        ("tests/benchmarks/test_memory.py::test_an_error_in_a_process_of_its_own_is_raised_here",),
    ),
    Mutation(
        "the recipe's benchmark runs in the training process, beside what training left",
        "score_trained",
        'in_own_process(bench_decode.run, bench, "bench_decode")',
        'bench_decode.run(bench, "bench_decode")',
        (
            f"{SWEEPS}::test_only_the_first_process_of_a_multi_device_run_scores_the_trained_checkpoint_and_benchmarks_"
            "it_apart",
        ),
    ),
    Mutation(
        "a config node's settings ignore the part's own defaults (a node and the flags default differently)",
        "Part.default",
        "if f.name in self.defaults:",
        "if False:",
        ("tests/test_schema.py",),
    ),
    Mutation(
        "a config node's whole number accepts text (read as the flag would refuse it)",
        "read_value",
        "if isinstance(value, bool) or not isinstance(value, int):",
        "if isinstance(value, bool):",
        ("tests/test_schema.py",),
    ),
    Mutation(
        "a config node may set what the run gives (the checkpoint it will write)",
        "node_values",
        "if key not in owners or key in given:",
        "if key not in owners:",
        ("tests/test_schema.py",),
    ),
    Mutation(
        "a step's profile counts a category's event and its children again (a norm's power and mean twice)",
        "split_events.visit",
        "totals[category] += event.cpu_time_total\n            return",
        "totals[category] += event.cpu_time_total",
        ("tests/benchmarks/test_step_profile.py",),
    ),
    Mutation(
        "--threads sets the count but leaves the process free to run on every CPU",
        "pin_threads",
        "os.sched_setaffinity(0, cpus[:threads])",
        "pass",
        ("tests/benchmarks/test_step_profile.py",),
    ),
    Mutation(
        "a training run's validation keeps the form it decoded with (a copy of the weights held through training)",
        "InferenceModel.release",
        "if _built.pop(model, None) is not None:",
        "if _built.get(model) is not None:",
        (
            "tests/decode/test_generate.py::test_a_released_model_keeps_no_form_and_decodes_the_same_after",
            "tests/test_train.py::test_fused_adamw_trains_in_bf16_mixed_with_gradient_clipping",
        ),
    ),
]


PARSING = threading.Lock()


@functools.cache
def definitions(source: str) -> list[tuple[str, int, int]]:
    """(qualified name, start, end): the character span of every function and class of ``source`` (decorators
    included), nested ones named outer.inner."""
    lines = source.splitlines(keepends=True)
    starts = [0]
    for line in lines:
        starts.append(starts[-1] + len(line))

    def offset(lineno: int, col: int) -> int:  # ast's columns count UTF-8 bytes
        return starts[lineno - 1] + len(lines[lineno - 1].encode()[:col].decode(errors="ignore"))

    found = []

    def visit(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                first = min([child.lineno, *(decorator.lineno for decorator in child.decorator_list)])
                found.append((prefix + child.name, offset(first, 0), offset(child.end_lineno, child.end_col_offset)))
                visit(child, f"{prefix}{child.name}.")
            else:
                visit(child, prefix)

    with PARSING:  # two mutation runners place their entries at once; CPython 3.11's parser is not thread-safe
        tree = ast.parse(source)
    visit(tree, "")
    return found


def place(mutation: Mutation, root: Path = ROOT) -> tuple[Path, int]:
    """The file under ``root`` and the character offset of the mutation's text within ``mutation.within``; a one-
    sentence AssertionError where it occurs there other than once."""
    if mutation.within.startswith("mtp."):  # a module's top level
        path = root / (mutation.within.replace(".", "/") + ".py")
        spans = [(path, 0, len(path.read_text()))] if path.is_file() else []
    else:
        spans = [
            (path, start, end)
            for path in sorted((root / "mtp").rglob("*.py"))
            for name, start, end in definitions(path.read_text())
            if name == mutation.within
        ]
    found = [
        (path, start + at)
        for path, start, end in spans
        for at in occurrences(path.read_text()[start:end], mutation.original)
    ]
    assert len(found) == 1, (
        f"{mutation.name!r}: its text occurs {len(found)} times in {mutation.within} "
        f"({len(spans)} definitions of that name in mtp/); update the entry"
    )
    return found[0]


def occurrences(text: str, pattern: str) -> list[int]:
    at, found = text.find(pattern), []
    while at >= 0:
        found.append(at)
        at = text.find(pattern, at + 1)
    return found


def test_each_mutation_applies_to_exactly_one_place():
    names = [m.name for m in MUTATIONS]
    assert len(set(names)) == len(names)
    for mutation in MUTATIONS:
        place(mutation)
        for guard in mutation.guards:
            assert (ROOT / guard.split("::")[0]).is_file(), f"{mutation.name!r}: no test file {guard}"


def test_an_entry_follows_its_function_to_another_module(tmp_path):
    """A refactor that moves code keeps every entry valid: the text is found by the definition that holds it."""
    entry = Mutation("x", "Cache.begin", "span = held + new", "span = held", ())
    source = "class Cache:\n    def begin(self, held, new):\n        span = held + new\n        return span\n"
    (tmp_path / "mtp" / "decode").mkdir(parents=True)
    (tmp_path / "mtp" / "decode" / "cache.py").write_text(source)
    path, at = place(entry, tmp_path)
    assert path == tmp_path / "mtp/decode/cache.py" and source[at:].startswith("span = held + new")
    (tmp_path / "mtp" / "decode" / "cache.py").rename(tmp_path / "mtp" / "kv.py")  # moved: found there
    assert place(entry, tmp_path)[0] == tmp_path / "mtp/kv.py"
    (tmp_path / "mtp" / "kv.py").write_text(source.replace("held + new", "new + held"))  # the text changed: said
    with pytest.raises(AssertionError, match="its text occurs 0 times in Cache.begin .1 definitions"):
        place(entry, tmp_path)


def test_docs_count_the_mutations():
    """docs/testing.md says how many one-line bugs this file plants; an entry added or removed changes that sentence
    too."""
    said = re.search(r"applies each of its (\d+) plausible one-line bugs", (ROOT / "docs/testing.md").read_text())
    assert said, "docs/testing.md no longer says how many mutation entries tests/test_power.py has"
    count = len(MUTATIONS)
    assert int(said.group(1)) == count, f"docs/testing.md says {said.group(1)} mutation entries; there are {count}"


def copy_project(destination: Path) -> Path:
    for name in COPIED:
        source = ROOT / name
        if source.is_dir():
            shutil.copytree(source, destination / name, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy2(source, destination / name)
    return destination


def run_tests(project: Path, tests: list[str]) -> subprocess.CompletedProcess:
    """pytest over ``tests`` inside ``project``, importing ``mtp`` from that copy."""
    env = {k: v for k, v in os.environ.items() if k != "PROJECT_ROOT"}
    # no third-party pytest plugins (none is needed here, and each one would load in every run)
    env.update(
        PYTHONPATH=str(project), OMP_NUM_THREADS="1", PYTHONDONTWRITEBYTECODE="1", PYTEST_DISABLE_PLUGIN_AUTOLOAD="1"
    )
    command = [sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", "--no-header", "-o", "addopts="]
    command += tests  # addopts cleared: guards marked slow run too
    return subprocess.run(command, cwd=project, env=env, capture_output=True, text=True, timeout=600)


def guards_of_every_mutation() -> list[str]:
    return sorted({guard for m in MUTATIONS for guard in m.guards})


def check_unmutated(project: Path) -> str | None:
    """None when the copy imports itself and collects every guard (else what went wrong).

    That the guards pass without a mutation is the rest of this suite's job: they run on the same code there.
    """
    imported = subprocess.run(
        [sys.executable, "-c", "import mtp; print(mtp.__file__)"],
        cwd=project,
        env={**os.environ, "PYTHONPATH": str(project)},
        capture_output=True,
        text=True,
    )
    if not Path(imported.stdout.strip()).is_relative_to(project):
        return f"the copy's tests would import mtp from {imported.stdout.strip() or imported.stderr[-500:]}"
    result = run_tests(project, ["--collect-only", *guards_of_every_mutation()])
    if result.returncode != 0:
        return "the guards do not collect in the copy:\n" + result.stdout[-3000:] + result.stderr[-2000:]
    return None


def run_mutations(jobs: list[tuple[Path, Mutation]]) -> list[str | None]:
    """Apply each mutation to its copy and run its guards there (tests/mutation_runner.py, one process for all)."""
    for project, mutation in jobs:
        target, at = place(mutation, project)
        text = target.read_text()
        target.write_text(text[:at] + mutation.mutated + text[at + len(mutation.original) :])
    env = {k: v for k, v in os.environ.items() if k not in ("PROJECT_ROOT", "PYTHONPATH")}
    env.update(OMP_NUM_THREADS="1", PYTHONDONTWRITEBYTECODE="1", PYTEST_DISABLE_PLUGIN_AUTOLOAD="1")
    spec = json.dumps([[str(project), list(mutation.guards)] for project, mutation in jobs])
    runner = subprocess.run(
        [sys.executable, str(ROOT / "tests" / "mutation_runner.py"), spec],
        env=env, capture_output=True, text=True, timeout=1800,
    )  # fmt: skip
    codes = runner.stdout.split()
    if len(codes) != len(jobs):
        return [f"the mutation runner stopped (exit {runner.returncode}): {runner.stderr[-2000:]}"]
    return [verdict(int(code), project, mutation) for code, (project, mutation) in zip(codes, jobs, strict=True)]


def verdict(code: int, project: Path, mutation: Mutation) -> str | None:
    """None when the guards ran and one failed (pytest exit 1), else why the mutation was not caught."""
    if code == 1:
        return None
    if code == 0:
        return f"survived: {mutation.name} ({mutation.within}); its guards {', '.join(mutation.guards)} all pass"
    tail = " / ".join((project / "pytest.log").read_text(errors="replace").strip().splitlines()[-3:])
    return f"did not run (pytest exit {code}): {mutation.name}: {tail}"


@pytest.mark.slow
def test_every_mutation_makes_its_guards_fail(tmp_path):
    pytest.importorskip("transformers", reason="the model's guards need the hf extra: pip install -e '.[dev,hf]'")
    problem = check_unmutated(copy_project(tmp_path / "unmutated"))
    assert problem is None, problem
    jobs = [(copy_project(tmp_path / f"copy{i}"), m) for i, m in enumerate(MUTATIONS)]
    with ThreadPoolExecutor(max_workers=2) as pool:  # two runners, each on every other mutation
        halves = pool.map(run_mutations, [jobs[0::2], jobs[1::2]])
    problems = [p for half in halves for p in half if p]
    assert not problems, "\n".join(problems)
