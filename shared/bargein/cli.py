"""The ``bargein`` command. Each subcommand only parses its arguments and calls into the package."""

from __future__ import annotations

import argparse
import sys

from bargein.errors import SettingsError


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="bargein", description="Interruptible voice agents, distributed.")
    sub = parser.add_subparsers(dest="command", required=True)

    demo = sub.add_parser("demo", help="run a whole conversation with a barge-in, in one process")
    demo.add_argument("--agent", help="module:attr of the agent (default: BARGEIN_AGENT)")

    sub.add_parser("reasoning", help="run the reasoning service (RabbitMQ + Redis; see README)")
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        if args.command == "demo":
            from bargein.demo import main as demo_main

            return demo_main(args.agent)
        if args.command == "reasoning":
            from bargein.names import TIER_REASONING
            from bargein.service import main as service_main

            return service_main(TIER_REASONING)
    except SettingsError as exc:
        print(f"bargein: {exc}", file=sys.stderr)
        return 2
    parser.error(f"unknown command {args.command}")
    return 2


if __name__ == "__main__":
    sys.exit(main())
