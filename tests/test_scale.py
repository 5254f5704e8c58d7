"""``exogym.scale``: parameter counts, the synthesized target's shapes and a step's compute seconds."""

import math

import pytest
import torch

from exogym.projection import param_bytes
from exogym.scale import Scale, default_layers, parse_count, transformer_shapes


@pytest.mark.parametrize(
    ("text", "count"),
    [
        ("10B", 10_000_000_000),
        ("1.5B", 1_500_000_000),
        ("350M", 350_000_000),
        ("1T", 1_000_000_000_000),
        ("125K", 125_000),
        ("7", 7),
        (10e9, 10_000_000_000),
        (350_000_000, 350_000_000),
    ],
)
def test_parse_count_reads_numbers_and_suffixed_strings(text, count) -> None:
    assert parse_count(text) == count


@pytest.mark.parametrize("text", ["nonsense", "10X", "", "B", "1.5.2B"])
def test_parse_count_refuses_a_string_that_is_not_a_count_naming_the_argument(text) -> None:
    with pytest.raises(ValueError, match=r"--scale: .* is not a count"):
        parse_count(text, "--scale")


@pytest.mark.parametrize("value", [0, -5, "0", float("inf"), float("nan"), 2e15])
def test_parse_count_refuses_a_count_out_of_range_naming_the_argument(value) -> None:
    with pytest.raises(ValueError, match=r"^params must be between 1 and 1e15"):
        parse_count(value)


@pytest.mark.parametrize("value", [True, None, [10]])
def test_parse_count_refuses_a_value_of_another_type(value) -> None:
    with pytest.raises(TypeError, match="params must be a number or a string"):
        parse_count(value)


@pytest.mark.parametrize(
    ("params", "layers"),
    [(1_000_000_000, 24), (10_000_000_000, 52), (350_000_000, 24), (1_500_000_000, 16), (123_456_789, 12)],
)
def test_transformer_shapes_sum_to_exactly_params(params, layers) -> None:
    shapes = transformer_shapes(params, layers)
    assert sum(math.prod(shape) for _, shape in shapes) == params
    assert len({name for name, _ in shapes}) == len(shapes)


@pytest.mark.parametrize(("params", "layers"), [(1_000_000_000, 24), (10_000_000_000, 52)])
def test_transformer_shapes_have_the_documented_blocks_of_a_width_multiple_of_64(params, layers) -> None:
    shapes = dict(transformer_shapes(params, layers))
    d = shapes["norm.weight"][0]
    assert d % 64 == 0
    for i in range(layers):
        assert shapes[f"blocks.{i}.qkv.weight"] == (3 * d, d)
        assert shapes[f"blocks.{i}.out.weight"] == (d, d)
        assert shapes[f"blocks.{i}.up.weight"] == (4 * d, d)
        assert shapes[f"blocks.{i}.down.weight"] == (d, 4 * d)
    assert shapes["embed.weight"][1] == d
    assert f"blocks.{layers}.qkv.weight" not in shapes


def test_transformer_shapes_refuse_fewer_params_than_the_blocks_need() -> None:
    # 24 blocks of the narrowest width, 64: 12 * 24 * 64^2 + (4 * 24 + 2) * 64 > 1000
    with pytest.raises(ValueError, match="more than the 1000 asked for"):
        transformer_shapes(1000, 24)


@pytest.mark.parametrize(("params", "layers"), [(1e9, 24), (10e9, 52), (100e9, 111)])
def test_default_layers_grow_as_the_cube_root_of_params(params, layers) -> None:
    # 24 * (params / 1e9) ** (1/3): 24, 24 * 2.154 = 51.7, 24 * 4.642 = 111.4
    assert default_layers(int(params)) == layers


def test_scale_target_has_the_count_and_default_depth_in_the_wire_dtype() -> None:
    target = Scale("1B").target_model()
    params = list(target.parameters())
    assert sum(p.numel() for p in params) == 1_000_000_000
    assert {p.device.type for p in params} == {"meta"}
    assert {p.dtype for p in params} == {torch.bfloat16}
    assert sum(1 for name, _ in target.named_parameters() if name.endswith("qkv_weight")) == 24
    assert param_bytes(target) == 2 * 1_000_000_000


