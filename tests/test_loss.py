import math
import weakref

import pytest
import torch
import torch.nn.functional as F

from mtp.errors import UserError
from mtp.model import MTPModel
from mtp.model.config import ModelConfig
from mtp.model.transformer import IGNORE
from mtp.training.loss import answer_targets, head_logits, mtp_loss, split_window, window_states
from mtp.training.loss_config import LossConfig


def make_model(n_future=4, seed=0, **kwargs) -> MTPModel:
    torch.manual_seed(seed)
    config = ModelConfig(vocab_size=97, d_model=32, n_layers=9, n_heads=4, n_kv_heads=2, n_future=n_future, **kwargs)
    return MTPModel(config)


def gradients(model: MTPModel, window: torch.Tensor, mode: str, scale: float = 1.0, **settings):
    """The loss in ``mode`` under the loss ``settings``, and every parameter's gradient."""
    model.zero_grad()
    out = mtp_loss(model, window, LossConfig(mode=mode, **settings))
    (scale * out.total).backward()
    return out, {name: p.grad.clone() for name, p in model.named_parameters()}


def test_split_window_shifts_each_head_by_k():
    window = torch.arange(10).unsqueeze(0)
    inputs, targets = split_window(window, 3)
    assert inputs.tolist() == [[0, 1, 2, 3, 4, 5, 6]]
    assert targets[0].tolist() == [[1, 2, 3, 4, 5, 6, 7]]
    assert targets[2].tolist() == [[3, 4, 5, 6, 7, 8, 9]]
    with pytest.raises(ValueError, match="not longer than n_future=3"):  # raised also under python -O
        split_window(torch.arange(3).unsqueeze(0), 3)


HEAD_TYPES = {
    "transformer": {},
    "linear": {},
    "causal": {},
    "causal-shared": {"head_type": "causal", "share_depth": True},
    "medusa": {"medusa_layers": 2},
    "eagle3": {"eagle3_layers": [6, 1, 3]},
}


