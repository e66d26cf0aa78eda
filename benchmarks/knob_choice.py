"""What ``max_accuracy_loss`` L costs on the test nodes: the knob-table rule on validation accuracies against the
rule on agreement with the exact labels (``clients.knob_rules``, 2026-11-29).

Trains a model as ``gnnserve train`` does (``models.train.train``, into ``--cache-dir``, reused on later runs; its
knob table has both columns), then measures every knob setting's accuracy on the dataset's test nodes (the same
computation as the knob table's: ``models.knobs.measure_knobs`` over the test nodes). For each L of ``--losses``
it prints the setting each rule picks (the cheapest row whose loss is at most L: the validation accuracy given up,
or the share of labels that differ from the exact ones) and that setting's test accuracy below the exact row's:
what a user asking for "at most L" got.

    python benchmarks/knob_choice.py --dataset ../shared/data/amazon_computers.npz --model shadow-gcn
"""

from __future__ import annotations

import argparse
import datetime
import platform
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dataset", required=True, help="a dataset path or spec, as gnnserve train --dataset takes it")
    ap.add_argument("--model", default="shadow-gcn", help="model kind (default: %(default)s)")
    ap.add_argument("--losses", default="0.005,0.01,0.02,0.05", help="the L values (default: %(default)s)")
    ap.add_argument("--epochs", type=int, default=200)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--cache-dir", type=Path, default=Path("/tmp/gnnserve-knob-choice"))
    args = ap.parse_args(argv)
    try:
        losses = [float(x) for x in args.losses.split(",") if x]
    except ValueError:
        ap.error(f"--losses must be comma-separated numbers, got {args.losses!r}")

    import torch

    from clients.knob_rules import cheapest_within, rows_of
    from clients.knob_rules import losses as row_losses
    from kernels.datasets import load_dataset
    from models.checkpoint import load_checkpoint
    from models.fit import LHopExtractor, PPRExtractor, TrainData, make_ppr_config, ppr_table
    from models.knobs import measure_knobs
    from models.train import train

    ds = load_dataset(args.dataset)
    out = args.cache_dir / f"{ds.name}-{args.model}-s{args.seed}-e{args.epochs}"
    if not (out / "knobs.json").exists():
        print(f"training {args.model} on {ds.name} into {out} ...", flush=True)
        train(ds, args.model, out, overwrite=True, progress=False, epochs=args.epochs, seed=args.seed)
    ck = load_checkpoint(out)
    rows = ck.knobs
    if any(r.get("agreement") is None for r in rows):
        raise SystemExit(f"{out}: its knob table has no agreement column (trained before 2026-11-29): delete it")
    model = ck.model
    data = TrainData(ds, model.norm)
    test = ds.split("test")
    widths = sorted({int(r["sampling_width"]) for r in rows})
    budgets = sorted({int(r["ppr_budget"]) for r in rows})
    if ck.extractor == "ppr":
        cfg = make_ppr_config(ck.ppr_config, max(budgets))
        extractor = PPRExtractor(ds.graph, ppr_table(ds.graph, test, cfg, max(budgets)))
    else:
        extractor = LHopExtractor(ds.graph, model.layers)
    torch.manual_seed(0)
    on_test = measure_knobs(model, data, extractor, test, widths=widths, budgets=budgets, strategy=ck.strategy,
                            batch_size=256, repeats=1, latency_nodes=64, accuracy_nodes=0)
    test_acc = {(r["ppr_budget"], r["sampling_width"]): r["val_accuracy"] for r in on_test}
    table = rows_of(rows)
    by_val = [r._replace(agreement=None) for r in table]
    exact = test_acc[max(budgets), 0]
    meta = ck.knobs_meta
    when = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    print(f"\n### max_accuracy_loss on the test nodes: {args.model} on {ds.name}\n")
    print(f"{when}, {platform.machine()} {platform.node()}; command: python benchmarks/knob_choice.py "
          + " ".join(argv if argv is not None else sys.argv[1:]))
    print(f"\nKnob table: validation accuracy on {meta.get('accuracy_nodes')} nodes, agreement on "
          f"{meta.get('agreement_nodes')} nodes of the graph; test accuracy on {len(test):,} test nodes, exact "
          f"(K = {max(budgets)}, S = 0): {exact:.4f}.\n")
    print("| L | rule | setting (K, S) | its loss in the table | test accuracy | test accuracy lost |")
    print("|---:|---|---|---:|---:|---:|")
    for L in losses:
        for name, tab in (("validation accuracy", by_val), ("agreement", table)):
            best = cheapest_within(tab, L)
            if best is None:
                print(f"| {L} | {name} | none | | | |")
                continue
            loss = row_losses(tab)[tab.index(best)]  # type: ignore[index]
            acc = test_acc[best.ppr_budget, best.sampling_width]
            print(f"| {L} | {name} | ({best.ppr_budget}, {best.sampling_width}) | {loss:.4f} | {acc:.4f} | "
                  f"{exact - acc:+.4f} |")
    print("\n| K | S | val accuracy | agreement | test accuracy | test accuracy lost |")
    print("|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        k, s = int(r["ppr_budget"]), int(r["sampling_width"])
        print(f"| {k} | {s} | {r['val_accuracy']:.4f} | {r['agreement']:.4f} | {test_acc[k, s]:.4f} | "
              f"{exact - test_acc[k, s]:+.4f} |")
    bad = [L for L in losses if (b := cheapest_within(table, L)) is not None
           and exact - test_acc[b.ppr_budget, b.sampling_width] > L + 0.01]
    if bad:  # the bound holds on the agreement sample; the test nodes are another sample of the same graph
        print(f"\nnote: at L = {bad} the agreement rule's choice lost more than L + 1 point on the test nodes")


if __name__ == "__main__":
    main()
