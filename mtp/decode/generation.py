"""Autoregressive and self-speculative generation with one code path.

Each step is ONE forward over [last accepted token, pending drafts] per row. Head 1's outputs verify
the drafts; every head's outputs at the last accepted position become the next drafts (verify and
predict merged, as in blockwise parallel decoding, Stern et al. 2018); causal heads draft there as a
chain, each depth fed the draft before it (mtp.decode.inference.CausalChain). The cache is rolled back to the
accepted length. With ``heads=1`` there are no drafts: plain autoregressive decoding on the same cache
and kernels, the baseline speed-ups are measured against.

- greedy (temperature 0): a draft is accepted while it equals head 1's argmax, so the output is token
  for token that of greedy autoregressive decoding from head 1.
- sampling: head j's processed distribution p is the proposal for its draft, head 1's processed
  distribution q the target. Accept with probability min(1, q/p); on rejection sample from
  normalize(max(0, q - p)); when every draft passes, sample the bonus token from q. The output is
  distributed as autoregressive sampling from head 1 (Leviathan et al. 2023; Chen et al. 2023).

With a draft tree (``tree``, :mod:`mtp.decode.tree`) a step verifies several candidates per depth at once: the
input is [the token head 1 chose, the tree's nodes] under a tree attention mask, the longest accepted path wins,
its keys and values are moved where a sequence would have them, and the heads draft the next tree from its last
node. Greedy: the nodes at depth d are head d + 1's top-ranked tokens, and a node is accepted when it is head 1's
argmax after its parent. Sampling: every node is drawn independently from its head's proposal p, and
multi-candidate speculative sampling (SpecInfer, Miao et al. 2023; EAGLE) tries the children of the last accepted
node in order: child x passes with probability min(1, q(x) / p(x)) under the current target q; on rejection q
becomes normalize(max(0, q - p)) and the next child is tried; when none passes, the next token is sampled from what
is left of q. The output is distributed as autoregressive sampling from head 1.

- ``acceptance="typical"`` (Medusa's typical acceptance, lossy, sampling only): a draft passes when head 1 gives it
  probability above min(epsilon, delta * exp(-entropy)); the longest passing path wins and the next token is
  sampled from head 1 there. Greedy decoding ignores it.
- ``draft_p_min`` (as llama.cpp's): drafts deeper than the first whose head's top probability is below it are not
  verified; ``adaptive_drafts`` (chains; Hugging Face's heuristic): a row's draft count grows by 2 after a step that
  accepted all of them and shrinks by 1 otherwise. Both decide from the drafts alone, so greedy output stays exact
  and sampling lossless.

The first step is the prompt itself (right-padded to the longest), so prefill also drafts.

With a drafter (:mod:`mtp.decode.drafters`: a draft model, the target with blocks skipped, prompt lookup) and
``gamma`` > 0, the drafts come from it instead of the heads: after each step it reads what the rows emitted and
proposes up to gamma tokens per row, which the next step verifies as a chain, by the same rules.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial

import torch
from torch import Tensor

from mtp.decode.drafters import Drafter
from mtp.decode.inference import InferenceModel
from mtp.decode.sampling import RowUniforms, processed_probs, sample_from, sample_many
from mtp.decode.tree import DraftTree
from mtp.model import MTPModel

ACCEPTANCE_RULES = ("exact", "typical")


class SettingError(ValueError):
    """A GenerationConfig setting out of its range or at odds with another: one sentence naming the value and the fix.

    ``template`` has a ``{field}`` for each field it names (``values``: field -> its value): ``{top_p}`` shows the
    field and its value, ``{tree:name}`` the field alone, ``{heads:1}`` the field with the value 1. ``str()`` spells
    fields as Python does (``top_p=1.5``); a command line renders the same sentence with its flags (``--top-p 1.5``,
    :func:`mtp.cli.generation_config`).
    """

    def __init__(self, template: str, **values: object) -> None:
        self.template, self.values = template, values
        super().__init__(self.render(str, "="))

    @property
    def fields(self) -> tuple[str, ...]:
        return tuple(self.values)

    def render(self, name: Callable[[str], str], joiner: str) -> str:
        """The sentence with each field spelled ``name(field)``, a shown value after ``joiner``."""
        return self.template.format_map({f: _Named(name(f), v, joiner) for f, v in self.values.items()})


@dataclass
class _Named:
    name: str
    value: object
    joiner: str

    def __format__(self, spec: str) -> str:
        if spec == "name":
            return self.name
        value = spec or self.value
        shown = repr(value).removesuffix(".0") if isinstance(value, float) else str(value)  # -1, as typed, not -1.0
        return f"{self.name}{self.joiner}{shown}"


@dataclass
class GenerationConfig:
    max_new_tokens: int = 128
    temperature: float = 0.0
    """0 is greedy."""
    top_k: int = 0
    """Keep only the k most likely tokens (0: all)."""
    top_p: float = 1.0
    """Keep the smallest set of most likely tokens whose probability reaches top_p (1: all)."""
    heads: int = 1
    """Heads used: 1 decodes autoregressively, k > 1 drafts k - 1 tokens per step with heads 2..k."""
    eos_id: int | None = None
    """Stop a row after this token (it is not included in the output)."""
    seed: int = 0
    """Row b samples from a generator seeded seed + b."""
    compile: bool = False
    """torch.compile the step (the first call compiles; outputs equal eager ones)."""
    tree: DraftTree | None = None
    """Verify this tree of candidates per step instead of one chain of drafts (at most heads - 1 deep)."""
    acceptance: str = "exact"
    """exact: greedy-exact / lossless sampling; typical: Medusa's typical acceptance (lossy; sampling only)."""
    typical_epsilon: float = 0.09
    """Typical acceptance: a draft passes above min(typical_epsilon, typical_delta * exp(-entropy))."""
    typical_delta: float = 0.3
    draft_p_min: float = 0.0
    """Stop drafting deeper than the first draft whose head's top probability is below this (0: off)."""
    adaptive_drafts: bool = False
    """Chains: a row's draft count + 2 after a step that accepted all of them, - 1 otherwise (at least 1)."""
    gamma: int = 0
    """Drafts per step from the drafter passed to ``generate`` (draft model, layer skip, prompt lookup); 0: none."""

    def __post_init__(self) -> None:
        """Every setting checked here, the one place that does (the command lines report these under their flags)."""
        if self.max_new_tokens < 1:
            raise SettingError("{max_new_tokens} must be at least 1.", max_new_tokens=self.max_new_tokens)
        if self.temperature < 0:
            raise SettingError("{temperature} must be 0 (greedy) or positive.", temperature=self.temperature)
        if self.top_k < 0:
            raise SettingError("{top_k} must be 0 (off) or positive.", top_k=self.top_k)
        if not 0 < self.top_p <= 1:
            raise SettingError("{top_p} must lie in (0, 1]; 1 turns nucleus sampling off.", top_p=self.top_p)
        if self.heads < 1:
            raise SettingError("{heads} must be at least 1.", heads=self.heads)
        if self.acceptance not in ACCEPTANCE_RULES:
            rules = ", ".join(ACCEPTANCE_RULES)
            raise SettingError(f"{{acceptance}} must be one of {rules}.", acceptance=self.acceptance)
        if not 0 <= self.typical_epsilon <= 1:
            raise SettingError("{typical_epsilon} must lie in [0, 1].", typical_epsilon=self.typical_epsilon)
        if self.typical_delta < 0:
            raise SettingError("{typical_delta} must be at least 0.", typical_delta=self.typical_delta)
        if not 0 <= self.draft_p_min <= 1:
            raise SettingError("{draft_p_min} must lie in [0, 1]; 0 turns it off.", draft_p_min=self.draft_p_min)
        if self.tree is not None and self.tree.depth > self.heads - 1:
            raise SettingError(
                f"the draft {{tree:name}} is {self.tree.depth} deep but {{heads}} drafts {self.heads - 1}; "
                "use a shallower tree or more heads.",
                tree=self.tree,
                heads=self.heads,
            )
        if self.adaptive_drafts and self.tree is not None:
            raise SettingError(
                "{adaptive_drafts:name} sizes chains; cut a {tree:name} with {draft_p_min:name} instead.",
                adaptive_drafts=True,
                tree=self.tree,
                draft_p_min=self.draft_p_min,
            )
        if self.gamma < 0:
            raise SettingError("{gamma} must be at least 1 (with a drafter) or 0 (none).", gamma=self.gamma)
        if self.gamma and (self.heads > 1 or self.tree is not None or self.draft_p_min > 0):
            raise SettingError(
                "{gamma} drafts come from a drafter, which replaces the heads' drafts; use {heads:1}, no "
                "{tree:name} and no {draft_p_min:name} with it.",
                gamma=self.gamma,
                heads=self.heads,
                tree=self.tree,
                draft_p_min=self.draft_p_min,
            )

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    @property
    def typical(self) -> bool:
        """Typical acceptance in force (it only ever applies to sampling)."""
        return self.acceptance == "typical" and not self.greedy

    @property
    def samples_drafts(self) -> bool:
        """Drafts drawn from proposals (sampling, exact acceptance); otherwise top-ranked (greedy, typical)."""
        return not self.greedy and not self.typical

    @property
    def drafts(self) -> int:
        """Draft positions (chain) or depths (tree) a step can verify."""
        if self.gamma:
            return self.gamma
        return self.tree.depth if self.tree is not None else self.heads - 1


