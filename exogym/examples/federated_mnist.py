"""Federated learning as in the original exo gym's example: 100 clients, random islands of 10, client sampling, on
MNIST-like data, with an IID split and a non-IID one (label-sorted shards, McMahan et al. 2017)
side by side.

Sampled FedAvg runs as a server on the simulated clock (``FedAvgStrategy(client_sampling=...)``
is a ``ServerStrategy`` running ``FedAvgServer``): per round each island of ``--island_size``
clients averages the models of the ``--client_sampling`` fraction of its clients, which the
server sent the model and which trained ``--local_steps`` steps; a client no round draws is never
built. The built-in digits need no download; ``--dataset mnist`` downloads MNIST once into
``--data-dir``.

    python -m exogym.examples.federated_mnist --num_clients 100 --island_size 10 --client_sampling 0.1

Writes ``<out>/version_N/<split>/metrics.csv`` per split, ``summary.csv`` and the plots of
validation loss against rounds' steps, bytes and simulated time (``<out>/latest`` names the
newest run).
"""

from __future__ import annotations

import csv
import logging
import os
from collections.abc import Sequence
from typing import Any

from exogym.cli import quiet_interrupt, script_parser
from exogym.runs import atomic_path, new_version

logger = logging.getLogger("exogym.examples.federated_mnist")

SPLITS = ("iid", "shards")


