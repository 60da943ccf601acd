from dataclasses import fields

import pytest
from conftest import ROOT, compose_train
from hydra.errors import ConfigCompositionException, MissingConfigException
from omegaconf import OmegaConf
from omegaconf.errors import MissingMandatoryValue

from mtp.commands.pretrain import check_groups_not_nulled, config_error_sentence
from mtp.errors import UserError
from mtp.model.config import ModelConfig, stored_model_config
from mtp.training.loss_config import LossConfig


def test_derived_values():
    config = ModelConfig(d_model=96, n_layers=6, n_heads=4, n_kv_heads=2, n_future=4)
    assert config.ffn_hidden % config.ffn_multiple_of == 0 and config.ffn_hidden >= 8 * 96 // 3
    assert config.n_layer_blocks == 3
    assert LossConfig().weights(config.n_future) == [1.0] * 4
    assert ModelConfig(n_layers=6, n_future=4, head_type="linear").n_layer_blocks == 6


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"n_future": 0}, "n_future=0 must be at least 1"),
        ({"n_future": 10, "n_layers": 10}, "leaves no trunk layer"),
        ({"n_kv_heads": 3}, "must divide"),
        ({"head_type": "eagle"}, "head_type='eagle' is not one of"),
        ({"vocab_size": 0}, "vocab_size=0 must be at least 1"),
        (
            {"head_type": "eagle3", "n_layers": 3},
            r"^model.head_type=eagle3 reads the inputs of 3 trunk layers, and "
            r"model.n_layers=3 leaves 2 beside the draft layer; use n_layers >= 4\.$",
        ),
        (
            {"head_type": "eagle3", "eagle3_layers": [2, 5, 9]},
            r"^model.eagle3_layers=\[2, 5, 9\] names layer 9, but "
            r"the trunk's layers are 0..8; use layers in that range, e.g. \[2,4,6\]\.$",
        ),
        ({"head_type": "eagle3", "eagle3_layers": [-1, 2, 4]}, "names layer -1, but the trunk's layers are 0..8"),
        ({"head_type": "eagle3", "eagle3_layers": [2, 4]}, r"names 2 layers; EAGLE-3 fuses 3 \(low, middle, high\)"),
        (
            {"eagle3_layers": [2, 4, 6]},
            r"^model.eagle3_layers=\[2, 4, 6\] applies to EAGLE-3 heads only, not "
            "head_type='transformer'; set model.head_type=eagle3 or drop model.eagle3_layers.$",
        ),
        ({"head_type": "eagle3", "share_depth": True}, "share_depth=true applies to causal heads only"),
        ({"head_type": "causal", "causal_first_token": "drop"}, "causal_first_token='drop' is not one of keep, zero"),
        (
            {"causal_first_token": "zero"},
            r"^model.causal_first_token=zero applies to causal heads only, not head_type='transformer'; set "
            r"model.head_type=causal or drop model.causal_first_token.$",
        ),
    ],
)
def test_bad_values_name_the_problem(kwargs, message):
    with pytest.raises(UserError, match=message):
        ModelConfig(**kwargs)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"mode": "fast"}, "loss.mode='fast' is not one of"),
        ({"loss_weights": [1.0, -1.0, 1.0, 1.0]}, "loss.loss_weights must be non-negative"),
        ({"head_loss": "kl"}, "loss.head_loss='kl' is not one of ce, distill, ce\\+distill"),
        ({"distill_top_k": 0}, "loss.distill_top_k=0 must be at least 1"),
        ({"distill_temperature": 0.0}, "loss.distill_temperature=0.0 must be positive"),
        ({"causal_inputs": "sampled"}, "loss.causal_inputs='sampled' is not one of"),
        ({"causal_draft_rate": 1.5}, "loss.causal_draft_rate=1.5 must lie between 0 and 1"),
        ({"loss_weights_schedule": "cosine"}, "loss.loss_weights_schedule='cosine' is not one of"),
        ({"loss_weights_schedule": "steps"}, r"set loss.loss_weights_final .*\[1.0,0.1,0.1,0.1\]"),
        ({"loss_weights_schedule": "steps", "loss_weights": [1.0, 0.3]}, r"e.g. \[1.0,0.1\]"),
        ({"loss_weights_final": [1.0, 0.1, 0.1, 0.1]}, "read only by the steps and linear schedules"),
        ({"loss_chunk": -1}, "loss.loss_chunk=-1 must be 0"),
    ],
)
def test_bad_loss_values_name_the_problem(kwargs, message):
    with pytest.raises(UserError, match=message):
        LossConfig(**kwargs)