def perturbed(model: MTPModel) -> MTPModel:
    """Zero-initialised weights (medusa's) moved off zero, so that every gradient path carries something."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.startswith("heads.residuals"):
                p.normal_(0, 0.02)
    return model


def with_draft_vocab(model: MTPModel, seed: int = 0) -> MTPModel:
    """Heads 2..n on a random subset of the vocabulary (set as training would: in place), if the model has one."""
    if model.config.draft_vocab:
        generator = torch.Generator().manual_seed(seed)
        chosen = torch.randperm(model.config.vocab_size, generator=generator)[: model.config.draft_vocab]
        model.draft_tokens.copy_(chosen.sort().values)
    return model


@pytest.mark.parametrize("head_type", HEAD_TYPES)
@pytest.mark.parametrize("n_future", [1, 2, 4, 8])
@pytest.mark.parametrize("loss_chunk", [0, 5])
@pytest.mark.parametrize("draft_vocab", [0, 40])
def test_sequential_gradients_equal_naive(head_type, n_future, loss_chunk, draft_vocab):
    if draft_vocab and n_future == 1:
        pytest.skip("a reduced draft vocabulary needs draft heads")
    weights = [1.0 / k for k in range(1, n_future + 1)]
    settings = {"head_type": head_type, **HEAD_TYPES[head_type], "draft_vocab": draft_vocab}
    model = perturbed(make_model(n_future, **settings))
    with_draft_vocab(model)
    window = torch.randint(0, 97, (3, 16 + n_future))
    loss = {"loss_weights": weights, "loss_chunk": loss_chunk}
    naive, naive_grads = gradients(model, window, "naive", scale=0.5, **loss)
    sequential, sequential_grads = gradients(model, window, "sequential", scale=0.5, **loss)
    torch.testing.assert_close(sequential.total, naive.total, rtol=1e-5, atol=0)
    torch.testing.assert_close(sequential.per_head, naive.per_head, rtol=1e-5, atol=0)
    assert naive_grads.keys() == sequential_grads.keys()
    for name, grad in naive_grads.items():
        relative = (sequential_grads[name] - grad).norm() / grad.norm()
        assert relative < 1e-5, f"{name}: relative difference {relative:.2e}"


def test_per_head_loss_is_cross_entropy_of_the_shifted_target():
    model = make_model(n_future=3)
    window = torch.randint(0, 97, (2, 11))
    with torch.no_grad():
        logits = model(window[:, :8], following=split_window(window, 3)[1][:-1])  # (3, 2, 8, 97)
        out = mtp_loss(model, window)
    for k in range(1, 4):
        log_probs = F.log_softmax(logits[k - 1].double(), dim=-1)
        target = window[:, k : k + 8]
        expected = -log_probs.gather(-1, target.unsqueeze(-1)).mean()
        torch.testing.assert_close(out.per_head[k - 1].double(), expected, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(out.total, out.per_head.sum())


@pytest.mark.parametrize("head_type", ["transformer", "medusa"])
def test_a_reduced_draft_vocabulary_scores_only_its_tokens(head_type):
    """Heads 2..n: logits over the K chosen tokens (the full forward gives -inf elsewhere), their loss the
    cross-entropy of that distribution over the positions whose target is among them; head 1 scores every token."""
    model = with_draft_vocab(perturbed(make_model(n_future=3, head_type=head_type, draft_vocab=30)))
    window = torch.randint(0, 97, (2, 27))
    inputs, targets = split_window(window, 3)
    with torch.no_grad():
        logits = model(inputs, following=targets[:-1])  # (3, 2, 24, 97)
        out = mtp_loss(model, window)
    chosen = set(model.draft_tokens.tolist())
    assert torch.isfinite(logits[0]).all()
    for k in (2, 3):
        finite = torch.isfinite(logits[k - 1]).all(dim=(0, 1)).nonzero().flatten().tolist()
        assert set(finite) == chosen and torch.isinf(logits[k - 1]).sum() == 2 * 24 * (97 - 30)
        counted = torch.tensor([[t in chosen for t in row] for row in targets[k - 1].tolist()])
        assert 0 < counted.sum() < counted.numel()  # some targets outside the subset: they count for nothing
        log_probs = F.log_softmax(logits[k - 1].double(), dim=-1)
        picked = log_probs.gather(-1, targets[k - 1].unsqueeze(-1)).squeeze(-1)
        expected = -picked[counted].mean()
        torch.testing.assert_close(out.per_head[k - 1].double(), expected, rtol=1e-5, atol=1e-6)


def test_a_frozen_head_is_not_computed_in_training():
    """A head with nothing to train (its state and unembedding frozen: head 1 under a frozen trunk) costs nothing;
    the other heads' gradients are what they would be with it, and validation still measures every head."""
    model = perturbed(make_model(n_future=3))
    window = torch.randint(0, 97, (2, 15))
    _, reference = gradients(model, window, "naive")
    trained = {name for name, _ in model.named_parameters() if name.startswith("heads.layers")}
    for name, p in model.named_parameters():
        p.requires_grad_(name in trained)
    for mode in ("naive", "sequential"):
        model.zero_grad()
        out = mtp_loss(model, window, LossConfig(mode=mode))
        out.total.backward()
        assert out.heads == [2, 3] and torch.isnan(out.per_head[0]) and torch.isfinite(out.per_head[1:]).all()
        for name, p in model.named_parameters():
            assert (p.grad is not None) == (name in trained)
            if name in trained:
                torch.testing.assert_close(p.grad, reference[name], rtol=1e-5, atol=1e-7)
    with torch.no_grad():
        assert mtp_loss(model, window).heads == [1, 2, 3]
    for name, p in model.named_parameters():  # a frozen state whose unembedding trains is computed
        p.requires_grad_(name in trained or name == "heads.outputs.0.weight")
    model.zero_grad()
    out = mtp_loss(model, window, LossConfig(mode="sequential"))
    out.total.backward()
    assert out.heads == [1, 2, 3]
    torch.testing.assert_close(
        model.heads.outputs[0].weight.grad, reference["heads.outputs.0.weight"], rtol=1e-5, atol=1e-7
    )


def test_sequential_backward_accumulates_like_autograd():
    """Two micro-batches (gradient accumulation) sum into .grad exactly as naive mode does."""
    model = make_model(n_future=2)
    windows = torch.randint(0, 97, (2, 2, 14))
    grads = {}
    for mode in ("naive", "sequential"):
        model.zero_grad()
        for window in windows:
            (mtp_loss(model, window, LossConfig(mode=mode)).total / 2).backward()
        grads[mode] = [p.grad.clone() for p in model.parameters()]
    for a, b in zip(grads["naive"], grads["sequential"], strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-7)


