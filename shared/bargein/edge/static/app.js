// The bargein page: a caller client of the broadcast service (docs/protocol.md).
//
// Start creates a session (POST /v1/sessions), joins its WebSocket as a caller that reports
// playback (role=caller, reports=played) and starts the microphone: an AudioWorklet
// (/static/audio-worklet.js) resamples it to 16 kHz mono PCM16 and the page sends each 20 ms
// frame as a binary message. What comes back is shown as it streams: the caller's speech
// (indicator and a turn entry), each agent turn's text, and on `clear` a cut-off mark on that
// turn with the time from the barge-in to the arrival of `clear`, measured from the Stop click or
// the typed turn that cut it, or from where the caller's voice began in the audio this page sent
// (an energy gate over the frames; failing that, the user_started_speaking frame). The agent's
// text is spoken with the browser's speech synthesis and silenced with speechSynthesis.cancel()
// the moment `clear` arrives. `played` is reported as each spoken phrase ends, so the agent's
// history keeps what the caller heard; when no voice is available (or "speak the answers" is
// off) the text shown is what the caller got, and is reported at once.
//
// Stable hooks for tests: #status[data-state]; #transcript > .user-turn[data-kind=voice|text],
// .agent-turn[data-turn][data-state=streaming|complete|cut][data-chunks] > .agent-text and
// .cut-mark[data-ms][data-from=voice|speech|stop|text], .error-entry[data-code], .ended-entry;
// #user-indicator and #agent-indicator [data-speaking]; #mic-state[data-state][data-frames-sent].

"use strict";