@pytest.mark.parametrize(
    ("model", "loss", "message"),
    [
        ({}, {"loss_weights": [1.0, 1.0]}, r"^loss.loss_weights has 2 entries but model.n_future=4; give one weight"),
        ({"n_future": 2}, {"loss_weights_schedule": "linear", "loss_weights_final": [1.0]}, "_final has 1 entries"),
        ({}, {"causal_inputs": "drafts"}, "^loss.causal_inputs=drafts applies to causal and eagle3 heads only"),
    ],
)
def test_loss_settings_that_contradict_the_model_are_one_sentence(model, loss, message):
    config, settings = ModelConfig(**model), LossConfig(**loss)
    with pytest.raises(UserError, match=message):
        settings.check_model(config)
    LossConfig().check_model(config)
    LossConfig(loss_weights=[1.0, 1.0]).check_model(ModelConfig(n_future=2))
    LossConfig(causal_inputs="mixed").check_model(ModelConfig(head_type="causal"))


def test_causal_inputs_true_from_the_command_line_is_the_word():
    """Hydra reads loss.causal_inputs=true as a boolean."""
    assert LossConfig.from_dict({"causal_inputs": True}).causal_inputs == "true"


def test_unknown_key_is_named():
    with pytest.raises(UserError, match="unknown model setting.*dmodel"):
        ModelConfig.from_dict({"dmodel": 3})
    with pytest.raises(UserError, match="unknown loss setting.*headloss; valid settings are answers_after, "):
        LossConfig.from_dict({"headloss": "ce"})


def test_a_loss_setting_given_to_the_model_says_where_it_moved():
    with pytest.raises(UserError, match=r"^model.head_loss, model.loss moved to the loss settings; set "
                       r"loss.head_loss, loss.mode instead.$"):  # fmt: skip
        ModelConfig.from_dict({"head_loss": "distill", "loss": "naive"})


def test_a_stored_model_config_of_either_layout_gives_both_configs():
    """A checkpoint written before LossConfig kept the loss settings in its model config: they move to the loss
    config (``loss`` as ``mode``), and those it never had keep their defaults; today's keeps them apart."""
    model = ModelConfig(n_future=2, head_type="causal")
    loss = LossConfig(mode="naive", loss_weights=[1.0, 0.5], head_loss="distill", causal_inputs="drafts")
    old = model.to_dict() | {"loss": "naive", "loss_weights": [1.0, 0.5], "head_loss": "distill"}
    old |= {"causal_inputs": "drafts"}
    assert (stored_model_config(old), LossConfig.stored(old)) == (model, loss)
    assert (stored_model_config(model.to_dict()), LossConfig.stored(model.to_dict(), loss.to_dict())) == (model, loss)
    oldest = model.to_dict() | {"loss": "sequential", "loss_weights": None, "loss_chunk": 0}  # tests/fixtures/legacy
    assert (stored_model_config(oldest), LossConfig.stored(oldest)) == (model, LossConfig())


def test_linear_heads_need_no_extra_layers():
    """Linear heads are unembeddings only: every one of n_layers blocks is trunk, so 8 heads fit 2 blocks."""
    assert ModelConfig(n_layers=2, n_future=8, head_type="linear").n_layer_blocks == 2
    with pytest.raises(UserError, match="n_future=8 leaves no trunk layer out of model.n_layers=2"):
        ModelConfig(n_layers=2, n_future=8)  # transformer heads take a block each


def test_round_trip_through_dict():
    config = ModelConfig(n_future=2, draft_vocab=8)
    assert ModelConfig.from_dict(config.to_dict()) == config
    loss = LossConfig(loss_weights=[1.0, 0.5], loss_weights_schedule="linear", loss_weights_final=[1.0, 0.0])
    assert LossConfig.from_dict(loss.to_dict()) == loss


CONF = ROOT / "conf"
SMALL = {"d_model": 192, "n_layers": 10, "n_heads": 6, "n_kv_heads": 2}  # size=small, the default
# Every model preset's (n_future, vocab_size, head_type) as each preset file spelled it out in full
PRESETS = {
    "mtp1": (1, 8192, "transformer"),
    "mtp2": (2, 8192, "transformer"),
    "mtp4": (4, 8192, "transformer"),
    "mtp8": (8, 8192, "transformer"),
    "byte1": (1, 320, "transformer"),
    "byte8": (8, 320, "transformer"),
    "causal2": (2, 8192, "causal"),
    "causal4": (4, 8192, "causal"),
    "bytecausal8": (8, 320, "causal"),
    "medusa4": (4, 8192, "medusa"),
    "eagle3": (4, 8192, "eagle3"),
}