def test_sequential_under_bf16_autocast_tracks_naive():
    model = make_model(n_future=4)
    window = torch.randint(0, 97, (2, 20))
    grads = {}
    for mode in ("naive", "sequential"):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            _, grads[mode] = gradients(model, window, mode)
    for name, grad in grads["naive"].items():
        relative = (grads["sequential"][name] - grad).norm() / grad.norm()
        assert relative < 2e-2, f"{name}: relative difference {relative:.2e}"


def test_eval_mode_keeps_no_graph():
    model = make_model(n_future=2)
    with torch.no_grad():
        out = mtp_loss(model, torch.randint(0, 97, (1, 9)))
    assert not out.total.requires_grad


@pytest.mark.parametrize("head_type", HEAD_TYPES)
def test_no_head_sees_its_target(head_type):
    """Head k's state at t, as the loss computes it, depends on tokens up to t + k - 1 only, never on its target."""
    model = perturbed(make_model(4, **{"head_type": head_type, **HEAD_TYPES[head_type]}))
    window = torch.randint(0, 97, (1, 14))
    t = 3
    for k in range(1, 5):
        changed = window.clone()
        changed[0, t + k] = (changed[0, t + k] + 1) % 97
        with torch.no_grad():  # the states the loss reads
            before = window_states(model, window)[0][k - 1][0, t]
            after = window_states(model, changed)[0][k - 1][0, t]
        torch.testing.assert_close(after, before, rtol=0, atol=0)


@pytest.mark.parametrize("head_type", HEAD_TYPES)
def test_head_logits_yields_every_head_in_turn_one_alive_at_a_time(head_type):
    """What validation and the naive loss iterate: head k's logits and targets for k = 1..n, each head's logits
    computed only once the previous head's are dropped."""
    model = perturbed(make_model(4, **{"head_type": head_type, **HEAD_TYPES[head_type]}))
    window = torch.randint(0, 97, (2, 14))
    inputs, targets = split_window(window, 4)
    earlier = []
    with torch.no_grad():
        expected = model(inputs, following=targets[:-1])  # (4, 2, 10, 97)
        states, _ = window_states(model, window)
        for k, logits, target in head_logits(model, states, targets):
            assert [ref() for ref in earlier] == [None] * (k - 1), f"head {k}: earlier heads' logits still alive"
            assert k == len(earlier) + 1
            torch.testing.assert_close(logits, expected[k - 1], rtol=0, atol=0)
            assert torch.equal(target, window[:, k : k + 10])
            earlier.append(weakref.ref(logits))
            del logits
    assert len(earlier) == 4


# -- heads trained for acceptance: distillation from head 1, drafted causal inputs, weight schedules


@pytest.mark.parametrize("head_type", HEAD_TYPES)
@pytest.mark.parametrize("head_loss", ["distill", "ce+distill"])
@pytest.mark.parametrize("loss_chunk", [0, 5])
@pytest.mark.parametrize("draft_vocab", [0, 40])
def test_distilled_sequential_gradients_equal_naive(head_type, head_loss, loss_chunk, draft_vocab):
    weights = [1.0, 0.5, 0.25, 0.125]
    settings = {"head_type": head_type, **HEAD_TYPES[head_type], "draft_vocab": draft_vocab}
    loss = {"head_loss": head_loss, "distill_top_k": 7, "distill_temperature": 1.5}
    loss |= {"loss_weights": weights, "loss_chunk": loss_chunk}
    model = perturbed(make_model(4, **settings))
    with_draft_vocab(model)
    window = torch.randint(0, 97, (3, 16 + 4))
    naive, naive_grads = gradients(model, window, "naive", scale=0.5, **loss)
    sequential, sequential_grads = gradients(model, window, "sequential", scale=0.5, **loss)
    torch.testing.assert_close(sequential.total, naive.total, rtol=1e-5, atol=0)
    torch.testing.assert_close(sequential.per_head, naive.per_head, rtol=1e-5, atol=0)
    for name, grad in naive_grads.items():
        relative = (sequential_grads[name] - grad).norm() / grad.norm()
        assert relative < 1e-5, f"{name}: relative difference {relative:.2e}"


