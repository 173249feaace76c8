"""``python -m bench [--quick] [--only SECTIONS]``: regenerate the tables and plots of docs/benchmarks/.

Sections: ``bound`` (offline bound), ``sim`` (fleet simulation), ``autoscale`` (autoscalers in the
simulator), ``routing`` (real runs: reference-engine
workers + the router, every policy on one trace) and ``loadgen`` (the same trace through a public load
generator; part of the routing section). ``--quick`` keeps the whole run under ten minutes on two cores.
Run only when named in ``--only``: ``replicas`` (the real runs through 1, 2, 4 router replicas,
``--replicas`` and ``--view shadow|peers``; a few minutes) and ``replicas-sim`` (the simulator's 64-pod
scenario through 1, 2, 4, 8 replicas in both views; ``--replicas`` overrides the counts).
``--runtime pytorch`` runs ``routing`` and ``sim`` on trtllm-serve workers / pods instead (sections
``routing-pytorch``, ``sim-pytorch``). ``sim`` without ``routing`` keeps the calibration block already in the doc.
Raw results go to ``bench/results/`` (ignored), tables to ``docs/benchmarks/*.md``, plots to ``docs/img/``.
"""

from __future__ import annotations

import argparse
import signal
import sys
import time
from collections.abc import Sequence

from bench import report
from bench.replicas import REAL_VIEWS, ReplicaSpecError, parse_replica_counts

ALL_SECTIONS = ("bound", "sim", "routing")
OPTIONAL_SECTIONS = ("replicas", "replicas-sim", "autoscale")  # run only when named in --only


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="small sizes (< 10 min on 2 cores)")
    parser.add_argument("--only", default=",".join(ALL_SECTIONS),
                        help=f"comma-separated sections of {', '.join(ALL_SECTIONS + OPTIONAL_SECTIONS)}")
    parser.add_argument("--no-loadgen", action="store_true", help="skip the external load generator")
    parser.add_argument("--runtime", choices=("tensorrtllm", "pytorch"), default="tensorrtllm",
                        help="routing real runs on Triton workers (default) or reference trtllm-serve workers "
                        "(section routing-pytorch); sim on TensorRT-engine pods (default) or trtllm-serve pods "
                        "(section sim-pytorch)")
    parser.add_argument("--replicas", help="router replica counts, e.g. 1,2,4 (sections replicas: default 1,2,4; "
                        "replicas-sim: default 1,2,4,8)")
    parser.add_argument("--view", choices=REAL_VIEWS, default="shadow",
                        help="section replicas: each replica its own view (shadow) or peer streams (peers)")
    args = parser.parse_args(argv)
    wanted = [name.strip() for name in args.only.split(",") if name.strip()]
    unknown = sorted(set(wanted) - set(ALL_SECTIONS + OPTIONAL_SECTIONS))
    if unknown:
        parser.error(f"unknown sections {unknown}; known: {', '.join(ALL_SECTIONS + OPTIONAL_SECTIONS)}")
    try:
        counts = parse_replica_counts(args.replicas) if args.replicas else None
    except ReplicaSpecError as exc:
        parser.error(str(exc))
    # SIGTERM unwinds like Ctrl-C, so every worker and router this run started is stopped on the way out.
    signal.signal(signal.SIGTERM, lambda _signum, _frame: sys.exit(143))
    started = time.monotonic()
    calibration = None
    if "routing" in wanted and args.runtime == "pytorch":
        from bench import routing_pytorch

        print("== routing quality (real runs, runtime pytorch)", flush=True)
        report.write_section("routing-pytorch", routing_pytorch.pytorch_routing_section(args.quick))
    elif "routing" in wanted:
        from bench import routing

        print("== routing quality (real runs)", flush=True)
        section, calibration = routing.routing_section(args.quick, loadgen=not args.no_loadgen)
        report.write_section("routing", section)
    if "bound" in wanted:
        from bench import simbench

        print("== offline bound", flush=True)
        report.write_section("bound", simbench.bound_section(args.quick))
    if "sim" in wanted and args.runtime == "pytorch":
        from bench import simbench_pytorch

        print("== fleet simulation (runtime pytorch)", flush=True)
        report.write_section("sim-pytorch", simbench_pytorch.sim_section(args.quick))
    elif "sim" in wanted:
        from bench import simbench

        print("== fleet simulation", flush=True)
        if calibration is None:  # no real runs this time: the last ones' calibration, said to be so
            calibration = report.kept_calibration()
        report.write_section("sim", simbench.sim_section(args.quick, calibration))
    if "replicas" in wanted:
        from bench import replicas_real

        print(f"== router replicas (real runs, view {args.view})", flush=True)
        text, _rows = replicas_real.replicas_section(counts or (1, 2, 4), args.view)
        report.write_section(f"replicas-real-{args.view}", text)
    if "replicas-sim" in wanted:
        from bench import simreplicas

        print("== router replicas (simulation)", flush=True)
        report.write_section("replicas-sim", simreplicas.sim_replicas_section(counts or simreplicas.DEFAULT_COUNTS))
    if "autoscale" in wanted:
        from bench import autoscale

        print("== autoscaling (simulator)", flush=True)
        report.write_section("autoscale", autoscale.autoscale_report(autoscale.default_setup(args.quick)))
    print(f"done in {time.monotonic() - started:.0f} s: {report.PAGES.relative_to(report.ROOT)}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