@dataclass
class DecodeStats:
    rows: int
    forwards: int = 0
    """Model forwards (steps), prefill included."""
    row_forwards: int = 0
    """Forwards summed over the rows that took part in each: the denominator of tokens/forward."""
    tokens: int = 0
    """Generated tokens, over all rows."""
    drafted: list[int] = field(default_factory=list)
    """Drafts verified at draft position j (token j + 1 of a step), over all rows and steps."""
    accepted: list[int] = field(default_factory=list)
    wall_time_s: float = 0.0
    prefill_s: float = 0.0
    """Wall time of the first forward (the prompts, plus the first drafts), up to its host transfer."""
    prefills: int = 1
    """Forwards that read prompts (1 per generate call; more when statistics of several calls are summed)."""
    tree_nodes: int = 0
    """Nodes of the draft tree verified per step (0: a chain)."""
    accepted_nodes: Counter = field(default_factory=Counter)
    """Tree decoding: how many row-steps ended at each node (0: the root, no draft accepted)."""
    acceptance_rule: str = "exact"
    method: str = "heads"
    """Who drafts (mtp.decode.drafters.METHODS): the target's heads, a draft model, layer skip, prompt lookup."""
    method_params: dict[str, str] = field(default_factory=dict)
    draft_s: float = 0.0
    """Wall time a drafter spent proposing (0 for the heads, whose drafts come out of the target's forward)."""
    draft_forwards: int = 0
    """Forwards a drafter's model ran."""

    @property
    def ms_per_forward(self) -> float:
        """Mean wall time of a decoding step (every forward after the prompts'), in milliseconds."""
        steps = self.forwards - self.prefills
        return 1000 * (self.wall_time_s - self.prefill_s) / steps if steps > 0 else 0.0

    @property
    def tokens_per_forward(self) -> float:
        return self.tokens / max(1, self.row_forwards)

    @property
    def acceptance(self) -> list[float]:
        """Acceptance rate of the draft at each position (heads 2..k)."""
        return [a / d if d else 0.0 for a, d in zip(self.accepted, self.drafted, strict=True)]

    @property
    def draft_share(self) -> float:
        """The share of the wall time spent in a drafter."""
        return self.draft_s / self.wall_time_s if self.wall_time_s > 0 else 0.0

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.wall_time_s if self.wall_time_s > 0 else 0.0

    def line(self) -> str:
        """One line of key=value pairs for scripts to parse."""
        accept = ",".join(f"{a:.3f}" for a in self.acceptance) or "-"
        rule = "typical(lossy)" if self.acceptance_rule == "typical" else self.acceptance_rule
        return (
            f"tokens={self.tokens} forwards={self.forwards} tokens/forward={self.tokens_per_forward:.3f} "
            f"accept={accept} wall_s={self.wall_time_s:.3f} tokens/s={self.tokens_per_s:.1f} "
            f"ms/forward={self.ms_per_forward:.3f} prefill_ms={1000 * self.prefill_s:.1f} "
            f"tree_nodes={self.tree_nodes} acceptance={rule} method={self.method}"
            + "".join(f" {key}={value}" for key, value in self.method_params.items())
            + (f" draft_share={self.draft_share:.3f}" if self.method != "heads" else "")
        )