def reference_distillation(model, window, k, top_k, temperature, draft_tokens=None):
    """T^2 KL(p || q) by its definition, in float64: p head 1's distribution at position t + k - 1 cut to its top K
    and renormalised, q head k's at t, both at temperature T, averaged over the positions where t + k - 1 < T."""
    n = model.config.n_future
    inputs, targets = split_window(window, n)
    with torch.no_grad():
        logits = model(inputs, following=targets[:-1]).double()  # (n, B, T, V), -inf where a draft head scores none
    head1, head_k = logits[0] / temperature, logits[k - 1] / temperature
    if draft_tokens is not None:
        head1, head_k = head1[..., draft_tokens], head_k[..., draft_tokens]
    T = inputs.size(1)
    total, count = 0.0, 0
    for b in range(inputs.size(0)):
        for t in range(T - k + 1):
            p = head1[b, t + k - 1].softmax(-1)
            top = p.topk(top_k)
            p_cut = top.values / top.values.sum()
            log_q = head_k[b, t].log_softmax(-1)[top.indices]
            total += (p_cut * (p_cut.log() - log_q)).sum()
            count += 1
    return temperature**2 * total / count


@pytest.mark.parametrize("draft_vocab", [0, 40])
def test_distillation_is_the_kl_from_head1s_top_k_at_the_position_it_predicts_the_same_token(draft_vocab):
    model = make_model(4, draft_vocab=draft_vocab)
    with_draft_vocab(model)
    window = torch.randint(0, 97, (2, 12 + 4))
    out = mtp_loss(model, window, LossConfig(head_loss="distill", distill_top_k=5, distill_temperature=2.0))
    tokens = model.draft_tokens if draft_vocab else None
    for k in (2, 3, 4):
        expected = reference_distillation(model, window, k, 5, 2.0, tokens)
        torch.testing.assert_close(out.per_head[k - 1].double(), expected, rtol=1e-4, atol=1e-6)
    assert out.per_head[1:].min() > 0  # a KL, of heads that have not learnt head 1's distribution


def test_distillation_with_hand_made_logits():
    """The loss of logits and teachers written out: zero where the head already has the teacher's distribution;
    where the teacher splits its mass between tokens 0 and 1 and the head's logits are (30, -30, -30, -30),
    KL = 1/2 log(1/2 / 1) + 1/2 log(1/2 / e^-60) = 30 - log 2; past the window, no teacher."""
    from mtp.training.loss import Teacher, distill_loss

    big = 30.0
    teacher_logits = torch.tensor([[[0.0, 0.0, -big, -big], [0.0, -big, -big, -big], [0.0, 0.0, 0.0, 0.0]]])
    top, index = teacher_logits.topk(2, dim=-1)
    probs = top.softmax(-1)
    teacher = Teacher(index, probs, -(probs * probs.log()).sum(-1), 1.0)
    same = torch.tensor([[[0.0, 0.0, -big, -big]]])
    assert distill_loss(same, Teacher(index[:, :1], probs[:, :1], teacher.entropy[:, :1], 1.0)) < 1e-6
    one_sided = torch.tensor([[[big, -big, -big, -big]]])
    halved = distill_loss(one_sided, Teacher(index[:, :1], probs[:, :1], teacher.entropy[:, :1], 1.0))
    assert halved.item() == pytest.approx(big - math.log(2), abs=1e-4)
    moved = teacher.for_head(3)  # head 3 at t learns head 1's distribution at t + 2: only t = 0 has one
    assert moved.valid.tolist() == [[True, False, False]]
    assert moved.tokens[0, 0].tolist() == index[0, 2].tolist()


DRAFTING = {"causal": {"head_type": "causal"}, "causal-shared": {"head_type": "causal", "share_depth": True}}
DRAFTING["eagle3"] = {"head_type": "eagle3", **HEAD_TYPES["eagle3"]}