(() => {
  const $ = (id) => document.getElementById(id);
  const ui = {
    start: $("start"),
    stop: $("stop"),
    end: $("end"),
    speak: $("speak"),
    status: $("status"),
    user: $("user-indicator"),
    agent: $("agent-indicator"),
    mic: $("mic-state"),
    lastCut: $("last-cut"),
    transcript: $("transcript"),
    form: $("text-form"),
    input: $("text-input"),
    send: $("send"),
  };

  const STALE_CAUSE_MS = 10000; // a barge-in cause older than this explains no clear
  const PHRASE_IDLE_MS = 350; // chunks are spoken in phrases: a pause this long ends one
  const PHRASE_MAX_CHARS = 80; // ... and so does this much text without punctuation
  const VOICE_STALL_MS = 15000; // utterances with no voice event for this long: the voice is broken
  // the barge-in moment of speech is where the caller's voice began in the audio this page sent:
  // a plain energy gate over the 20 ms frames (the edge may send `clear` before it relays
  // user_started_speaking, so that frame cannot be the reference)
  const ONSET_DBFS = -40; // a frame louder than this is voice
  const RUN_HANGOVER_MS = 300; // this much quieter audio ends a run (pauses between words do not)
  const RUN_MAX_AGE_MS = 5000; // a "run" longer than this is room noise, not a barge-in

  let ws = null;
  let sessionId = null;
  let ended = false;
  const turns = new Map(); // turn -> its .agent-turn element
  let fencedUpto = 0; // turns up to this one were cleared: their chunks are never shown
  let cause = null; // {at, label, kind}: the last barge-in this page saw, for the cut-off time
  const voiceRun = { start: null, last: null }; // send times of the current voice run's ends
  let userTurn = null; // {el, at}: the caller's speech in progress
  let audio = null; // {context, stream, node}
  // the edge tells every client of a typed turn as a burst of speech (user_started_speaking, then
  // user_stopped_speaking): those echoes are not the caller talking, and are not shown as such
  let textEchoes = 0;
  let echoing = false;
  let lastTextAt = -Infinity;
  const ECHO_WINDOW_MS = 2000; // the echo follows the typed turn at once; later speech is real

  // --- small helpers -------------------------------------------------------------------------

  function setStatus(state, text) {
    ui.status.dataset.state = state;
    ui.status.textContent = text;
  }

  function entry(cls, text) {
    const el = document.createElement("div");
    el.className = `entry ${cls}`;
    if (text !== undefined) el.textContent = text;
    ui.transcript.append(el);
    el.scrollIntoView({ block: "end" });
    return el;
  }

  function showError(code, message) {
    const el = entry("error-entry", `✗ ${code}: ${message}`);
    el.dataset.code = code;
  }

  function setLive(live) {
    ui.start.disabled = live || (!ended && ws !== null);
    ui.stop.disabled = !live;
    ui.end.disabled = !live;
    ui.input.disabled = !live;
    ui.send.disabled = !live;
  }

  function sendJson(message) {
    if (ws && ws.readyState === WebSocket.OPEN) ws.send(JSON.stringify(message));
  }

  function noteCause(label, kind) {
    cause = { at: performance.now(), label, kind };
  }

  function trackLevel(buffer) {
    const samples = new Int16Array(buffer);
    let sum = 0;
    for (let i = 0; i < samples.length; i++) sum += samples[i] * samples[i];
    const dbfs = 10 * Math.log10(sum / Math.max(samples.length, 1) / (32768 * 32768) || 1e-12);
    if (dbfs < ONSET_DBFS) return;
    const now = performance.now();
    if (voiceRun.last === null || now - voiceRun.last > RUN_HANGOVER_MS) voiceRun.start = now;
    voiceRun.last = now;
  }

  // what the cut-off time is measured from: a Stop click or a typed turn when one is the latest
  // thing the caller did, else the start of the voice that was going on, else the speech event
  function bargeInCause(now) {
    const explicit = cause && now - cause.at < STALE_CAUSE_MS ? cause : null;
    const voiced =
      voiceRun.start !== null && now - voiceRun.last < 1000 && now - voiceRun.start < RUN_MAX_AGE_MS
        ? { at: voiceRun.start, label: "you started talking", kind: "voice" }
        : null;
    if (explicit && explicit.kind !== "speech" && (!voiced || explicit.at >= voiced.at)) return explicit;
    return voiced || explicit;
  }

  // --- speaking the agent's text -------------------------------------------------------------

  const voice = {
    available: "speechSynthesis" in window && "SpeechSynthesisUtterance" in window,
    pending: null, // {turn, seq, text}: chunks not yet handed to the synthesizer
    timer: null,
    live: new Set(), // utterances handed to the synthesizer and not finished
    lastEvent: 0,

    enabled() {
      return this.available && ui.speak.checked;
    },

    add(turn, seq, text) {
      if (!this.enabled() && !this.pending) {
        played(turn, seq); // text only: what is shown is what the caller got
        return;
      }
      if (this.pending && this.pending.turn !== turn) this.flush();
      if (!this.pending) this.pending = { turn, seq, text: "" };
      this.pending.seq = seq;
      this.pending.text += text;
      clearTimeout(this.timer);
      if (/[.!?;:,]\s*$/.test(text) || this.pending.text.length >= PHRASE_MAX_CHARS) this.flush();
      else this.timer = setTimeout(() => this.flush(), PHRASE_IDLE_MS);
    },

    flush() {
      clearTimeout(this.timer);
      const phrase = this.pending;
      this.pending = null;
      if (!phrase) return;
      if (!this.enabled() || !phrase.text.trim()) {
        // shown but not spoken: what the caller got is the text on screen
        played(phrase.turn, phrase.seq);
        return;
      }
      const u = new SpeechSynthesisUtterance(phrase.text);
      u.bargein = { turn: phrase.turn, seq: phrase.seq, cancelled: false };
      u.onstart = () => {
        this.lastEvent = performance.now();
        this.indicate();
      };
      u.onend = () => this.finished(u, true);
      u.onerror = (event) => {
        // our own cancel() on clear: not heard, not reported
        if (event.error === "canceled" || event.error === "interrupted") return this.finished(u, false);
        // no usable voice here (headless browsers, no speech engine): fall back to text only
        this.available = false;
        ui.speak.checked = false;
        ui.speak.disabled = true;
        ui.speak.parentElement.title = `speech synthesis failed (${event.error}): text only`;
        this.finished(u, true);
      };
      this.live.add(u);
      if (this.live.size === 1) this.lastEvent = performance.now();
      speechSynthesis.speak(u);
      this.indicate();
    },

    finished(u, heard) {
      if (!this.live.delete(u)) return;
      this.lastEvent = performance.now();
      if (heard && !u.bargein.cancelled) played(u.bargein.turn, u.bargein.seq);
      this.indicate();
    },

    // `clear` for turn T: drop everything of T and earlier, silence the voice now
    clear(turn) {
      clearTimeout(this.timer);
      if (this.pending && this.pending.turn <= turn) this.pending = null;
      let any = false;
      for (const u of this.live) {
        if (u.bargein.turn <= turn) {
          u.bargein.cancelled = true;
          this.live.delete(u);
          any = true;
        }
      }
      if (any && this.available) speechSynthesis.cancel();
      this.indicate();
    },

    stopAll() {
      clearTimeout(this.timer);
      this.pending = null;
      for (const u of this.live) u.bargein.cancelled = true;
      this.live.clear();
      if (this.available) speechSynthesis.cancel();
      this.indicate();
    },

    watchdog() {
      if (this.live.size && performance.now() - this.lastEvent > VOICE_STALL_MS) {
        // the synthesizer took utterances and never spoke them: stop relying on it
        const stuck = [...this.live];
        this.available = false;
        ui.speak.checked = false;
        ui.speak.disabled = true;
        ui.speak.parentElement.title = "speech synthesis stalled: text only";
        for (const u of stuck) this.finished(u, true);
        speechSynthesis.cancel();
      }
    },

    indicate() {
      const streaming = [...turns.values()].some((el) => el.dataset.state === "streaming");
      ui.agent.dataset.speaking = String(this.live.size > 0 || this.pending !== null || streaming);
    },
  };
  setInterval(() => voice.watchdog(), 1000);

  function played(turn, seq) {
    if (turn > fencedUpto) sendJson({ type: "played", turn, seq });
  }

  // --- what the server sends -----------------------------------------------------------------

  function agentTurn(turn) {
    let el = turns.get(turn);
    if (!el) {
      el = entry("agent-turn");
      el.dataset.turn = String(turn);
      el.dataset.state = "streaming";
      el.dataset.chunks = "0";
      const who = document.createElement("span");
      who.className = "who";
      who.textContent = "agent";
      const text = document.createElement("span");
      text.className = "agent-text";
      el.append(who, text);
      turns.set(turn, el);
    }
    return el;
  }

  function onChunk(frame) {
    if (frame.turn <= fencedUpto) return; // the edge guarantees it; stale text must never show
    // a new answer began: what happened before it (a typed turn, speech that ended) cut nothing
    if (!turns.has(frame.turn) && !userTurn) cause = null;
    const el = agentTurn(frame.turn);
    if (el.dataset.state !== "streaming") return;
    el.querySelector(".agent-text").append(document.createTextNode(frame.text));
    el.dataset.chunks = String(Number(el.dataset.chunks) + 1);
    el.dataset.seq = String(frame.seq);
    el.scrollIntoView({ block: "end" });
    voice.add(frame.turn, frame.seq, frame.text);
  }

  function onTurnComplete(frame) {
    const el = turns.get(frame.turn);
    if (el && el.dataset.state === "streaming") el.dataset.state = "complete";
    if (voice.pending && voice.pending.turn === frame.turn) voice.flush();
    voice.indicate();
  }

  function onClear(frame) {
    const now = performance.now();
    voice.clear(frame.turn); // silence first: every millisecond of speech after clear is heard
    fencedUpto = Math.max(fencedUpto, frame.turn);
    const why = bargeInCause(now);
    cause = null;
    const ms = why ? Math.round(now - why.at) : null;
    const cut = [...turns.entries()].filter(([t, el]) => t <= frame.turn && el.dataset.state === "streaming");
    if (!turns.has(frame.turn)) cut.push([frame.turn, agentTurn(frame.turn)]);
    for (const [, el] of cut) {
      el.dataset.state = "cut";
      const mark = document.createElement("span");
      mark.className = "cut-mark";
      mark.dataset.ms = ms === null ? "" : String(ms);
      mark.dataset.from = why ? why.kind : "";
      mark.textContent =
        ms === null ? "✂ cut off" : `✂ cut off ${ms} ms after ${why.label}`;
      if (el.dataset.chunks === "0") mark.textContent += " (before it said anything)";
      el.append(mark);
    }
    if (ms !== null) {
      ui.lastCut.dataset.ms = String(ms);
      ui.lastCut.textContent = `last cut-off: ${ms} ms`;
    }
    voice.indicate();
  }

  function onUserStarted() {
    if (performance.now() - lastTextAt >= ECHO_WINDOW_MS && !echoing) textEchoes = 0; // none came
    if (textEchoes > 0 && !echoing && performance.now() - lastTextAt < ECHO_WINDOW_MS) {
      echoing = true; // the typed turn's echo: its cause ("your text") stands
      return;
    }
    noteCause("speech was detected", "speech");
    ui.user.dataset.speaking = "true";
    const el = entry("user-turn", "you: speaking…");
    el.dataset.kind = "voice";
    el.dataset.state = "speaking";
    userTurn = { el, at: performance.now() };
  }

  function onUserStopped() {
    if (echoing) {
      echoing = false;
      textEchoes -= 1;
      return;
    }
    ui.user.dataset.speaking = "false";
    if (userTurn) {
      const seconds = (performance.now() - userTurn.at) / 1000;
      userTurn.el.dataset.state = "done";
      userTurn.el.textContent = userTurn.words
        ? `you: “${userTurn.words}”`
        : `you spoke (${seconds.toFixed(1)} s)`; // no speech-to-text on the server
      userTurn = null;
    }
    cause = null; // that speech became a turn: it explains no later clear
  }

  // What speech-to-text heard: the words of the turn now ending (its user_stopped_speaking
  // follows), or a backchannel ("uh-huh") that did not cut the agent off and starts no turn.
  function onTranscript(frame) {
    if (frame.backchannel) {
      const el = entry("user-turn", `you: “${frame.text}” (listening, not an interruption)`);
      el.dataset.kind = "backchannel";
      el.dataset.state = "done";
      return;
    }
    if (userTurn) {
      userTurn.words = frame.text;
      userTurn.el.textContent = `you: “${frame.text}”`;
    }
  }

  // What the agent did besides speaking (tools, metrics, keys, a transfer): shown, never spoken.
  function onAction(frame, text) {
    if (frame.turn <= fencedUpto) return;
    const el = entry("action-entry", text);
    el.dataset.type = frame.type;
  }

  function onFrame(raw) {
    let frame;
    try {
      frame = JSON.parse(raw);
    } catch {
      return;
    }
    switch (frame.type) {
      case "agent_chunk":
        return onChunk(frame);
      case "turn_complete":
        return onTurnComplete(frame);
      case "clear":
        return onClear(frame);
      case "user_started_speaking":
        return onUserStarted();
      case "user_stopped_speaking":
        return onUserStopped();
      case "user_transcript":
        return onTranscript(frame);
      case "tool_call":
        return onAction(frame, `⚙ calls ${frame.name}(${JSON.stringify(frame.arguments || {})})`);
      case "tool_result":
        return onAction(frame, `⚙ ${frame.name} → ${frame.error ? "failed: " + frame.error : JSON.stringify(frame.result)}`);
      case "log_metric":
        return onAction(frame, `▪ metric ${frame.name} = ${JSON.stringify(frame.value)}`);
      case "dtmf":
        return onAction(frame, `☎ presses ${frame.button}`);
      case "transfer":
        return onAction(frame, `☎ transfers the call to ${frame.target_phone_number}`);
      case "error":
        return showError(frame.code || "error", frame.message || "");
      case "ended":
        ended = true;
        entry("ended-entry", `— the session ended (${frame.reason || "no reason given"}) —`);
        return;
      default:
        return;
    }
  }

  // --- the microphone ------------------------------------------------------------------------

  async function startMic(context) {
    if (!navigator.mediaDevices || !navigator.mediaDevices.getUserMedia || !context.audioWorklet) {
      ui.mic.dataset.state = "unavailable";
      ui.mic.textContent = "no microphone here: type your turns";
      return;
    }
    try {
      const stream = await navigator.mediaDevices.getUserMedia({
        audio: { channelCount: 1, echoCancellation: true, noiseSuppression: true, autoGainControl: true },
      });
      await context.audioWorklet.addModule("/static/audio-worklet.js");
      const source = context.createMediaStreamSource(stream);
      const node = new AudioWorkletNode(context, "pcm16-capture", {
        numberOfInputs: 1,
        numberOfOutputs: 1,
        processorOptions: { targetRate: 16000, frameMs: 20 },
      });
      let sent = 0;
      node.port.onmessage = (event) => {
        if (ws && ws.readyState === WebSocket.OPEN) {
          trackLevel(event.data);
          ws.send(event.data);
          sent += 1;
          if (sent % 5 === 0) ui.mic.dataset.framesSent = String(sent);
        }
      };
      // a muted path to the destination keeps the graph pulling the worklet in every browser
      const mute = context.createGain();
      mute.gain.value = 0;
      source.connect(node).connect(mute).connect(context.destination);
      await context.resume();
      audio = { context, stream, node };
      ui.mic.dataset.state = "on";
      ui.mic.textContent = `microphone on (${context.sampleRate} Hz → 16 kHz)`;
    } catch (err) {
      ui.mic.dataset.state = "unavailable";
      ui.mic.textContent = `microphone unavailable (${err.name || err}): type your turns`;
    }
  }

  function stopMic() {
    if (!audio) return;
    audio.node.port.postMessage("stop");
    for (const track of audio.stream.getTracks()) track.stop();
    audio.context.close();
    audio = null;
    ui.mic.dataset.state = "off";
    ui.mic.textContent = "microphone off";
  }

  // --- the session ---------------------------------------------------------------------------

  function resetConversation() {
    // turn numbers start again with every session: nothing of the last one may fence the next
    if (turns.size || ui.transcript.childElementCount) entry("session-entry", "— new session —");
    turns.clear();
    fencedUpto = 0;
    cause = null;
    userTurn = null;
    textEchoes = 0;
    echoing = false;
    voiceRun.start = voiceRun.last = null;
    ui.user.dataset.speaking = "false";
  }

  async function start() {
    ui.start.disabled = true;
    ended = false;
    resetConversation();
    // created inside the click, so the browser lets it run
    const context = new (window.AudioContext || window.webkitAudioContext)();
    setStatus("connecting", "creating a session…");
    let session;
    try {
      const response = await fetch("/v1/sessions", {
        method: "POST",
        headers: { "content-type": "application/json" },
        body: "{}",
      });
      const body = await response.json().catch(() => ({}));
      if (response.status !== 201) {
        const e = body.error || {};
        throw new Error(`HTTP ${response.status} ${e.code || ""} ${e.message || ""}`.trim());
      }
      session = body;
    } catch (err) {
      context.close();
      setStatus("error", `could not create a session: ${err.message || err}`);
      ui.start.disabled = false;
      return;
    }
    sessionId = session.session_id;
    ui.status.dataset.session = sessionId;
    const url = new URL(session.ws_url, location.href);
    if (location.protocol === "https:" && url.protocol === "ws:") url.protocol = "wss:";
    url.searchParams.set("token", session.token);
    url.searchParams.set("role", "caller");
    url.searchParams.set("reports", "played");
    ws = new WebSocket(url.toString());
    ws.binaryType = "arraybuffer";
    ws.onopen = () => {
      setStatus("live", `live — session ${sessionId}`);
      setLive(true);
      startMic(context);
    };
    ws.onmessage = (event) => {
      if (typeof event.data === "string") onFrame(event.data);
    };
    ws.onclose = (event) => {
      stopMic();
      if (!audio) context.close().catch(() => {});
      voice.stopAll();
      ui.user.dataset.speaking = "false";
      ws = null;
      setLive(false);
      ui.start.disabled = false;
      if (ended || event.code === 1000) setStatus("ended", `session ${sessionId} ended`);
      else setStatus("error", `connection closed (${event.code}${event.reason ? ": " + event.reason : ""})`);
    };
  }

  ui.start.addEventListener("click", () => {
    start();
  });

  ui.stop.addEventListener("click", () => {
    noteCause("Stop", "stop");
    sendJson({ type: "interrupt" });
  });

  ui.end.addEventListener("click", () => {
    sendJson({ type: "end" });
    ui.end.disabled = true;
  });

  ui.form.addEventListener("submit", (event) => {
    event.preventDefault();
    const text = ui.input.value.trim();
    if (!text || !ws) return;
    noteCause("your text", "text");
    textEchoes += 1;
    lastTextAt = performance.now();
    sendJson({ type: "text", text });
    const el = entry("user-turn", `you: ${text}`);
    el.dataset.kind = "text";
    ui.input.value = "";
  });

  ui.speak.addEventListener("change", () => {
    if (!ui.speak.checked) voice.stopAll();
  });
})();