@torch.inference_mode()
def generate(
    model: MTPModel, prompts: list[list[int]], config: GenerationConfig, drafter: Drafter | None = None
) -> tuple[list[list[int]], DecodeStats]:
    """Continue every prompt (a list of token ids each) by up to ``max_new_tokens`` tokens; rows are independent.
    With ``drafter`` (and ``config.gamma`` > 0) the drafts come from it (:mod:`mtp.decode.drafters`)."""
    if (drafter is not None) != (config.gamma > 0):
        raise ValueError("pass a drafter together with gamma > 0 (and gamma only with a drafter)")
    if config.heads > model.n_future and not model.config.share_depth:
        raise ValueError(
            f"heads={config.heads} but the model has {model.n_future}; only causal heads trained with "
            "model.share_depth=true can draft beyond the heads they were trained with"
        )
    if not prompts or any(len(p) == 0 for p in prompts):
        raise ValueError("every prompt needs at least one token")
    device = next(model.parameters()).device
    tree = config.tree
    heads = tree.depth + 1 if tree is not None else config.heads  # a shallower tree needs no deeper heads
    # room for a step's drafts past the budget, and for causal depths' windows (the step's width + k - 2)
    needed = max(map(len, prompts)) + config.max_new_tokens + 2 * (config.drafts + 1)
    max_len = needed + (tree.size if tree is not None else 0)  # a tree step writes every node before keeping a path
    if needed > model.config.max_seq_len:
        raise ValueError(
            f"prompt ({max(map(len, prompts))} tokens) + max_new_tokens ({config.max_new_tokens}) exceeds the "
            f"model's context of {model.config.max_seq_len} tokens"
        )
    drafts = config.drafts
    stats = DecodeStats(
        rows=len(prompts), drafted=[0] * drafts, accepted=[0] * drafts,
        tree_nodes=tree.size if tree is not None else 0, acceptance_rule=config.acceptance,
        method=drafter.method if drafter is not None else "heads",
        method_params={"gamma": str(config.gamma), **drafter.params()} if drafter is not None else {},
    )  # fmt: skip
    outputs: list[list[int]] = [[] for _ in prompts]
    rows = list(range(len(prompts)))  # original index of each live row
    inference = InferenceModel.of(model, heads, config.compile)
    cache = inference.new_cache(len(prompts), max_len)
    steps = config.max_new_tokens + 1  # every step emits a token; the prompt's step too
    uniforms = None if config.greedy else RowUniforms(config.seed, len(prompts), steps, _draws_per_step(config), device)
    planned = [drafts] * len(prompts)  # adaptive_drafts: each row's draft count for its next step
    if drafter is not None:
        drafter.start(prompts, max_len)  # its cache allocated outside the timed part, as the target's is
    draft_timer = _Timer(device)
    start = time.perf_counter()

    # Step 0: the prompts. Every prompt token counts as accepted; the last one is each row's base position.
    width = max(map(len, prompts))
    inputs = torch.tensor([p + [0] * (width - len(p)) for p in prompts], device=device)
    first_base = [len(p) - 1 for p in prompts]
    base = torch.tensor(first_base, device=device)
    n_drafts = 0
    draft_probs: Tensor | None = None  # (B, drafts, V) proposals of the pending drafts, when sampling
    live: Tensor | None = None  # (B,) drafts (chain) or depths (tree) each row verifies this step
    verifying: list[int] = []  # the same, on the host

    while rows:
        held, held_on_device = cache.host_lengths, cache.lengths
        draws = uniforms.next(_draws_per_step(config)) if uniforms is not None else None
        if tree is not None and n_drafts:
            cache.begin(inputs.size(1), tree.tensors(device))
            x, hidden = inference.run_path(inputs, cache)  # (B, 1 + nodes, d) each
            head1, slot, head1_after = _tree_head1(inference, x, tree)
            accepted, next_token, path = _verify_tree(
                head1, slot, head1_after, inputs, tree, live, draft_probs, config, draws
            )
            last_node = path[:, -1]
            cache.keep_path(path, inference.path_slots)
            inputs = inputs.gather(1, path)  # (B, depth + 1): the accepted path (then its last node repeated)
            hidden = hidden.gather(1, path[..., None].expand(-1, -1, hidden.size(-1)))
            cache.begin(inputs.size(1))  # the draft heads read the accepted path as the sequence it is
        else:
            last_node = None
            cache.begin(inputs.size(1))
            # head 1's logits where drafts are verified: after the last accepted input (base) and each pending draft
            read = None if n_drafts else base[:, None]
            head1, hidden = inference.verify(inputs, cache, read)  # (B, n_drafts + 1, V), (B, S, d)
            accepted, next_token = _verify_chain(head1, inputs, base, n_drafts, live, draft_probs, config, draws)
        if drafter is None:
            draft = partial(inference.draft, hidden, cache)  # heads 2..k after each row's last accepted input
            new_drafts, draft_probs, new_live = _draft(draft, base + accepted, inputs, next_token, config, draws)
        else:  # the drafter proposes once the step's tokens are known on the host
            new_live = torch.full_like(accepted, config.gamma)
        cache.commit(inputs.size(1))
        stats.forwards += 1
        stats.row_forwards += len(rows)
        # the one device-to-host transfer of the step: what each row accepted and emitted, and will draft next
        pending = inputs[:, 1:] if n_drafts else base[:, None]
        node = last_node if last_node is not None else torch.zeros_like(accepted)
        host = torch.cat([accepted[:, None], next_token[:, None], new_live[:, None], node[:, None], pending], 1)
        host = host.tolist()  # waits for the device: the step's time ends here
        if stats.forwards == 1:
            stats.prefill_s = time.perf_counter() - start
        # keep the last accepted input and everything before it: base + accepted + 1 new positions
        kept = [held[i] + h[0] + 1 + first_base[i] for i, h in enumerate(host)]
        cache.rollback(kept, held_on_device + base + accepted + 1)  # the same, computed where it is used

        keep, emitted_rows = [], []
        verified = verifying if n_drafts else [0] * len(rows)
        verifying = []  # what each row verifies next
        for i, (n_accepted, token, next_live, node, *path_tokens) in enumerate(host):
            if last_node is not None:
                stats.accepted_nodes[node] += 1
            emitted = (path_tokens[:n_accepted] if n_drafts else []) + [token]
            emitted_rows.append((n_accepted, emitted))
            for j in range(verified[i]):
                stats.drafted[j] += 1
                stats.accepted[j] += int(j < n_accepted)
            if config.adaptive_drafts and n_drafts:
                planned[rows[i]] = (
                    min(drafts, planned[rows[i]] + 2) if n_accepted == verified[i] else max(1, planned[rows[i]] - 1)
                )
            verifying.append(min(next_live, planned[rows[i]]))
            if _extend(outputs[rows[i]], emitted, config):
                keep.append(i)
        if len(keep) < len(rows):
            rows = [rows[i] for i in keep]
            if not rows:
                break
            index = torch.tensor(keep, device=device)
            cache.keep_rows(keep)
            if uniforms is not None:
                uniforms.keep_rows(index)
            next_token, new_live = next_token[index], new_live[index]
            draws = None if draws is None else draws[index]
            if drafter is None:
                new_drafts = new_drafts[index]
                draft_probs = None if draft_probs is None else draft_probs[index]
            else:
                drafter.keep_rows(keep)
            verifying = [verifying[i] for i in keep]
            emitted_rows = [emitted_rows[i] for i in keep]
        if drafter is not None:
            drafter.advance(*map(list, zip(*emitted_rows, strict=True)))
            proposal = draws[:, _next_token_column(config) + 1 :] if draws is not None else None
            draft_timer.start()
            new_drafts, draft_probs, counts = drafter.propose(max(verifying), config.samples_drafts, config, proposal)
            draft_timer.stop()
            verifying = [min(v, n) for v, n in zip(verifying, counts, strict=True)]
        # the next step verifies what its deepest row drafts; the rest of its rows only their own
        deepest = max(verifying)
        live = torch.tensor(verifying, device=device) if config.adaptive_drafts or drafter else new_live
        n_drafts = tree.nodes_up_to(deepest) if tree is not None else deepest
        inputs = torch.cat([next_token[:, None], new_drafts[:, :n_drafts]], dim=1)
        first_base = [0] * len(rows)
        base = torch.zeros(len(rows), dtype=torch.long, device=device)

    if device.type == "cuda":
        torch.cuda.synchronize()
    stats.wall_time_s = time.perf_counter() - start
    stats.tokens = sum(map(len, outputs))
    stats.draft_forwards = drafter.forwards if drafter is not None else 0
    stats.draft_s = draft_timer.seconds()
    return outputs, stats


