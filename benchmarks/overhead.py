"""Mining as a fraction of a training step of a small 1-D CNN, per strategy, with and without memory.

One process, side by side: for each strategy the median time of mining (``build_miner(strategy)``
called) on the step's detached embeddings and the median time of the whole training step (forward,
mining, loss, backward, AdamW step) at the same batch, timed in alternation round by round (so that
load from other processes hits both alike). Goals (mining issue): at most 5% of a step at B = 256
without memory; ``semi_hard`` against a 4096-row memory (the cross-batch memory's pool) at most 10% of
a step.

    python benchmarks/overhead.py [--quick] [--out benchmarks/results]
"""

from __future__ import annotations

import torch
from _common import (
    goal_table,
    in_units,
    load_average,
    machine_info,
    markdown_table,
    parser,
    time_interleaved,
    write_results,
)

from composer_dynsample import ContrastiveLoss, TripletMarginLoss
from composer_dynsample.mining import MINERS, build_miner


class SmallCNN(torch.nn.Module):
    """Four 1-D convolutions of 64 channels and a 64-d embedding, the size of the MNIST-1D recipe's."""

    def __init__(self, length: int = 40, channels: int = 64, dim: int = 64) -> None:
        super().__init__()
        layers, inputs = [], 1
        for _ in range(4):
            layers += [
                torch.nn.Conv1d(inputs, channels, 5, padding=2),
                torch.nn.BatchNorm1d(channels),
                torch.nn.ReLU(),
            ]
            inputs = channels
        self.features = torch.nn.Sequential(*layers)
        self.head = torch.nn.Linear(channels * length, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.normalize(self.head(self.features(x[:, None]).flatten(1)), dim=1)


def measure(strategy: str, batch: int, memory: int, repeats: int) -> dict:
    torch.manual_seed(0)
    model = SmallCNN()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    loss_fn = ContrastiveLoss() if MINERS[strategy].kind == "pairs" else TripletMarginLoss(margin=0.2)
    features = torch.randn(batch, 40)
    labels = torch.arange(batch) % (batch // 4)
    bank = torch.nn.functional.normalize(torch.randn(memory, 64), dim=1) if memory else None
    bank_labels = torch.randint(0, batch // 4, (memory,)) if memory else None

    def pool_of(embeddings):
        if bank is None:
            return None, None, None
        return torch.cat([embeddings.detach(), bank]), torch.cat([labels, bank_labels]), 0

    def step():
        optimizer.zero_grad(set_to_none=True)
        embeddings = model(features)
        ref, ref_labels, offset = pool_of(embeddings)
        tuples = build_miner(strategy)(embeddings.detach(), labels, ref, ref_labels, self_offset=offset)
        pool = None if ref is None else torch.cat([embeddings, bank])
        loss = loss_fn(embeddings, labels, tuples, pool, ref_labels)
        loss.backward()
        optimizer.step()

    with torch.no_grad():
        embeddings = model(features)
    ref, ref_labels, offset = pool_of(embeddings)
    medians = time_interleaved(
        {
            "mine": lambda: build_miner(strategy)(embeddings, labels, ref, ref_labels, self_offset=offset),
            "step": step,
        },
        repeats,
        warmup=2,
    )
    return {
        "strategy": strategy,
        "batch": batch,
        "memory": memory,
        **in_units(medians),
        "fraction": round(medians["mine"] / medians["step"], 4),
    }


def main(argv: list[str] | None = None) -> dict:
    args = parser(__doc__, quick_help="one small setting, for a smoke test").parse_args(argv)
    torch.set_num_threads(2)
    load_before = load_average()
    batch, repeats = (64, 3) if args.quick else (256, 15)
    memories = (0,) if args.quick else (0, 4096)
    strategies = ("batch_hard", "semi_hard") if args.quick else tuple(MINERS)
    rows = [measure(s, batch, m, repeats) for m in memories for s in strategies]
    table = markdown_table(
        ["strategy", "batch", "memory", "mining (ms)", "training step (ms)", "mining / step"],
        "lrrrrr",
        [
            [
                r["strategy"],
                r["batch"],
                r["memory"],
                f"{r['mine_ms']:.2f}",
                f"{r['step_ms']:.1f}",
                f"{100 * r['fraction']:.1f}%",
            ]
            for r in rows
        ],
    )
    worst = max(r["fraction"] for r in rows if r["memory"] == 0)
    goal = "mining at most 5% of a training step of a small CNN at B = 256 (no memory)"
    goals = [{"goal": goal, "measured": f"worst strategy {100 * worst:.1f}%", "met": worst <= 0.05}]
    semi_memory = [r for r in rows if r["strategy"] == "semi_hard" and r["memory"] == 4096]
    if semi_memory:
        fraction = semi_memory[0]["fraction"]
        goals.append(
            {
                "goal": f"semi_hard with a 4096-row memory at most 10% of a training step at B = {batch}",
                "measured": f"{100 * fraction:.1f}%",
                "met": fraction <= 0.10,
            }
        )
    table = f"{table}\n\n{goal_table(goals)}"
    print(table)
    result = {
        "ratio": round(worst, 4),
        "ratio_meaning": "largest mining time / training step time over strategies without memory; goal <= 0.05",
        "goal": goal,
        "goals": goals,
        "rows": rows,
        "machine": machine_info(),
        "load_average_1_5_15min_before": load_before,
        "load_average_1_5_15min_after": load_average(),
    }
    return write_results(args.out, "overhead", args.quick, result, table)


if __name__ == "__main__":
    main()