@pytest.mark.parametrize("head_type", DRAFTING)
def test_drafted_causal_inputs_are_each_depths_argmax_fed_to_the_next(head_type):
    """causal_inputs=drafts: depth k reads depth k-1's argmax at the same position, what greedy decoding feeds it;
    built here depth by depth through the true-token path. EAGLE-3's first draft reads the token after the accepted
    ones, head 1's own (decoding's next token), not a draft."""
    model = make_model(4, **DRAFTING[head_type])
    window = torch.randint(0, 97, (2, 10 + 4))
    inputs, targets = split_window(window, 4)
    with torch.no_grad():
        drafted = model.head_states(inputs, targets[:-1], draft_rate=LossConfig(causal_inputs="drafts").draft_rate)
        following = targets[:-1].clone()
        for k in range(3 if head_type == "eagle3" else 2, 5):
            states = model.head_states(inputs, following)
            following[k - 2] = model.head_logits(k - 1, states[k - 2]).argmax(-1)
        expected = model.head_states(inputs, following)
    for k in range(4):
        torch.testing.assert_close(drafted[k], expected[k])
    assert not torch.equal(following, targets[:-1])  # the drafts differ from the text somewhere


def test_mixed_causal_inputs_read_drafts_at_the_rate_asked():
    model = make_model(4, head_type="causal")
    window = torch.randint(0, 97, (4, 64 + 4))
    inputs, targets = split_window(window, 4)
    state = torch.randn(4, 64, 32)
    drafted = model.drafted_inputs(1.0, 2, state, targets[0])
    differs = drafted != targets[0]
    torch.manual_seed(0)
    rate = LossConfig(causal_inputs="mixed", causal_draft_rate=0.5).draft_rate
    mixed = model.drafted_inputs(rate, 2, state, targets[0])
    from_drafts = (mixed == drafted) & differs
    from_text = (mixed == targets[0]) & differs
    assert torch.equal(from_drafts | from_text, differs)  # every position reads one or the other
    share = from_drafts.sum() / differs.sum()
    assert 0.35 < share < 0.65
    for rate, expected in ((0.0, targets[0]), (1.0, drafted)):
        assert torch.equal(model.drafted_inputs(rate, 2, state, targets[0]), expected)
    assert LossConfig(causal_inputs="true", causal_draft_rate=0.5).draft_rate == 0.0


@pytest.mark.parametrize("causal_inputs", ["drafts", "mixed"])
@pytest.mark.parametrize("head_type", DRAFTING)
def test_drafted_causal_inputs_sequential_gradients_equal_naive(causal_inputs, head_type):
    model = make_model(4, **DRAFTING[head_type])
    window = torch.randint(0, 97, (3, 16 + 4))
    loss = {"causal_inputs": causal_inputs, "loss_chunk": 5}
    torch.manual_seed(1)
    naive, naive_grads = gradients(model, window, "naive", **loss)
    torch.manual_seed(1)
    sequential, sequential_grads = gradients(model, window, "sequential", **loss)
    torch.testing.assert_close(sequential.per_head, naive.per_head, rtol=1e-5, atol=0)
    for name, grad in naive_grads.items():
        relative = (sequential_grads[name] - grad).norm() / grad.norm()
        assert relative < 1e-5, f"{name}: relative difference {relative:.2e}"
    true = mtp_loss(make_model(4, **DRAFTING[head_type]), window)
    assert not torch.allclose(true.per_head[1:], naive.per_head[1:])  # the drafts changed what depths 2..4 read


def test_weight_schedules():
    steps = LossConfig(loss_weights=[1, 0.3, 0.3], loss_weights_schedule="steps", loss_weights_final=[1, 0.1, 0.1])
    assert steps.weights_at(0.0, 3) == [1, 0.3, 0.3] and steps.weights_at(0.69, 3) == [1, 0.3, 0.3]
    assert steps.weights_at(0.7, 3) == [1, 0.1, 0.1]
    linear = LossConfig(loss_weights_schedule="linear", loss_weights_final=[1.0, 0.0])
    assert linear.weights_at(0.0, 2) == [1.0, 1.0] and linear.weights_at(0.25, 2) == [1.0, 0.75]
    assert linear.weights_at(1.0, 2) == [1.0, 0.0]
    assert LossConfig(loss_weights=[1.0, 0.5]).weights_at(0.9, 2) == [1.0, 0.5]
    assert LossConfig().weights(3) == [1.0, 1.0, 1.0]