class _Timer:
    """Wall time summed over start/stop spans without a host sync per span: on CUDA, events recorded on the stream
    and read once at the end; elsewhere, the clock."""

    def __init__(self, device: torch.device) -> None:
        self.cuda, self.total, self.spans = device.type == "cuda", 0.0, []

    def start(self) -> None:
        if self.cuda:
            self.spans.append((torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)))
            self.spans[-1][0].record()
        else:
            self.began = time.perf_counter()

    def stop(self) -> None:
        if self.cuda:
            self.spans[-1][1].record()
        else:
            self.total += time.perf_counter() - self.began

    def seconds(self) -> float:
        """The summed time (on CUDA, after the caller has synchronized)."""
        return self.total + sum(begin.elapsed_time(end) for begin, end in self.spans) / 1000


def _extend(output: list[int], emitted: list[int], config: GenerationConfig) -> bool:
    """Append emitted tokens up to EOS or the length budget; True while the row goes on."""
    for token in emitted:
        if token == config.eos_id:
            return False
        output.append(token)
        if len(output) >= config.max_new_tokens:
            return False
    return True


def target_probs(head1_logits: Tensor, config: GenerationConfig) -> Tensor:
    """The law autoregressive sampling draws from: head 1's distribution after temperature, top-k and top-p."""
    return processed_probs(head1_logits, config.temperature, config.top_k, config.top_p)


