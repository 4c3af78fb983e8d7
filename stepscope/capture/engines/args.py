"""The step arguments every engine's entry point takes (the orchestrator passes the same set)."""

import argparse


def add_step_args(p: argparse.ArgumentParser) -> argparse.ArgumentParser:
    p.add_argument("--model", required=True, help="bundled card name or config.json path")
    p.add_argument("--phase", choices=["decode", "prefill"], default="decode")
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--context", type=int, default=2048)
    p.add_argument("--mode", choices=["eager", "graph", "compiled"], default="eager",
                   help="compiled: torch.compile of the step (torch engine only)")
    p.add_argument("--tp", type=int, default=1)
    p.add_argument("--layers", type=int, default=None)
    p.add_argument("--untraced-steps", type=int, default=20,
                   help="steps of the same shape timed outside the capture range (0: none)")
    return p