@pytest.mark.parametrize("preset", PRESETS)
def test_every_model_preset_composes_to_its_recorded_settings(preset):
    """The presets share base files; each composes to exactly the settings (in order) it always had, and changes
    nothing outside ``model`` but the tokenizer (bytes for the byte presets)."""
    n_future, vocab_size, head_type = PRESETS[preset]
    expected = {
        "n_future": n_future,
        "vocab_size": vocab_size,
        "max_seq_len": 4096,
        "rope_theta": 10000.0,
        "norm_eps": 1e-5,
        "head_type": head_type,
        "share_depth": False,
        "causal_first_token": "keep",
        "medusa_layers": 1,
        "draft_vocab": 0,
        **({"eagle3_layers": None} if head_type == "eagle3" else {}),
        **SMALL,
    }
    composed = compose_train([f"model={preset}"])
    model = OmegaConf.to_container(composed.model, resolve=True, throw_on_missing=True)
    assert list(model.items()) == list(expected.items())
    tokenizer = OmegaConf.to_container(composed.data.tokenizer, resolve=True)
    assert tokenizer == (
        {"kind": "byte"} if vocab_size == 320 else {"kind": "bpe", "vocab_size": 8192, "train_bytes": 0}
    )
    rest, default = (OmegaConf.to_container(c) for c in (composed, compose_train([])))  # the rest, unresolved
    for cfg in (rest, default):
        del cfg["model"], cfg["data"]["tokenizer"], cfg["hydra"]  # hydra: its record of the overrides differs
    assert rest == default


def test_the_loss_group_holds_every_loss_setting_at_its_default():
    """conf/loss/default.yaml: LossConfig's fields in order, at their defaults, handed to the LightningModule; a key
    is set as loss.key on the command line, and a loss setting given as a model one says where it moved."""
    composed = compose_train([])
    assert list(composed.loss) == [f.name for f in fields(LossConfig)]
    assert LossConfig.from_dict(OmegaConf.to_container(composed.loss, resolve=True)) == LossConfig()
    assert composed.module.loss == composed.loss
    distilled = compose_train(["experiment=pretrained_heads", "loss.head_loss=distill", "loss.causal_inputs=true"])
    assert LossConfig.from_dict(OmegaConf.to_container(distilled.module.loss)).head_loss == "distill"
    with pytest.raises(ConfigCompositionException) as error:
        compose_train(["model.head_loss=distill"])
    assert config_error_sentence(error.value) == "model.head_loss is a loss setting now; set loss.head_loss instead."
    with pytest.raises(ConfigCompositionException) as error:
        compose_train(["model.loss=naive"])
    assert config_error_sentence(error.value) == "model.loss is a loss setting now; set loss.mode instead."


def test_model_base_files_are_not_presets():
    """Hydra lists exactly the presets when a model name is wrong, and a base file alone leaves n_future unset."""
    with pytest.raises(MissingConfigException) as error:
        compose_train(["model=mtp3"])
    listed = str(error.value).split("Available options in 'model':")[1].split("Config search path")[0].split()
    assert listed == sorted(PRESETS)
    bases = sorted(path.stem for path in (CONF / "model" / "_base").glob("*.yaml"))
    assert bases == ["bpe", "byte"]
    for base in bases:
        cfg = compose_train([f"model=_base/{base}"])
        with pytest.raises(MissingMandatoryValue, match="n_future"):
            OmegaConf.to_container(cfg.model, throw_on_missing=True)


def test_a_config_group_set_to_null_is_one_sentence_naming_hydras_way_to_drop_it():
    with pytest.raises(UserError, match=r"^logger=null cannot turn a config group off; write '~logger' instead"):
        check_groups_not_nulled(["model=mtp1", "logger=null"], ROOT / "conf")
    check_groups_not_nulled(["trainer.max_steps=null", "model=mtp1", "~logger"], ROOT / "conf")  # settings may be null
    assert "logger" not in compose_train(["~logger"]) and "tensorboard" in str(compose_train([]).logger)


def test_deepseek_v3s_weights_are_a_loss_option():
    """loss=deepseek_v3: heads 2..4 at 0.3, then 0.1 after 0.68 of the run; every other loss setting at its default."""
    loss = LossConfig.from_dict(OmegaConf.to_container(compose_train(["loss=deepseek_v3"]).loss, resolve=True))
    assert loss.weights_at(0.5, 4) == [1.0, 0.3, 0.3, 0.3] and loss.weights_at(0.7, 4) == [1.0, 0.1, 0.1, 0.1]
    defaults = LossConfig().to_dict()
    changed = {"loss_weights", "loss_weights_schedule", "loss_weights_final", "loss_weights_switch"}
    assert {name for name, value in loss.to_dict().items() if defaults[name] != value} == changed