def proposal_probs(draft_logits: Tensor, config: GenerationConfig) -> Tensor:
    """The law a head's draft is sampled from: its distribution, processed exactly as the target is."""
    return processed_probs(draft_logits, config.temperature, config.top_k, config.top_p)


def accept_drafts(uniforms: Tensor, proposal: Tensor, target: Tensor) -> Tensor:
    """Which drafts pass: each with probability min(1, target / proposal) of its token."""
    return uniforms * proposal < target


def correction_probs(target: Tensor, proposal: Tensor, rejected: Tensor) -> Tensor:
    """Law of the token that follows the accepted drafts, (B, V).

    Where a draft was rejected (``rejected`` (B,)): normalize(max(0, target - proposal)) of the rejected
    position, so that accepted and resampled tokens together are distributed as the target. Where every
    draft passed: the target itself (the bonus token).
    """
    residual = (target - proposal * rejected[:, None]).clamp_(min=0)
    # target == proposal leaves nothing to resample from; then rejection had probability 0 and the target is the law
    empty = residual.sum(dim=-1, keepdim=True) <= 0
    return torch.where(empty, target, residual)


def typical_passes(target: Tensor, tokens: Tensor, config: GenerationConfig) -> Tensor:
    """Medusa's typical acceptance: head 1's probability of each token (..., after ``target`` (..., V)) exceeds
    min(epsilon, delta * exp(-entropy of target))."""
    entropy = -(target * target.clamp(min=1e-30).log()).sum(dim=-1)
    threshold = torch.clamp(config.typical_delta * torch.exp(-entropy), max=config.typical_epsilon)
    return target.gather(-1, tokens[..., None]).squeeze(-1) > threshold


