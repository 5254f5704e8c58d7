"""A sweep's grid: parsing, which names apply to which strategy, and errors before any run."""

import pytest

from exogym.cli.grid import parse_grid, parse_value, points
from exogym.strategy.registry import PRESETS, build, parameters

BASE_RUN = {"nodes": 4, "steps": 10, "batch_size": 8, "val_size": 64, "workers": None, "network": "internet",
            "compute": "flops"}  # fmt: skip


def _presets(*names):
    return {n: PRESETS[n][0] for n in names}


def test_parse_grid_reads_numbers_flags_and_names() -> None:
    assert parse_grid(["H=10,50", "network=internet,ethernet", "lr=1e-3", "shuffle=false"]) == {
        "H": [10, 50], "network": ["internet", "ethernet"], "lr": [0.001], "shuffle": [False]
    }  # fmt: skip
    assert parse_value(" 7 ") == 7 and isinstance(parse_value("0.5"), float)
    with pytest.raises(ValueError, match=r"'H' is not NAME=VALUE\[,VALUE...\]; write e.g. --grid H=10,50,100"):
        parse_grid(["H"])
    with pytest.raises(ValueError, match="H is given twice"):
        parse_grid(["H=1", "H=2"])


def test_presets_declare_their_parameters_in_their_factorys_signature() -> None:
    assert list(parameters(PRESETS["ddp"][0])) == ["lr", "aggregate"]
    assert list(parameters(PRESETS["diloco"][0])) == ["lr", "H", "aggregate"]
    assert list(parameters(PRESETS["sparta"][0])) == ["lr", "p_sparta"]
    assert build("sparta", 1e-3, 20, {"p_sparta": 0.1}).pipeline.modules[0].p == 0.1
    with pytest.raises(ValueError, match=r"strategy 'ddp' takes no \['H2'\]; it takes \['lr', 'aggregate'\]"):
        build("ddp", 1e-3, 20, {"H2": 3})


def test_a_strategy_parameter_multiplies_only_the_strategies_that_take_it() -> None:
    grid = {"H": [10, 50], "nodes": [2, 4]}
    plan = points(grid, _presets("ddp", "diloco"), {"lr": 1e-3, "H": 20}, BASE_RUN, [0, 1])
    ddp = [p for p in plan if p.strategy == "ddp"]
    diloco = [p for p in plan if p.strategy == "diloco"]
    assert [(p.axes, p.seed) for p in ddp] == [({"nodes": n}, s) for n in (2, 4) for s in (0, 1)]
    assert len(diloco) == 2 * 2 * 2 and {p.params["H"] for p in diloco} == {10, 50}
    assert all(p.params == {"lr": 1e-3, "aggregate": "mean"} for p in ddp) and {p.run["nodes"] for p in ddp} == {2, 4}
    assert diloco[0].label() == "diloco H=10 nodes=2 seed=0"


def test_fit_keywords_are_grid_names_and_integers_become_floats_where_a_float_is_expected() -> None:
    plan = points({"log_interval": [5], "lr": [1]}, _presets("ddp"), {"lr": 1e-3, "H": 20}, BASE_RUN, [0])
    assert plan[0].fit_args == {"log_interval": 5} and plan[0].params == {"lr": 1.0, "aggregate": "mean"}
    assert isinstance(plan[0].params["lr"], float)


@pytest.mark.parametrize(
    ("grid", "message"),
    [
        ({"foo": [1]}, r"unknown name 'foo'; a grid varies run arguments \['batch_size', 'compute', "),
        ({"nodes": [2, "x"]}, "nodes takes integers, got 'x'"),
        ({"nodes": [0]}, "nodes must be >= 1, got 0"),
        ({"H": []}, r"H: give a non-empty list of values, got \[\]"),
        ({"H": [10, 10]}, r"H: a value is listed twice in \[10, 10\]"),
        ({"shuffle": [1]}, "shuffle takes true or false, got 1"),
        ({"compute": ["fast"]}, "compute is 'flops', 'measured' or seconds per step >= 0, got 'fast'"),
        ({"seed": [0, 1]}, r"seed: seeds are not a grid name; give them as --seeds 0,1,2 \(sweep"),
    ],
)
def test_a_bad_grid_name_or_value_is_an_error_naming_it(grid, message) -> None:
    with pytest.raises(ValueError, match=message):
        points(grid, _presets("ddp", "diloco"), {"lr": 1e-3, "H": 20}, BASE_RUN, [0])


def test_a_grid_name_only_other_presets_take_names_them() -> None:
    with pytest.raises(
        ValueError, match=r"unknown name 'aggregate' \(ddp, fedavg, diloco, .* take 'aggregate'; noloco do"
    ):
        points({"aggregate": ["median"]}, _presets("noloco"), {"lr": 1e-3, "H": 20}, BASE_RUN, [0])
