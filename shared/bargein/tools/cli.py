"""The ``bargein`` command. Each subcommand only parses its arguments and calls into the package.

Each subcommand imports its module when it runs (the one place in bargein that imports inside
functions): ``bargein --help`` or ``bargein call`` then need not load the model runtime, the web
server and the broker clients the other subcommands use."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from bargein.errors import SettingsError

if TYPE_CHECKING:
    from bargein.tools.corpus import CorpusSize


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="bargein", description="Interruptible voice agents, distributed.")
    sub = parser.add_subparsers(dest="command", required=True)

    demo = sub.add_parser("demo", help="run a whole conversation with a barge-in, in one process")
    demo.add_argument("--agent", help="module:attr of the agent (default: BARGEIN_AGENT)")
    demo.add_argument(
        "--distributed",
        action="store_true",
        help="run speech, reasoning and broadcast as processes (RabbitMQ + Redis) and call them with a WAV",
    )
    demo.add_argument(
        "--scripted", action="store_true", help="the caller's turns as scripted events, no audio"
    )
    demo.add_argument("--wav", type=Path, help="the caller's audio (default: the two-utterance fixture)")
    demo.add_argument("--json", action="store_true", help="write the timeline as JSON lines")
    demo.add_argument("--keep-logs", action="store_true", help="--distributed: keep the services' logs")

    call = sub.add_parser("call", help="call a running stack through its edge, with a live timeline")
    call.add_argument("--url", default="http://127.0.0.1:8080", help="the edge's base URL")
    said = call.add_mutually_exclusive_group(required=True)
    said.add_argument(
        "--wav", type=Path, help="16 kHz mono 16-bit WAV, streamed at real time as the microphone"
    )
    said.add_argument("--text", action="append", help="a text turn (repeat it for several turns)")
    call.add_argument("--json", action="store_true", help="write the timeline as JSON lines")
    call.add_argument(
        "--listen-after",
        type=float,
        default=3.0,
        metavar="S",
        help="after the input, hang up once nothing has arrived for S seconds (default 3)",
    )
    call.add_argument(
        "--barge-in-after",
        type=_positive,
        metavar="N",
        help="send each next --text after N chunks of the answer, cutting it off",
    )
    call.add_argument(
        "--agent-options", type=_json_object, metavar="JSON", help="the session's agent_options"
    )
    call.add_argument("--turn-taking", type=_json_object, metavar="JSON", help="turn-taking overrides")
    call.add_argument(
        "--save-audio",
        type=Path,
        metavar="WAV",
        help="hear the agent's voice and save the call as played (stereo: you left, the agent right)",
    )
    call.add_argument(
        "--play", action="store_true", help="play the agent's voice on this machine (sox's play, or aplay)"
    )

    sub.add_parser("reasoning", help="run the reasoning service (RabbitMQ + Redis; see README)")
    sub.add_parser("broadcast", help="run the client edge: HTTP + WebSocket (docs/protocol.md)")
    sub.add_parser("speech", help="run the speech-detection service (Silero VAD; RabbitMQ + Redis)")
    sub.add_parser(
        "health", help="exit 0 if this machine's service answers /healthz (the image's HEALTHCHECK)"
    )

    dial = sub.add_parser(
        "dial", help="place a phone call through a carrier; the edge answers (docs/telephony.md)"
    )
    dial.add_argument("to", help="the number to call, E.164 (+15551234567)")
    dial.add_argument(
        "--from",
        dest="from_",
        metavar="NUMBER",
        required=True,
        help="your carrier number to call from, E.164",
    )
    dial.add_argument("--carrier", default="twilio", help="twilio (the default) or telnyx")
    dial.add_argument(
        "--webhook", help="the voice webhook URL (default BARGEIN_PUBLIC_URL/v1/<carrier>/voice)"
    )

    bench = sub.add_parser("bench", help="benchmarks (ratios against a baseline measured in the same run)")
    bench_sub = bench.add_subparsers(dest="bench", required=True)
    intr = bench_sub.add_parser(
        "interrupt",
        help="interrupt → CancelledError latency beside a raw broker hop and a busy one (RabbitMQ + Redis)",
    )
    intr.add_argument("--sessions", type=_positive, default=200, help="streaming sessions (default 200)")
    intr.add_argument("--samples", type=_positive, help="interrupts measured (default 1,000)")
    intr.add_argument("--workers", type=_positive, default=1, help="reasoning processes (default 1)")
    intr.add_argument(
        "--chunk-ms", type=float, default=100.0, help="each session publishes a chunk this often"
    )
    intr.add_argument("--words-per-chunk", type=_positive, default=8)
    thr = bench_sub.add_parser(
        "throughput", help="chunks/s through one edge process beside a raw aio-pika hop (RabbitMQ + Redis)"
    )
    thr.add_argument("--sessions", type=_positive, default=20, help="WebSocket clients (default 20)")
    thr.add_argument("--chunks", type=_positive, default=50_000, help="chunks sent (default 50,000)")
    thr.add_argument(
        "--window", type=_positive, default=2_000, help="chunks in flight at most (default 2,000)"
    )
    fail = bench_sub.add_parser(
        "failover", help="SIGKILL the owner mid-answer: time to the resumed chunk, repeats and gaps"
    )
    fail.add_argument("--kills", type=_positive, default=20, help="kills measured (default 20)")
    ses = bench_sub.add_parser(
        "sessions", help="sessions created per second, and memory per idle session in each service"
    )
    ses.add_argument("--sessions", type=_positive, default=1000, help="sessions created (default 1000)")
    ses.add_argument("--concurrency", type=_positive, default=20, help="created at a time (default 20)")
    _llm_argument(ses)
    scale = bench_sub.add_parser(
        "scale",
        help="session starts a second and memory per idle session at 1k and 10k sessions, 200 active;"
        " per-session vs partitioned mailboxes",
    )
    scale.add_argument(
        "--idle", default="1000,10000", help="idle sessions, level by level (default 1000,10000)"
    )
    scale.add_argument(
        "--active", type=int, default=200, help="callers typing turns at each level (default 200)"
    )
    scale.add_argument("--active-s", type=float, default=20.0, help="seconds they do (default 20)")
    scale.add_argument(
        "--concurrency", type=_positive, default=20, help="sessions created at a time (default 20)"
    )
    scale.add_argument(
        "--cluster",
        action="store_true",
        help="on a private 3-node RabbitMQ cluster (mirrored) instead of one node",
    )
    scale.add_argument(
        "--mailboxes",
        choices=("session", "partitioned"),
        default=None,
        help="the worker tiers' mailboxes in the stack (default: BARGEIN_MAILBOXES's, partitioned)",
    )
    scale.add_argument("--no-designs", action="store_true", help="skip the mailbox designs side by side")
    scale.add_argument(
        "--design-sessions",
        type=_positive,
        default=1000,
        help="sessions started per mailbox design (default 1000)",
    )
    scale.add_argument(
        "--samples", type=_positive, default=100, help="control messages timed per design (default 100)"
    )
    _llm_argument(scale)
    dec = bench_sub.add_parser(
        "bargein-decisions",
        help="real interruptions, backchannels and noises over the agent: is the cut right? (BARGEIN_STT)",
    )
    dec.add_argument("--concurrency", type=_positive, default=2, help="callers at a time (default 2)")
    dec.add_argument("--json", metavar="PATH", help="also write every clip's decision to PATH")
    _corpus_arguments(dec)
    stt = bench_sub.add_parser(
        "stt", help="speech-to-text: word error rate, latency after speech, real-time sessions per process"
    )
    stt.add_argument("--sessions", default="1,2,4,8,16", help="comma-separated caller counts to try")
    stt.add_argument("--clips", type=_positive, default=24, help="turns per latency and load test")
    _corpus_arguments(stt)
    turns = bench_sub.add_parser(
        "turns",
        help="callers who pause mid-sentence and callers who finish: premature answers, time to the answer",
    )
    turns.add_argument("--callers", type=_positive, default=2, help="callers at a time (default 2)")
    turns.add_argument("--voices", help="comma-separated espeak-ng voices (default: en-us,en-gb,en-us+f3)")
    turns.add_argument("--rates", help="comma-separated words a minute (default: 150,185)")
    turns.add_argument(
        "--sentences", type=_positive, help="the first N sentences of each kind (default: all 8)"
    )
    turns.add_argument("--pauses", help="comma-separated pauses mid-sentence in ms (default: 500,800,1200)")
    turns.add_argument(
        "--judges",
        help="comma-separated ways of ending a turn: text, text-alone, smart-turn, silence (default: all)",
    )
    e2e = bench_sub.add_parser(
        "e2e", help="callers talking over the agent's voice: time to silence, false cuts, turn latency"
    )
    e2e.add_argument("--callers", type=_positive, default=2, help="callers at once (default 2)")
    e2e.add_argument("--rounds", type=_positive, default=5, help="rounds per caller (default 5)")
    e2e.add_argument(
        "--soft-pause-ms", type=float, metavar="MS", help="the sessions' soft_pause_ms (default: the setting)"
    )
    e2e.add_argument(
        "--lines",
        type=_lines,
        default=("web", "phone"),
        help="comma-separated: web (audio=pcm16 clients), phone (a simulated Twilio line); default both",
    )
    peers = bench_sub.add_parser(
        "peers", help="bargein beside Line 0.1.12 and Pipecat 1.14: interrupt latency, CPU per chunk"
    )
    peers.add_argument("--sessions", default="50,200", help="comma-separated session counts (default 50,200)")
    peers.add_argument("--seconds", type=float, default=8.0, help="measured seconds per run (default 8)")
    peers.add_argument("--rounds", type=_positive, default=3, help="interleaved rounds (default 3)")
    peers.add_argument("--chunk-ms", type=float, default=20.0, help="a chunk this often per session")
    peers.add_argument("--json", dest="json_path", help="write every number to this file")
    peers.add_argument("--plot", dest="plot_path", help="draw the latency distributions to this PNG")
    chk = bench_sub.add_parser(
        "checkpoint", help="bytes and time of a turn's checkpoint at turn 1, 100 and 1,000; restore time"
    )
    chk.add_argument("--turns", type=_positive, default=1000, help="turns of the call (default 1000)")
    every = bench_sub.add_parser(
        "all", help="every bench in turn, and one table of their results (the README's Performance)"
    )
    every.add_argument("--quick", action="store_true", help="a second or two each: a smoke test")
    every.add_argument("--only", help="comma-separated scenarios (default: all of them)")
    every.add_argument("--markdown", dest="markdown_path", help="write the table to this file")
    every.add_argument("--json", dest="json_path", help="write every scenario's output to this file")
    every.add_argument("--plots", dest="plots_dir", help="the benches that draw, draw into this directory")
    vad = bench_sub.add_parser("vad", help="VAD real-time sessions per core: batched vs one call per session")
    vad.add_argument("--sessions", default="64,128,256", help="comma-separated session counts")
    vad.add_argument("--seconds", type=float, default=3.0, help="audio per session and mode")
    return parser


def _json_object(text: str) -> dict[str, Any]:
    try:
        value = json.loads(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"not JSON: {exc}") from None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError("must be a JSON object")
    return value


def _llm_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--llm",
        choices=("scripted", "server"),
        default="scripted",
        help="the agent's model: the scripted client in the reasoning process (default), or the same"
        " answers from an OpenAI-compatible server the bench starts, over HTTP as in a deployment",
    )


def _corpus_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--voices", help="comma-separated espeak-ng voices (default: all the corpus has)")
    parser.add_argument("--rates", help="comma-separated speaking rates, words a minute (default: all)")
    parser.add_argument("--phrases", type=_positive, help="the first N phrases and noises of each kind")


def _corpus_size(args: argparse.Namespace) -> CorpusSize:
    from bargein.tools.corpus import CorpusSize  # numpy and espeak-ng only for the benches that use them

    voices = [v.strip() for v in args.voices.split(",") if v.strip()] if args.voices else None
    return CorpusSize(voices, _counts(args.rates) if args.rates else None, args.phrases)


def _counts(text: str) -> list[int]:
    try:
        counts = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise SettingsError(f"expected comma-separated whole numbers, got {text!r}") from None
    if not counts or min(counts) < 1:
        raise SettingsError(f"expected positive numbers, got {text!r}")
    return counts


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def _lines(text: str) -> tuple[str, ...]:
    lines = tuple(dict.fromkeys(part.strip() for part in text.split(",") if part.strip()))
    if not lines or set(lines) - {"web", "phone"}:
        raise argparse.ArgumentTypeError(f"must be web, phone or both (comma-separated), got {text!r}")
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        if args.command == "health":
            from bargein.tools.health import main as health_main

            return health_main()
        if args.command == "dial":
            from bargein.tools.dial import main as dial_main

            return dial_main(args.to, args.from_, args.carrier, args.webhook)
        if args.command == "demo":
            if args.distributed:
                from bargein.tools.demo_distributed import main as distributed_main

                return distributed_main(
                    args.wav, agent_spec=args.agent, json_lines=args.json, keep_logs=args.keep_logs
                )
            if args.scripted:
                from bargein.tools.demo import main as demo_main

                return demo_main(args.agent)
            from bargein.tools.demo_audio import main as audio_main

            return audio_main(args.wav, args.agent, json_lines=args.json)
        if args.command == "call":
            from bargein.tools.call import main as call_main

            return call_main(
                args.url,
                args.wav,
                args.text,
                json_lines=args.json,
                listen_after_s=args.listen_after,
                barge_in_after=args.barge_in_after,
                agent_options=args.agent_options,
                turn_taking=args.turn_taking,
                save_audio=args.save_audio,
                play=args.play,
            )
        if args.command == "reasoning":
            from bargein.hosting.service import main as service_main
            from bargein.wire.names import TIER_REASONING

            return service_main(TIER_REASONING)
        if args.command == "broadcast":
            from bargein.edge.service import main as broadcast_main

            return broadcast_main()
        if args.command == "speech":
            from bargein.hosting.service import main as service_main
            from bargein.speech.session import speech_factory
            from bargein.wire.names import TIER_SPEECH

            return service_main(TIER_SPEECH, speech_factory)
        if args.command == "bench" and args.bench == "all":
            from bargein.tools.bench_all import main as all_main

            return all_main(args.quick, args.only, args.markdown_path, args.json_path, args.plots_dir)
        if args.command == "bench" and args.bench == "turns":
            from bargein.tools.bench_turns import turns_main

            size = _corpus_size(argparse.Namespace(voices=args.voices, rates=args.rates, phrases=None))
            pauses = [float(ms) for ms in _counts(args.pauses)] if args.pauses else None
            judges = [j.strip() for j in args.judges.split(",") if j.strip()] if args.judges else None
            if judges is not None:
                from bargein.tools.bench_turns import variants

                try:
                    variants(judges)
                except ValueError as exc:
                    raise SettingsError(f"--judges: {exc}") from None
            return turns_main(args.callers, size.voices, size.rates, args.sentences, pauses, judges)
        if args.command == "bench" and args.bench == "e2e":
            from bargein.tools.bench_e2e import e2e_main

            return e2e_main(args.callers, args.rounds, args.soft_pause_ms, args.lines)
        if args.command == "bench" and args.bench == "peers":
            from bargein.tools.bench_peers import main as peers_main

            return peers_main(
                args.sessions, args.seconds, args.rounds, args.chunk_ms, args.json_path, args.plot_path
            )
        if args.command == "bench" and args.bench == "checkpoint":
            from bargein.tools.bench_checkpoint import main as checkpoint_main

            return checkpoint_main(args.turns)
        if args.command == "bench" and args.bench == "vad":
            from bargein.tools.bench_vad import main as vad_main

            return vad_main(args=args)
        if args.command == "bench" and args.bench == "bargein-decisions":
            from bargein.tools.bench_decisions import decisions_main

            return decisions_main(args.concurrency, args.json, _corpus_size(args))
        if args.command == "bench" and args.bench == "stt":
            from bargein.tools.bench_stt import stt_main

            return stt_main(_counts(args.sessions), args.clips, _corpus_size(args))
        if args.command == "bench" and args.bench == "sessions":
            from bargein.tools.bench_sessions import sessions_main

            return sessions_main(args.sessions, args.concurrency, args.llm)
        if args.command == "bench" and args.bench == "scale":
            from bargein.tools.bench_scale import scale_main

            return scale_main(
                levels=tuple(_counts(args.idle)),
                active=args.active,
                active_s=args.active_s,
                cluster=args.cluster,
                mailboxes=args.mailboxes,
                with_designs=not args.no_designs,
                concurrency=args.concurrency,
                design_sessions=args.design_sessions,
                samples=args.samples,
                llm=args.llm,
            )
        if args.command == "bench" and args.bench == "failover":
            from bargein.tools.bench_failover import failover_main

            return failover_main(args.kills)
        if args.command == "bench" and args.bench == "throughput":
            from bargein.tools.bench_throughput import throughput_main

            return throughput_main(args.sessions, args.chunks, args.window)
        if args.command == "bench" and args.bench == "interrupt":
            from bargein.tools.bench import DEFAULT_SAMPLES, interrupt_main

            return interrupt_main(
                args.sessions,
                args.samples or DEFAULT_SAMPLES,
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