def test_answer_targets_keep_only_each_answer_and_its_end():
    # 5 marks an answer's start, 9 ends a document: "1 2 5 3 4 9 6 5 7 9 8"; the tokens after 5 up to and with 9 count
    window = torch.tensor([[1, 2, 5, 3, 4, 9, 6, 5, 7, 9, 8]])
    inputs, targets = split_window(window, 2)
    kept = answer_targets(window, targets, marker=5, end=9)
    ignored = IGNORE
    # head 1's targets are window[1:10]: 2 5 3 4 9 6 5 7 9
    assert kept[0].tolist() == [[ignored, ignored, 3, 4, 9, ignored, ignored, 7, 9]]
    # head 2's are window[2:11]: 5 3 4 9 6 5 7 9 8 -- the same rule on the token each one names
    assert kept[1].tolist() == [[ignored, 3, 4, 9, ignored, ignored, 7, 9, ignored]]
    # a window that opens inside an answer scores nothing until the next marker
    opened_inside = torch.tensor([[3, 4, 9, 6, 5, 7]])
    _, targets = split_window(opened_inside, 1)
    assert answer_targets(opened_inside, targets, 5, 9)[0].tolist() == [[ignored, ignored, ignored, ignored, 7]]


def test_answers_only_loss_is_the_cross_entropy_of_the_answers():
    model = make_model(n_future=2)
    window = torch.randint(10, 97, (2, 33))
    window[:, 4], window[:, 12], window[:, 20] = 5, 9, 5  # answers at 5..12 and 21..
    out = mtp_loss(model, window, LossConfig(mode="sequential"), answers=(5, 9))
    states, targets = window_states(model, window)
    for k in (1, 2):
        logits = model.head_logits(k, states[k - 1])
        target = targets[k - 1]
        shift = torch.arange(window.size(1) - 2)[None] + k  # the window position of each target
        inside = (((shift > 4) & (shift <= 12)) | (shift > 20)).expand(2, -1)
        expected = F.cross_entropy(logits[inside], target[inside])
        assert out.per_head[k - 1].item() == pytest.approx(expected.item(), rel=1e-5)
    naive = mtp_loss(model, window, LossConfig(mode="naive"), answers=(5, 9))
    assert naive.total.item() == pytest.approx(out.total.item(), rel=1e-5)


def one_head_twin(model: MTPModel) -> MTPModel:
    """The one-head model of ``model``'s trunk, head 1 and shared parts, with its weights: what next-token training
    alone has to train."""
    config = model.config
    settings = {f: getattr(config, f) for f in ("vocab_size", "d_model", "n_heads", "n_kv_heads", "head_type")}
    twin = MTPModel(ModelConfig(**settings, n_future=1, n_layers=config.n_layer_blocks))
    own = model.state_dict()
    twin.load_state_dict({name: own[name] for name in twin.state_dict()})
    return twin


@pytest.mark.parametrize("mode", ["sequential", "naive"])
@pytest.mark.parametrize("head_type", ["transformer", "causal", "causal-shared", "linear", "medusa", "eagle3"])
def test_detached_heads_leave_every_one_head_parameter_its_next_token_gradient(mode, head_type):
    """loss.detach_heads: every parameter a one-head model also has (trunk, head 1's block, embedding, shared norm,
    head 1's unembedding) gets exactly the one-head model's gradient, while heads 2..n still train their own."""
    settings = {"head_type": head_type, **HEAD_TYPES[head_type]}
    model = perturbed(make_model(3, **settings))
    window = torch.randint(0, 97, (2, 16 + 3), generator=torch.Generator().manual_seed(1))
    twin = one_head_twin(model)
    _, expected = gradients(twin, window[:, :-2], mode)  # the same 16 inputs, head 1's targets
    _, detached = gradients(model, window, mode, loss_weights=[1.0, 0.7, 0.4], detach_heads=True)
    _, attached = gradients(model, window, mode, loss_weights=[1.0, 0.7, 0.4])
    for name, grad in expected.items():
        torch.testing.assert_close(detached[name], grad, rtol=1e-6, atol=1e-9, msg=f"{name} moved by heads 2..n")
    own = [name for name in detached if name not in expected]
    assert own and all(detached[name].abs().sum() > 0 for name in own)  # the heads still learn
    trunk = "layers.0.attention.wq.weight"
    assert not torch.allclose(attached[trunk], expected[trunk])  # without the switch heads 2..n move the trunk too