def test_scale_wire_fp32_makes_four_bytes_a_parameter() -> None:
    assert param_bytes(Scale("1B", layers=24, wire="fp32").target_model()) == 4 * 1_000_000_000


def test_scale_of_a_string_and_of_a_number_count_the_same_parameters() -> None:
    assert Scale("10B").num_params == Scale(10e9).num_params == 10_000_000_000
    assert Scale("1.5B").num_params == Scale(1.5e9).num_params == 1_500_000_000


def test_seconds_per_step_from_flops_is_six_params_tokens_over_throughput() -> None:
    s = Scale("1B", tokens_per_step=4e6, accelerators=8, peak_flops=1e15, mfu=0.5)
    # 6 * 1e9 * 4e6 / (8 * 1e15 * 0.5) = 2.4e16 / 4e15
    assert s.seconds_per_step() == pytest.approx(6.0)
    # the default mfu 0.4: 2.4e16 / (8 * 1e15 * 0.4) = 2.4e16 / 3.2e15
    assert Scale("1B", tokens_per_step=4e6, accelerators=8, peak_flops=1e15).seconds_per_step() == pytest.approx(7.5)


def test_seconds_per_step_is_step_seconds_or_none_without_compute() -> None:
    assert Scale("1B", step_seconds=0.8).seconds_per_step() == 0.8
    assert Scale("1B").seconds_per_step() is None
    assert Scale("1B", tokens_per_step=4e6).seconds_per_step() is None


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"params": "huge"}, "params"),
        ({"params": "1B", "layers": 0}, "layers"),
        ({"params": "1B", "layers": 2.5}, "layers"),
        ({"params": "1B", "wire": "int8"}, "wire"),
        ({"params": "1B", "step_seconds": -1.0}, "step_seconds"),
        ({"params": "1B", "step_seconds": 0}, "step_seconds"),
        ({"params": "1B", "tokens_per_step": 0}, "tokens_per_step"),
        ({"params": "1B", "tokens_per_step": 1e6, "peak_flops": math.inf}, "peak_flops"),
        ({"params": "1B", "accelerators": 0}, "accelerators"),
        ({"params": "1B", "mfu": 1.5}, "mfu"),
        ({"params": "1B", "mfu": 0.0}, "mfu"),
        ({"params": "1B", "peak_flops": 1e15}, "tokens_per_step"),
        ({"params": "1B", "step_seconds": 1.0, "tokens_per_step": 1e6, "peak_flops": 1e15}, "step_seconds"),
        ({}, "params"),
    ],
)
def test_scale_refuses_a_bad_field_naming_it(kwargs, field) -> None:
    with pytest.raises(ValueError, match=field):
        Scale(**kwargs)


def test_scale_refuses_params_and_model_together() -> None:
    with torch.device("meta"):
        model = torch.nn.Linear(4, 4)
    with pytest.raises(ValueError, match="params .* or model, not both"):
        Scale("1B", model=model)


def test_scale_of_a_model_refuses_one_not_on_the_meta_device() -> None:
    with pytest.raises(ValueError, match=r"meta device.*\['cpu'\]"):
        Scale(model=torch.nn.Linear(4, 4))


def test_scale_of_a_model_refuses_layers() -> None:
    with torch.device("meta"):
        model = torch.nn.Linear(4, 4)
    with pytest.raises(ValueError, match="layers"):
        Scale(model=model, layers=3)


def test_scale_of_a_meta_model_counts_its_trainable_parameters_in_the_wire_dtype() -> None:
    with torch.device("meta"):
        model = torch.nn.Sequential(torch.nn.Linear(10, 20), torch.nn.Linear(20, 3))
    model[1].weight.requires_grad_(False)
    scale = Scale(model=model)
    # trainable: 10 * 20 + 20 + 3 (the frozen 20 * 3 weight is not)
    assert scale.num_params == 223
    assert param_bytes(scale.target_model()) == 2 * 223
    assert next(model.parameters()).dtype == torch.float32  # the given model is not converted


@pytest.mark.parametrize("mfu", ["0.5", True])
def test_scale_refuses_an_mfu_that_is_not_a_number_naming_it(mfu) -> None:
    with pytest.raises(ValueError, match="mfu"):
        Scale("1B", mfu=mfu)