def sibling_passes(uniform: Tensor, remaining: Tensor, token_probability: Tensor, proposal: Tensor) -> Tensor:
    """Multi-candidate speculative sampling (SpecInfer): a candidate x drawn from proposal p passes with probability
    min(1, q(x) / p(x)) under the current target q = normalize(``remaining``) (``token_probability``: remaining(x),
    ``proposal``: p(x))."""
    return uniform * proposal * remaining.sum(dim=-1) < token_probability


def residual_after_rejection(remaining: Tensor, proposal: Tensor, rejected: Tensor) -> Tensor:
    """The target after a rejected candidate, unnormalized: max(0, q - p) with q = normalize(remaining), for rows
    where ``rejected`` (B,); the same target elsewhere."""
    residual = (remaining - remaining.sum(dim=-1, keepdim=True) * proposal).clamp_(min=0)
    return torch.where(rejected[:, None], residual, remaining)


def _next_token_column(config: GenerationConfig) -> int:
    """Where a step's uniforms for the token after the accepted drafts sit: after one test per draft (chain) or per
    sibling tried at each depth (tree). Then come the new drafts' (a chain's; a tree's depths, then its nodes)."""
    if config.tree is not None:
        return sum(config.tree.max_children_at_depth())
    return config.drafts


def _draws_per_step(config: GenerationConfig) -> int:
    """Uniform numbers a step may use: the tests, the next token, the drafts (a tree's depths and nodes)."""
    tree_nodes = config.tree.size if config.tree is not None else 0
    return _next_token_column(config) + config.heads + config.gamma + tree_nodes


def _verify_chain(
    head1: Tensor,
    inputs: Tensor,
    base: Tensor,
    n_drafts: int,
    live: Tensor | None,
    draft_probs: Tensor | None,
    config: GenerationConfig,
    draws: Tensor | None,
) -> tuple[Tensor, Tensor]:
    """Accepted draft counts (B,) and the token after them (B,).

    head1: (B, n_drafts + 1, V), head 1's logits after input ``base`` (B,) and after each pending draft (which
    follow it); row b verifies only its first ``live[b]`` drafts (the rest are padding).
    """
    B = inputs.size(0)
    rows = torch.arange(B, device=inputs.device)
    if not n_drafts:
        accepted = torch.zeros(B, dtype=torch.long, device=inputs.device)
    if config.greedy:
        choice = head1.argmax(dim=-1)  # (B, n_drafts + 1): head 1's token after the base and each draft
        if n_drafts:
            present = torch.arange(n_drafts, device=inputs.device) < live[:, None]
            match = (inputs[:, 1:] == choice[:, :n_drafts]) & present
            accepted = match.long().cumprod(dim=1).sum(dim=1)
        return accepted, choice[rows, accepted]

    target = target_probs(head1, config)  # (B, n_drafts + 1, V)
    if not n_drafts:
        return accepted, sample_from(target[:, 0], draws[:, _next_token_column(config)])
    pending = inputs[:, 1:, None]
    present = torch.arange(n_drafts, device=inputs.device) < live[:, None]
    q = target[:, :n_drafts].gather(-1, pending).squeeze(-1)  # (B, D) target probability of each draft
    if config.typical:
        passes = typical_passes(target[:, :n_drafts], inputs[:, 1:], config)
    else:
        p = draft_probs[:, :n_drafts].gather(-1, pending).squeeze(-1)  # its proposal probability
        passes = accept_drafts(draws[:, :n_drafts], p, q)
    accepted = (passes & present).long().cumprod(dim=1).sum(dim=1)
    q_last = target[rows, accepted]  # (B, V): after the last accepted input
    if not config.typical:  # typical acceptance samples the next token from head 1 itself
        p_first_rejected = draft_probs[rows, accepted.clamp(max=n_drafts - 1)]  # (B, V)
        q_last = correction_probs(q_last, p_first_rejected, accepted < live)
    return accepted, sample_from(q_last, draws[:, _next_token_column(config)])


