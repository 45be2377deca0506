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
    sub.add_parser("broadcast", help="run the client edge: HTTP + WebSocket (docs/protocol.md)")
    sub.add_parser("speech", help="run the speech-detection service (Silero VAD; RabbitMQ + Redis)")

    bench = sub.add_parser("bench", help="benchmarks (ratios against a baseline measured in the same run)")
    bench_sub = bench.add_subparsers(dest="bench", required=True)
    intr = bench_sub.add_parser(
        "interrupt", help="interrupt → CancelledError latency beside a raw broker hop (RabbitMQ + Redis)"
    )
    intr.add_argument("--sessions", type=_positive, default=200, help="streaming sessions (default 200)")
    intr.add_argument("--samples", type=_positive, default=200, help="interrupts measured (default 200)")
    intr.add_argument("--workers", type=_positive, default=1, help="reasoning processes (default 1)")
    intr.add_argument(
        "--chunk-ms", type=float, default=100.0, help="each session publishes a chunk this often"
    )
    intr.add_argument("--words-per-chunk", type=_positive, default=8)
    vad = bench_sub.add_parser("vad", help="VAD real-time sessions per core: batched vs one call per session")
    vad.add_argument("--sessions", default="64,128,256", help="comma-separated session counts")
    vad.add_argument("--seconds", type=float, default=3.0, help="audio per session and mode")
    return parser


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


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
        if args.command == "broadcast":
            from services.broadcast.service import main as broadcast_main

            return broadcast_main()
        if args.command == "speech":
            from bargein.names import TIER_SPEECH
            from bargein.service import main as service_main
            from services.speech.processor import speech_factory

            return service_main(TIER_SPEECH, speech_factory)
        if args.command == "bench" and args.bench == "vad":
            from bargein.bench_vad import main as vad_main

            return vad_main(args=args)
        if args.command == "bench" and args.bench == "interrupt":
            from bargein.bench import interrupt_main

            return interrupt_main(
                args.sessions,
                args.samples,
                args.workers,
                chunk_period_s=args.chunk_ms / 1000,
                words_per_chunk=args.words_per_chunk,
            )
    except SettingsError as exc:
        print(f"bargein: {exc}", file=sys.stderr)
        return 2
    parser.error(f"unknown command {args.command}")
    return 2


if __name__ == "__main__":
    sys.exit(main())
