"""Hugging Face models train as they are: a mapping batch is passed as keyword arguments
(``model(**batch)``), the loss is the output's ``loss`` (attribute or key), and examples that are
dicts of token-id lists collate into one tensor per key."""

from __future__ import annotations

import math
from dataclasses import dataclass

import pytest
import torch
from torch.utils.data import Dataset

from exogym import Trainer
from exogym.data import collate
from exogym.runtime import preflight
from exogym.runtime.forward import call, forward_loss, loss_of
from exogym.strategy import DiLoCoStrategy, OptimSpec
from tests.fake_world import train_ranks
from tests.helpers import FIT_DEFAULTS, TinyNet


class KeywordNet(torch.nn.Module):
    """Takes its inputs as keywords, as Hugging Face models do; returns what ``make_output`` makes."""

    def __init__(self, make_output=lambda loss: {"loss": loss}) -> None:
        super().__init__()
        self.w = torch.nn.Parameter(torch.ones(3))
        self.make_output = make_output
        self.seen: dict | None = None

    def forward(self, input_ids, labels):
        self.seen = {"input_ids": input_ids, "labels": labels}
        return self.make_output(((input_ids.float() * self.w).sum(-1) - labels.float()).square().mean())


@dataclass
class Output:
    """A model output with a ``loss`` field, like ``transformers.utils.ModelOutput``."""

    loss: torch.Tensor | None
    logits: torch.Tensor | None = None


def _batch() -> dict[str, torch.Tensor]:
    return {"input_ids": torch.tensor([[1, 2, 3], [4, 5, 6]]), "labels": torch.tensor([1, 2])}


def test_a_mapping_batch_is_passed_as_keyword_arguments() -> None:
    model, batch = KeywordNet(), _batch()
    call(model, batch)
    assert model.seen is not None and model.seen["input_ids"] is batch["input_ids"]
    assert model.seen["labels"] is batch["labels"]


def test_a_batch_that_is_no_mapping_is_passed_whole() -> None:
    model = TinyNet()
    batch = (torch.randn(4, 8), torch.randn(4, 1))
    torch.testing.assert_close(forward_loss(model, batch), model(batch))


def test_the_loss_is_the_outputs_loss_attribute_or_loss_key() -> None:
    batch = _batch()
    expected = KeywordNet()(**batch)["loss"]
    from_key = forward_loss(KeywordNet(lambda loss: {"loss": loss, "logits": torch.zeros(2, 5)}), batch)
    from_attribute = forward_loss(KeywordNet(lambda loss: Output(loss, torch.zeros(2, 5))), batch)
    torch.testing.assert_close(from_key, expected)
    torch.testing.assert_close(from_attribute, expected)
    assert from_key.shape == () and from_attribute.requires_grad


def test_an_output_without_a_loss_raises_naming_what_the_model_returned() -> None:
    batch = _batch()
    with pytest.raises(
        TypeError, match=r"model\(\*\*batch\) returned a Output without a loss: give the batch the labels"
    ):
        loss_of(Output(None, torch.zeros(2, 5)), batch)
    with pytest.raises(
        TypeError, match=r"model\(\*\*batch\) must return a scalar loss tensor .* or an output with a 'loss' key or "
        r"attribute, got str"
    ):  # fmt: skip
        loss_of("3.0", batch)
    with pytest.raises(TypeError, match=r"got \(2,\) as the loss of the dict it returned"):
        loss_of({"loss": torch.ones(2)}, batch)
    with pytest.raises(TypeError, match=r"model\(batch\) must return a scalar loss tensor .*, got \(4,\); compute"):
        loss_of(torch.ones(4), (torch.ones(4),))


def test_dict_examples_of_token_id_lists_collate_into_one_tensor_per_key() -> None:
    examples = [
        {"input_ids": [1, 2, 3], "labels": [1, 2, 3], "text": "abc"},
        {"input_ids": [4, 5, 6], "labels": [4, 5, 6], "text": "def"},
    ]
    batch = collate(examples)
    assert batch["input_ids"].dtype == torch.int64 and torch.equal(
        batch["input_ids"], torch.tensor([[1, 2, 3], [4, 5, 6]])
    )
    assert torch.equal(batch["labels"], batch["input_ids"]) and batch["text"] == ["abc", "def"]
    tensors = collate([{"input_ids": torch.tensor([1, 2])}, {"input_ids": torch.tensor([3, 4])}])
    assert torch.equal(tensors["input_ids"], torch.tensor([[1, 2], [3, 4]]))
    nested = collate([{"inputs": {"ids": [1, 2], "mask": [1.0, 0.0]}}] * 2)
    assert nested["inputs"]["ids"].shape == (2, 2) and nested["inputs"]["mask"].dtype == torch.float32
    pairs = collate([(torch.ones(2), 0), (torch.zeros(2), 1)])  # no mapping: default_collate
    assert pairs[0].shape == (2, 2) and torch.equal(pairs[1], torch.tensor([0, 1]))