LEAVES_UNEMBEDDED_AT_ONCE = 4
"""On CPU, a tree step unembeds head 1 after every node when the tree has at most this many leaves; with more, after
the nodes with children, then once more after the accepted node (a leaf's logits are needed only when it wins)."""


def _tree_head1(inference: InferenceModel, x: Tensor, tree: DraftTree) -> tuple[Tensor, Tensor, Callable]:
    """Head 1's logits where a tree step verifies (B, P, V), each node's index among them (S,) (-1: not there), and
    ``head1_after(nodes (B,))`` -> (B, V). One unembedding of all S positions costs on CPU about what one of fewer
    rows does (the weight streams once), and on other devices one call is cheaper than two; with many leaves on CPU,
    the rows of the leaves that are not accepted cost more than a second call."""
    B, S, _ = x.shape
    rows = torch.arange(B, device=x.device)
    parents, slot = tree.parents_within(S, x.device)
    if x.device.type != "cpu" or S - len(parents) <= LEAVES_UNEMBEDDED_AT_ONCE:
        head1 = inference.head1_logits(x)  # (B, S, V)
        return head1, torch.arange(S, device=x.device), lambda nodes: head1[rows, nodes]
    return inference.head1_logits(x[:, parents]), slot, lambda nodes: inference.head1_logits(x[rows, nodes])


def _verify_tree(
    head1: Tensor,
    slot: Tensor,
    head1_after: Callable[[Tensor], Tensor],
    inputs: Tensor,
    tree: DraftTree,
    live: Tensor,
    draft_probs: Tensor | None,
    config: GenerationConfig,
    draws: Tensor | None,
) -> tuple[Tensor, Tensor, Tensor]:
    """Accepted depth (B,), the token after the accepted path (B,), and the path's node indices (B, depth + 1).

    head1: (B, P, V), head 1's logits after the root and each node with a child among the step's S - 1 nodes (inputs
    (B, S)); ``slot`` (S,): each node's index there (-1: a leaf); ``head1_after(nodes)``: head 1's logits (B, V) after
    a node of each row. Row b's nodes deeper than ``live[b]`` are not verified. Sampling: the nodes at depth d were
    drawn from ``draft_probs[:, d - 1]`` (B, depth, V), each independently.
    """
    B, S = inputs.shape
    device = inputs.device
    rows = torch.arange(B, device=device)
    t = tree.tensors(device)
    depth, parent, children = t["depth"][:S], t["parent"][:S], t["children"][:S]
    verified = depth <= live[:, None]  # (B, S)
    if config.greedy or config.typical:
        if config.greedy:
            choice = head1.argmax(dim=-1)  # (B, P)
            passes = inputs == choice[:, slot[parent]]
        else:
            target = target_probs(head1, config)
            passes = typical_passes(target[:, slot[parent]], inputs, config)
        ok = passes & verified
        ok[:, 0] = True
        for d in range(1, tree.depth + 1):  # a node is accepted when it and its parent are
            nodes = slice(tree.nodes_up_to(d - 1) + 1, min(S, tree.nodes_up_to(d) + 1))
            ok[:, nodes] &= ok[:, parent[nodes]]
        # the deepest accepted node; among equally deep ones the first (highest-ranked)
        score = torch.where(ok, depth * (S + 1) + (S - torch.arange(S, device=device)), -1)
        best = score.argmax(dim=1)
        logits = head1_after(best)
        if config.greedy:
            next_token = logits.argmax(dim=-1)
        else:
            next_token = sample_from(target_probs(logits, config), draws[:, -1])
        return depth[best], next_token, t["ancestors"][best]

    target = target_probs(head1, config)  # (B, P, V)
    node = torch.zeros(B, dtype=torch.long, device=device)
    remaining = target[:, slot[0]].clone()  # the target after the current node, rejected siblings removed
    descending = torch.ones(B, dtype=torch.bool, device=device)
    column = 0
    for level, tries in enumerate(tree.max_children_at_depth()):
        proposal = draft_probs[:, level]  # (B, V) what every node at this depth was drawn from
        moved = torch.zeros_like(descending)
        for j in range(tries):
            child = children[node, j]
            exists = (child > 0) & (child < S)
            child = torch.where(exists, child, 0)
            trying = descending & ~moved & exists & verified[rows, child]
            token = inputs[rows, child]
            q = remaining.gather(1, token[:, None]).squeeze(1)
            p = proposal.gather(1, token[:, None]).squeeze(1)
            passes = sibling_passes(draws[:, column], remaining, q, p)
            remaining = residual_after_rejection(remaining, proposal, trying & ~passes)
            node = torch.where(trying & passes, child, node)
            moved |= trying & passes
            column += 1
        descending = moved
        # rows that moved start afresh after their new node; the others keep what is left of their target
        remaining = torch.where(descending[:, None], target[rows, slot[node].clamp(min=0)], remaining)
    # a row that ended at a leaf takes its bonus token from head 1 after that leaf
    at_leaf = slot[node] < 0
    remaining = torch.where(at_leaf[:, None], target_probs(head1_after(node), config), remaining)
    next_token = sample_from(remaining, draws[:, column])
    return depth[node], next_token, t["ancestors"][node]


