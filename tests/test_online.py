"""Online updates of the draft heads (mtp.pretrained.online): the output stays head 1's, acceptance rises on what was
served."""

import copy
import gzip
import json
import re

import pytest
import torch

from mtp.decode import GenerationConfig, generate
from mtp.decode.plan import Plan
from mtp.decode.settings import HeadsSettings
from mtp.errors import SettingError, UserError
from mtp.model import MTPModel
from mtp.model.config import ModelConfig
from mtp.training.online import OnlineHeads, OnlineSettings, draft_head_parameters

TYPES = {"transformer": {}, "linear": {}, "causal": {}, "medusa": {}}


def random_model(head_type: str) -> MTPModel:
    torch.manual_seed(0)
    sizes = {"vocab_size": 61, "d_model": 32, "n_layers": 6, "n_heads": 4, "n_kv_heads": 2}
    model = MTPModel(ModelConfig(**sizes, n_future=4, head_type=head_type)).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.startswith("heads.residuals"):  # medusa heads start as head 1's copies (zero residual)
                p.normal_(0, 0.1)
            if name.startswith("heads.outputs"):  # peaked distributions, as a trained model's are
                p.mul_(10)
    return model


def head1_parameters(model: MTPModel) -> dict[str, torch.Tensor]:
    """Everything but the draft heads' own parameters: what decides head 1's output."""
    own = {id(p) for p in draft_head_parameters(model)}
    return {name: p.detach().clone() for name, p in model.named_parameters() if id(p) not in own}


@pytest.mark.parametrize(  # the other head types with the slow tests
    "head_type", [pytest.param(t, marks=[] if t == "transformer" else [pytest.mark.slow]) for t in TYPES]
)
def test_updates_raise_acceptance_and_leave_the_output_what_head_1_decodes(head_type):
    """A prompt served again and again: after each, the heads learn head 1's distribution where their drafts were
    rejected. Greedy output equals autoregressive decoding of the model before any update, every time, head 1's
    parameters do not move, and the heads accept more on the later servings."""
    model = random_model(head_type)
    before = copy.deepcopy(model)
    frozen = head1_parameters(model)
    prompt = torch.randint(0, 61, (12,), generator=torch.Generator().manual_seed(1)).tolist()
    config = Plan(GenerationConfig(max_new_tokens=32), heads=HeadsSettings(heads=4))
    expected, _ = generate(before, [prompt], Plan(GenerationConfig(max_new_tokens=32), HeadsSettings(heads=1)))
    online = OnlineHeads(model, OnlineSettings(online=1, online_steps=5, online_lr=3e-3))
    per_serving = []
    for _ in range(5):
        output, stats = generate(model, [prompt], config)
        assert output == expected
        per_serving.append(stats.tokens_per_forward)
        assert online.observe(prompt, output[0])
    assert online.updates == 5
    assert per_serving[-1] > per_serving[0] + 0.4, per_serving
    for name, value in head1_parameters(model).items():
        assert torch.equal(value, frozen[name]), f"{name} moved"
    after, start = draft_head_parameters(model), draft_head_parameters(before)
    assert all(not torch.equal(after[i], start[i]) for i in range(len(after)))


def test_rejections_are_where_a_heads_draft_differs_from_the_emitted_token():
    """A completion built so that head 2's draft is right at every other position (each token chosen after the
    prefix that drafts it): rejected exactly where a head's argmax at t differs from token t + k of the completion."""
    model = random_model("transformer")
    online = OnlineHeads(model, OnlineSettings())
    prompt, completion = [1, 2, 3, 4, 5], []
    for i in range(8):
        tokens = torch.tensor(prompt + completion)
        with torch.no_grad():
            draft = model(tokens[None])[1, 0, len(prompt) + i - 2].argmax().item()  # head 2's for this position
        completion.append(draft if i % 2 == 0 else (draft + 1) % 61)
    observed = online.rejections(prompt, completion)
    tokens = torch.tensor(prompt + completion)
    with torch.no_grad():
        logits = model(tokens[None])  # (4, 1, L, V)
    for k in (2, 3, 4):
        drafts = logits[k - 1, 0].argmax(-1)
        for t in range(len(tokens)):
            in_completion = len(prompt) <= t + k < len(tokens)
            expected = in_completion and bool(drafts[t] != tokens[t + k])
            assert bool(observed.rejected[k - 2, t]) == expected, (k, t)
    head2 = observed.rejected[0, len(prompt) - 2 :].tolist()
    assert head2 == [False, True] * 4 + [False] * 2  # the last two positions draft past the end