def test_token_id_lists_of_different_lengths_raise_naming_the_key_and_the_fix() -> None:
    with pytest.raises(
        ValueError, match=r"the examples' 'input_ids' lists cannot make one tensor \(lengths \[2, 3\]\)"
    ):
        collate([{"input_ids": [1, 2, 3]}, {"input_ids": [1, 2]}])


class _Tokens(Dataset):
    """Windows of ``block`` byte ids as Hugging Face datasets give them: lists of ints."""

    def __init__(self, n: int, block: int = 16, seed: int = 0, labels: bool = True) -> None:
        self.data = torch.randint(0, 64, (n, block), generator=torch.Generator().manual_seed(seed))
        self.labels = labels

    def __len__(self) -> int:
        return len(self.data)

    def __getitem__(self, i: int) -> dict[str, list[int]]:
        ids = self.data[i].tolist()
        return {"input_ids": ids, "labels": ids} if self.labels else {"input_ids": ids}


def _gpt2() -> torch.nn.Module:
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    config = transformers.GPT2Config(
        n_layer=2, n_head=2, n_embd=32, vocab_size=64, n_positions=16, bos_token_id=None, eos_token_id=None
    )
    return transformers.GPT2LMHeadModel(config)


def test_the_probe_batch_of_a_gpt2_model_passes_and_without_labels_says_to_give_them() -> None:
    model = _gpt2()
    preflight.check_model_output(model, _Tokens(8))
    with pytest.raises(TypeError, match=r"CausalLMOutputWithCrossAttentions without a loss: .* a 'labels' key"):
        preflight.check_model_output(model, _Tokens(8, labels=False))


def test_the_probe_batch_is_made_by_the_users_collate_fn() -> None:
    def pad(examples):  # a padding collator, as transformers.DataCollatorWithPadding is
        width = max(len(e["input_ids"]) for e in examples)
        ids = torch.tensor([e["input_ids"] + [0] * (width - len(e["input_ids"])) for e in examples])
        return {"input_ids": ids, "labels": ids}

    class Ragged(_Tokens):
        def __getitem__(self, i):
            return {"input_ids": self.data[i, : 8 + i % 2].tolist()}

    model = _gpt2()
    preflight.check_model_output(model, Ragged(8), collate_fn=pad)
    with pytest.raises(ValueError, match="lengths \\[8, 9\\]"):
        preflight.check_model_output(model, Ragged(8))


def test_gpt2_trains_with_diloco_in_the_node_loop_and_the_nodes_agree_after_a_round() -> None:
    base = _gpt2()
    before = [p.detach().clone() for p in base.parameters()]
    out = train_ranks(
        2, lambda: DiLoCoStrategy(optim_spec=OptimSpec(torch.optim.AdamW, lr=1e-2), H=2), 4, make_model=lambda: base,
        dataset=_Tokens(64), batch_size=4,
    )  # fmt: skip
    for a, b in zip(out[0]["params"], out[1]["params"], strict=True):
        torch.testing.assert_close(a, b)
    assert any(not torch.equal(a, b) for a, b in zip(out[0]["params"], before, strict=True))


@pytest.mark.procs
@pytest.mark.timeout(180)
def test_a_gpt2_model_fits_with_diloco_on_two_nodes(tmp_path) -> None:
    model = _gpt2()
    before = [p.detach().clone() for p in model.parameters()]
    trainer = Trainer(model, _Tokens(64), _Tokens(16, seed=1))
    trained = trainer.fit(
        DiLoCoStrategy(optim_spec=OptimSpec(torch.optim.AdamW, lr=1e-2), H=2),
        num_nodes=2,
        max_steps=4,
        batch_size=4,
        log_interval=2,
        **{**FIT_DEFAULTS, "val_size": 8},
    )
    train = [r["train_loss"] for r in trainer.history if "train_loss" in r]
    val = [r["val_loss_global"] for r in trainer.history if "val_loss_global" in r]
    assert train and val and all(math.isfinite(v) for v in train + val)
    assert any(not torch.equal(a, b) for a, b in zip(trained.parameters(), before, strict=True))