def _draft(
    draft: Callable[..., Tensor],
    last: Tensor,
    inputs: Tensor,
    next_token: Tensor,
    config: GenerationConfig,
    draws: Tensor | None,
) -> tuple[Tensor, Tensor | None, Tensor]:
    """The next step's drafts: a chain (B, heads - 1) or the tree's nodes (B, N); the chain's proposals (B, heads - 1,
    V) when sampling; and how many drafts (chain) or depths (tree) each row has before the first whose head's top
    probability is below ``draft_p_min`` (B,).

    ``draft(last, inputs, next_token, choose)``: the drafts after each row's input ``last`` and ``next_token``
    (:meth:`InferenceModel.draft`).
    """
    tree, B = config.tree, inputs.size(0)
    if config.heads == 1:
        return inputs.new_empty(B, 0), None, torch.zeros(B, dtype=torch.long, device=inputs.device)
    logits, proposals = [], []

    def top_tokens(head_logits: Tensor, first: int) -> Tensor:  # (h, B, V) -> (h, B), keeping the logits
        logits.append(head_logits)
        return head_logits.argmax(dim=-1)

    def sample_drafts(head_logits: Tensor, first: int) -> Tensor:  # (h, B, V) -> (h, B), keeping the proposals
        probs = proposal_probs(head_logits, config).transpose(0, 1)  # (B, h, V)
        proposals.append(probs)
        start = _next_token_column(config) + 1 + first
        return sample_from(probs, draws[:, start : start + probs.size(1)]).T

    sampled = config.samples_drafts
    drafts = draft(last, inputs, next_token, sample_drafts if sampled else top_tokens)
    draft_probs = torch.cat(proposals, dim=1) if sampled else None
    heads_logits = None if sampled else torch.cat(logits)  # (heads - 1, B, V)
    if config.draft_p_min > 0:
        if sampled:
            confidence = draft_probs.amax(dim=-1)  # (B, heads - 1)
        else:
            drafting = heads_logits[: config.drafts]
            probs = drafting.float().softmax(-1) if config.greedy else proposal_probs(drafting, config)
            confidence = probs.amax(dim=-1).T
        live = (confidence[:, : config.drafts] >= config.draft_p_min).long().cumprod(dim=1).sum(dim=1)
    else:
        live = torch.full((B,), config.drafts, dtype=torch.long, device=inputs.device)
    if tree is not None and sampled:  # every node drawn from its depth's proposal, independently
        start = _next_token_column(config) + config.heads
        drafts = torch.cat(
            [
                sample_many(draft_probs[:, d - 1], draws[:, start + first : start + last])
                for d, (first, last) in enumerate(tree.depth_nodes(), start=1)
            ],
            dim=1,
        )
    elif tree is not None:  # greedy and typical: each depth's top-ranked tokens
        candidates = [
            heads_logits[d].topk(k, dim=-1).indices if k > 1 else heads_logits[d].argmax(dim=-1, keepdim=True)
            for d, k in enumerate(tree.ranks_at_depth)
        ]
        drafts = tree.node_tokens(candidates)
    return drafts, draft_probs, live