def test_updates_every_n_prompts_and_only_then():
    online = OnlineHeads(random_model("linear"), OnlineSettings(online=3, online_steps=1))
    updated = [online.observe([1, 2, 3], [4, 5, 6, 7, 8]) for _ in range(7)]
    assert updated == [False, False, True, False, False, True, False] and online.updates == 2


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"online": 0}, "online=0 must be at least 1"),
        ({"online_steps": 0}, "online_steps=0 must be at least 1"),
        ({"online_lr": 0.0}, "online_lr=0 must be positive"),
        ({"online_keep": 0}, "online_keep=0 must be at least 1"),
    ],
)
def test_bad_settings_name_the_problem(settings, message):
    with pytest.raises(SettingError, match=re.escape(message)):
        OnlineSettings(**settings)


# -- decode.py --prompts F --online N


def write_prompts(path, prompts, compress=False):
    text = "".join(json.dumps({"task_id": i, "prompt": p}) + "\n" for i, p in enumerate(prompts))
    if compress:
        with gzip.open(path, "wt") as f:
            f.write(text)
    else:
        path.write_text(text)
    return path


@pytest.mark.parametrize("compress", [False, True])
def test_decode_streams_a_prompts_file_one_json_line_each(tiny_checkpoints, tmp_path, capsys, compress):
    from test_decode_scripts import decode

    prompts = ["def f(x):\n", "import os\n", "class A:\n", "for i in range(3):\n"]
    path = write_prompts(tmp_path / ("p.jsonl.gz" if compress else "p.jsonl"), [*prompts, "never read"], compress)
    checkpoint = str(tiny_checkpoints["mtp4"])
    args = [checkpoint, "--self-speculative", "--prompts", str(path), "--max-new-tokens", "12", "--prompt-count", "4"]
    assert decode.main([*args, "--online", "2", "--online-steps", "2"]) == 0
    captured = capsys.readouterr()
    lines = [json.loads(line) for line in captured.out.splitlines()]
    assert [line["task_id"] for line in lines] == [0, 1, 2, 3]
    assert [line["heads_updated"] for line in lines] == [False, True, False, True]
    assert {"completion", "tokens", "forwards", "tokens_per_forward", "acceptance"} <= lines[0].keys()
    assert "stream: prompts=4" in captured.err and "updates=2" in captured.err
    for line, prompt in zip(lines, prompts, strict=True):  # greedy: each completion is autoregressive decoding's
        assert decode.main([checkpoint, "--prompt", prompt, "--max-new-tokens", "12"]) == 0
        assert capsys.readouterr().out.startswith(prompt + line["completion"])


@pytest.mark.parametrize(
    ("lines", "args", "message"),
    [
        (['{"prompt": "x"}'], ["--online", "2"], "--online updates the heads that draft; add --self-speculative"),
        (['{"prompt": "x"}'], ["--self-speculative", "--online", "0"], "--online 0 must be at least 1"),
        (['{"prompt": "x"}'], ["--self-speculative", "--batch-size", "2"], "drop --batch-size"),
        (['{"prompt": "x"}', "{oops"], ["--self-speculative"], "line 2 of"),
        (['{"text": "x"}'], ["--self-speculative"], "line 1 of"),
        ([""], ["--self-speculative"], "holds no prompts"),
        (['{"prompt": "x"}'], ["--prompt-count", "0"], "--prompt-count 0 must be at least 1"),
    ],
)
def test_bad_streams_are_one_sentence(tiny_checkpoints, tmp_path, lines, args, message):
    from test_decode_scripts import decode

    path = tmp_path / "p.jsonl"
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(UserError, match=re.escape(message)):
        decode.main([str(tiny_checkpoints["mtp4"]), "--prompts", str(path), *args])


@pytest.mark.parametrize(
    ("flags", "message"),
    [(["--online", "2"], "give them with --prompts F"), (["--prompt-count", "2"], "give one, or drop --prompt-count")],
)
def test_stream_flags_without_a_stream_are_refused(tiny_checkpoints, flags, message):
    from test_decode_scripts import decode

    with pytest.raises(UserError, match=message):
        decode.main([str(tiny_checkpoints["mtp4"]), "--self-speculative", "--prompt", "x", *flags])
