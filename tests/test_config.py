import pytest

from mtp.config import ModelConfig
from mtp.errors import UserError


def test_derived_values():
    config = ModelConfig(d_model=96, n_layers=6, n_heads=4, n_kv_heads=2, n_future=4)
    assert config.ffn_hidden % config.ffn_multiple_of == 0 and config.ffn_hidden >= 8 * 96 // 3
    assert config.n_layer_blocks == 3
    assert config.weights == [1.0] * 4
    assert ModelConfig(n_layers=6, n_future=4, head_type="linear").n_layer_blocks == 6


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"n_future": 0}, "n_future=0 must be at least 1"),
        ({"n_future": 10, "n_layers": 10}, "leaves no trunk layer"),
        ({"n_kv_heads": 3}, "must divide"),
        ({"head_type": "eagle"}, "head_type='eagle' is not one of"),
        ({"loss": "fast"}, "loss='fast' is not one of"),
        ({"loss_weights": [1.0, 1.0]}, "one weight per head"),
        ({"loss_weights": [1.0, -1.0, 1.0, 1.0]}, "non-negative"),
        ({"vocab_size": 0}, "vocab_size=0 must be at least 1"),
    ],
)
def test_bad_values_name_the_problem(kwargs, message):
    with pytest.raises(UserError, match=message):
        ModelConfig(**kwargs)


def test_unknown_key_is_named():
    with pytest.raises(UserError, match="unknown model setting.*dmodel"):
        ModelConfig.from_dict({"dmodel": 3})


def test_linear_heads_need_no_extra_layers():
    ModelConfig(n_layers=2, n_future=8, head_type="linear")


def test_round_trip_through_dict():
    config = ModelConfig(n_future=2, loss_weights=[1.0, 0.5])
    assert ModelConfig.from_dict(config.to_dict()) == config