@pytest.mark.parametrize("head_type", HEAD_TYPES)
def test_detached_heads_sequential_gradients_equal_naive(head_type):
    settings = {"head_type": head_type, **HEAD_TYPES[head_type], "draft_vocab": 40}
    model = with_draft_vocab(perturbed(make_model(4, **settings)))
    window = torch.randint(0, 97, (3, 16 + 4))
    loss = {"loss_weights": [1.0, 0.5, 0.3, 0.2], "loss_chunk": 5, "detach_heads": True}
    naive, naive_grads = gradients(model, window, "naive", **loss)
    sequential, sequential_grads = gradients(model, window, "sequential", **loss)
    torch.testing.assert_close(sequential.total, naive.total, rtol=1e-5, atol=0)
    for name, grad in naive_grads.items():
        torch.testing.assert_close(sequential_grads[name], grad, rtol=1e-4, atol=1e-7, msg=name)


def test_detach_heads_on_one_head_is_one_sentence():
    with pytest.raises(UserError, match=r"loss.detach_heads=true .* model.n_future=1 has no such head"):
        LossConfig(detach_heads=True).check_model(ModelConfig(n_future=1))


@pytest.mark.parametrize(
    ("schedule", "expected"),
    [
        # n = 4: the run in four equal parts, heads added (forward) or removed (reverse) one at a time
        ("forward", {0.0: [1, 0, 0, 0], 0.249: [1, 0, 0, 0], 0.25: [1, 0.5, 0, 0], 0.5: [1, 0.5, 0.4, 0],
                     0.74: [1, 0.5, 0.4, 0], 0.75: [1, 0.5, 0.4, 0.3], 1.0: [1, 0.5, 0.4, 0.3]}),
        ("reverse", {0.0: [1, 0.5, 0.4, 0.3], 0.249: [1, 0.5, 0.4, 0.3], 0.25: [1, 0.5, 0.4, 0], 0.5: [1, 0.5, 0, 0],
                     0.75: [1, 0, 0, 0], 1.0: [1, 0, 0, 0]}),
    ],
)  # fmt: skip
def test_curricula_add_or_remove_one_head_in_each_equal_part_of_training(schedule, expected):
    curriculum = LossConfig(loss_weights=[1, 0.5, 0.4, 0.3], loss_weights_schedule=schedule)
    for progress, weights in expected.items():
        assert curriculum.weights_at(progress, 4) == weights, progress
    two = LossConfig(loss_weights_schedule=schedule)  # n = 2: halves
    assert [two.weights_at(p, 2) for p in (0.0, 0.49, 0.5)] == (
        [[1, 0], [1, 0], [1, 1]] if schedule == "forward" else [[1, 1], [1, 1], [1, 0]]
    )


def test_a_curriculum_step_trains_the_heads_of_its_part(tmp_path):
    """Through training itself: in the first quarter of a forward curriculum over four heads only head 1's loss
    moves the trunk (the step's gradient equals head 1's alone), in the last every head's does."""
    model = make_model(4)
    window = torch.randint(0, 97, (2, 16 + 4), generator=torch.Generator().manual_seed(3))
    curriculum = LossConfig(loss_weights_schedule="forward")
    early = mtp_loss(model, window, curriculum, weights=curriculum.weights_at(0.1, 4))
    alone = mtp_loss(model, window, LossConfig(loss_weights=[1, 0, 0, 0]))
    torch.testing.assert_close(early.total, alone.total)
    late = mtp_loss(model, window, curriculum, weights=curriculum.weights_at(0.9, 4))
    torch.testing.assert_close(late.total, late.per_head.sum())


def reference_head1_targets(model, window, k, weights):
    """Head 1's loss against tokens t+1..t+k by hand: log-softmax of its logits at each position, the token j ahead
    where the window holds it, each term's mean over its positions, weighted."""
    T = window.size(1) - model.n_future
    with torch.no_grad():
        log_probs = F.log_softmax(model.next_token_logits(window[:, :T]).double(), dim=-1)  # (B, T, V)
    total = 0.0
    for j in range(1, k + 1):
        span = min(T, window.size(1) - j)
        target = window[:, j : j + span]
        total += weights[j - 1] * -log_probs[:, :span].gather(-1, target[..., None]).mean()
    return total