def run(
    dataset: str = "digits",
    num_clients: int = 100,
    island_size: int | None = 10,
    client_sampling: float | None = 0.1,
    local_steps: int = 10,
    rounds: int = 30,
    batch_size: int = 8,
    lr: float = 0.05,
    splits: Sequence[str] = SPLITS,
    shards_per_client: int = 2,
    workers: int | None = None,
    out: str = "exogym_runs/federated_mnist",
    data_dir: str = "data",
    seed: int = 0,
    progress: bool = True,
) -> dict[str, dict[str, Any]]:
    """Train FedAvg once per split; return per split the final validation loss and accuracy of
    the average model, examples trained and bytes sent per client, and write CSVs and plots."""
    from exogym import Trainer
    from exogym.cli.plots import plot_comparison
    from exogym.data import LabelShards
    from exogym.logger import CSVLogger
    from exogym.runtime import cluster
    from exogym.strategy import FedAvgStrategy
    from exogym.tasks import MLPClassifier, digits_datasets, mnist_datasets

    if dataset == "digits":
        train, val = digits_datasets(seed=seed)
        make_model = MLPClassifier
    else:
        train, val = mnist_datasets(os.path.join(data_dir, "mnist"))
        make_model = lambda: MLPClassifier((784, 256, 10))  # noqa: E731
    histories: dict[str, list[dict[str, Any]]] = {}
    summary: dict[str, dict[str, Any]] = {}
    folder = new_version(out) if cluster.reporting() else out  # this run's own folder; rank 0 writes
    for split in splits:
        if split == "iid":
            data: Any = train  # one shared dataset, split evenly at random by a DistributedSampler
        else:
            data = LabelShards(train, num_clients, shards_per_client, seed=seed)
            classes = (data.label_counts() > 0).sum(1).float()
            logger.info(
                "label shards: %d shards of %d examples per client; classes per client: mean %.1f, max %d",
                shards_per_client,
                len(data.indices[0]) // shards_per_client,
                classes.mean().item(),
                int(classes.max()),
            )
        trainer = Trainer(make_model(), data, val)
        trainer.fit(
            FedAvgStrategy(
                H=local_steps, island_size=island_size, client_sampling=client_sampling, optim_spec="sgd", lr=lr
            ),
            num_nodes=num_clients,
            workers=workers,
            max_steps=local_steps * rounds,
            batch_size=batch_size,
            val_size=len(val),
            val_interval=local_steps * max(1, rounds // 10),
            log_interval=local_steps,
            logger=CSVLogger(folder, versions=False),
            run_name=split,
            seed=seed,
            progress=progress,
        )
        if not trainer.history:  # a torchrun rank other than 0: rank 0 reports
            continue
        histories[split] = trainer.history
        val_rows = [r for r in trainer.history if "val_loss_global" in r]
        train_rows = [r for r in trainer.history if "train_loss" in r]
        summary[split] = {
            "split": split,
            "val_loss": val_rows[-1]["val_loss_global"],
            "val_accuracy": val_rows[-1].get("val_accuracy_global", float("nan")),
            "examples": train_rows[-1]["examples"],
            "MB_sent_per_client": train_rows[-1]["bytes_sent"] / 1e6,
            "sim_time_s": train_rows[-1]["sim_time"],
        }
    if not summary:
        return summary
    with atomic_path(os.path.join(folder, "summary.csv")) as tmp, open(tmp, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(next(iter(summary.values()))))
        writer.writeheader()
        writer.writerows(summary.values())
    title = f"FedAvg, {num_clients} clients, islands of {island_size}, sampling {client_sampling}"
    plot_comparison(histories, folder, title=title)
    logger.info("wrote %s/summary.csv, <split>/metrics.csv and the plots", folder)
    return summary


@quiet_interrupt
def main(argv: Sequence[str] | None = None) -> None:
    """Command-line entry: ``python -m exogym.examples.federated_mnist --help``."""
    p = script_parser(__doc__)
    p.add_argument("--dataset", choices=("digits", "mnist"), default="digits", help="digits: built in (default)")
    p.add_argument("--num_clients", "--num-clients", type=int, default=100, help="clients (the run's nodes)")
    p.add_argument("--island_size", "--island-size", type=int, default=10, help="clients per island (0: one island)")
    p.add_argument(
        "--client_sampling", "--client-sampling", type=float, default=0.1, help="fraction of each island per round"
    )
    p.add_argument("--local_steps", "--local-steps", type=int, default=10, help="local SGD steps per round (H)")
    p.add_argument("--rounds", type=int, default=30)
    p.add_argument("--batch_size", "--batch-size", type=int, default=8)
    p.add_argument("--lr", type=float, default=0.05, help="local SGD learning rate")
    p.add_argument("--split", choices=(*SPLITS, "both"), default="both", help="data split across clients")
    p.add_argument("--shards_per_client", "--shards-per-client", type=int, default=2)
    p.add_argument("--workers", type=int, default=None, help="worker processes (default: one per core)")
    p.add_argument("--out", default="exogym_runs/federated_mnist")
    p.add_argument("--data-dir", default="data", help="where MNIST is downloaded")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--no-progress", action="store_true", help="hide the progress bar")
    args = p.parse_args(argv)
    for name in ("num_clients", "local_steps", "rounds", "batch_size", "shards_per_client"):
        if getattr(args, name) < 1:
            p.error(f"--{name} must be at least 1, got {getattr(args, name)}")
    if args.island_size < 0:
        p.error(f"--island_size must be 0 (one island) or positive, got {args.island_size}")
    if not 0.0 < args.client_sampling <= 1.0:
        p.error(f"--client_sampling must be in (0, 1], got {args.client_sampling}")
    if args.lr <= 0:
        p.error(f"--lr must be positive, got {args.lr}")
    if args.workers is not None and not 1 <= args.workers <= args.num_clients:
        p.error(f"--workers must be between 1 and --num_clients={args.num_clients}, got {args.workers}")
    from exogym.runtime import cluster

    logging.basicConfig(level=logging.INFO if cluster.reporting() else logging.WARNING, format="%(message)s")
    summary = run(
        dataset=args.dataset,
        num_clients=args.num_clients,
        island_size=args.island_size or None,
        client_sampling=args.client_sampling,
        local_steps=args.local_steps,
        rounds=args.rounds,
        batch_size=args.batch_size,
        lr=args.lr,
        splits=SPLITS if args.split == "both" else (args.split,),
        shards_per_client=args.shards_per_client,
        workers=args.workers,
        out=args.out,
        data_dir=args.data_dir,
        seed=args.seed,
        progress=not args.no_progress,
    )
    logger.info("%-8s %9s %9s %10s %12s %10s", "split", "val loss", "val acc", "examples", "MB/client", "sim s")
    for row in summary.values():
        logger.info(
            "%-8s %9.4f %9.3f %10d %12.3f %10.2f",
            row["split"],
            row["val_loss"],
            row["val_accuracy"],
            row["examples"],
            row["MB_sent_per_client"],
            row["sim_time_s"],
        )


if __name__ == "__main__":
    main()