@pytest.mark.parametrize("n_future", [1, 2])
def test_head1_targets_equal_a_hand_computation(n_future):
    """MTP without extra heads: head 1's logits scored against the next k tokens, the last positions counting only
    the tokens the window holds; head 2 keeps its own term."""
    model = make_model(n_future)
    window = torch.randint(0, 97, (2, 12 + n_future), generator=torch.Generator().manual_seed(4))
    settings = LossConfig(head1_targets=4, head1_target_weights=[1.0, 0.5, 0.25, 0.125])
    with torch.no_grad():
        out = mtp_loss(model, window, settings)
    expected = reference_head1_targets(model, window, 4, [1.0, 0.5, 0.25, 0.125])
    if n_future == 2:
        expected = expected + out.per_head[1].double()
    torch.testing.assert_close(out.total.double(), expected, rtol=1e-5, atol=1e-6)
    alone = reference_head1_targets(model, window, 1, [1.0])
    torch.testing.assert_close(out.per_head[0].double(), alone, rtol=1e-5, atol=1e-6)  # the logged loss: t+1's


@pytest.mark.parametrize("draft_vocab", [0, 40])
@pytest.mark.parametrize("n_future", [1, 3])
def test_head1_targets_sequential_gradients_equal_naive(n_future, draft_vocab):
    if draft_vocab and n_future == 1:
        pytest.skip("a reduced draft vocabulary needs draft heads")
    model = with_draft_vocab(make_model(n_future, draft_vocab=draft_vocab))
    window = torch.randint(0, 97, (3, 16 + n_future))
    loss = {"head1_targets": 3, "head1_target_weights": [0.8, 0.5, 0.2], "loss_chunk": 5}
    naive, naive_grads = gradients(model, window, "naive", scale=0.5, **loss)
    sequential, sequential_grads = gradients(model, window, "sequential", scale=0.5, **loss)
    torch.testing.assert_close(sequential.total, naive.total, rtol=1e-5, atol=0)
    torch.testing.assert_close(sequential.head1_future, naive.head1_future, rtol=1e-5, atol=0)
    for name, grad in naive_grads.items():
        relative = (sequential_grads[name] - grad).norm() / grad.norm()
        assert relative < 1e-5, f"{name}: relative difference {relative:.2e}"


def test_head1_target_weights_decay_to_next_token_prediction():
    settings = LossConfig(head1_targets=3)
    assert settings.head1_weights_at(0.0) == [1.0, 0.5, 0.25]
    assert settings.head1_weights_at(0.5) == [1.0, 0.25, 0.125]
    assert settings.head1_weights_at(1.0) == [1.0, 0.0, 0.0]
    assert LossConfig().head1_weights_at(0.3) is None


@pytest.mark.parametrize(
    ("settings", "model", "message"),
    [
        ({"loss_weights_schedule": "forward"}, 1, r"forward adds or removes heads 2..n .* model.n_future=1 has none"),
        ({"loss_weights_schedule": "reverse"}, 1, r"reverse adds or removes heads"),
        ({"loss_weights_schedule": "forward", "loss_weights": [1.0, 1.0]}, 4, r"has 2 entries but model.n_future=4"),
        ({"head1_targets": 1}, 1, r"^loss.head1_targets=1 scores head 1 against tokens t\+1..t\+k and needs k >= 2"),
        ({"head1_targets": 3, "head1_target_weights": [1.0, 0.5]}, 1, r"has 2 entries but loss.head1_targets=3"),
        ({"head1_target_weights": [1.0, 0.5]}, 1, r"read only with loss.head1_targets; set loss.head1_targets to 2"),
        ({"head1_targets": 2, "answers_after": "="}, 1, r"loss.answers_after scores answers alone; drop one"),
        ({"loss_weights_schedule": "forward", "loss_weights_final": [1.0, 0.1]}, 2, r"not loss.loss_weights_sch"),
    ],
)
def test_bad_lever_settings_are_one_sentence(settings, model, message):
    with pytest.raises(UserError, match=message):
        LossConfig(**settings).check_model(ModelConfig(n_future=model, n_layers=6))
