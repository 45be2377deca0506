// The bargein page: a caller client of the broadcast service (docs/protocol.md).
//
// Start creates a session (POST /v1/sessions, with the settings panel's system prompt, voice and
// turn-taking), joins its WebSocket as a caller that reports playback (role=caller,
// reports=played) and, with "hear the agent" on, hears it (audio=pcm16: the edge speaks the answers;
// /static/audio-player.js plays them and reports each audio mark played). The microphone runs
// through an AudioWorklet (/static/audio-worklet.js) that resamples it to 16 kHz mono PCM16, sent
// as 20 ms binary frames. What comes back is shown as it streams: the caller's speech and words,
// each agent turn's text with the time from the end of the caller's turn to the first sound of the
// answer, and on `clear` a cut-off mark where the caller stopped hearing it (the unheard rest struck
// out) with the time from the barge-in to the agent's silence (the `pause` of a soft barge-in, or
// the `clear`), measured from the Stop click, the typed turn, or where the caller's voice began in
// the audio this page sent. If the edge goes away (a restart) the page joins the session again.
//
// Stable hooks for tests: #status[data-state]; #transcript > .user-turn[data-kind=voice|text|backchannel],
// .agent-turn[data-turn][data-state=streaming|complete|cut][data-chunks][data-first-audio-ms]
// [data-heard-chars] > .agent-text, .unheard and .cut-mark[data-ms][data-from=voice|speech|stop|text],
// .resume-entry, .error-entry[data-code], .ended-entry; #user-indicator and #agent-indicator
// [data-speaking]; #mic-state[data-state][data-frames-sent]; #agent-audio[data-state][data-played-ms];
// #notice (shown when replies are scripted).

"use strict";

(() => {
  const $ = (id) => document.getElementById(id);
  const ui = {
    start: $("start"),
    stop: $("stop"),
    end: $("end"),
    speak: $("speak"),
    audio: $("agent-audio"),
    notice: $("notice"),
    settings: $("settings-fields"),
    prompt: $("system-prompt"),
    voice: $("voice"),
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
  let context = null; // the AudioContext: the microphone in, the agent's voice out
  let mic = null; // {stream, node}
  let live = false; // joined and the socket is open
  let joining = null; // the session being joined (kept to join again after an edge restart)
  let answerDue = null; // when the caller's turn ended: the answer's wait starts
  let pausedAt = null; // when a soft barge-in paused the agent's voice
  const RECONNECT_CODES = new Set([1001, 1006, 1011, 1012, 1013]);
  const RECONNECT_ATTEMPTS = 8;
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

  // --- the agent's voice, from the server -----------------------------------------------------
  //
  // With "hear the agent" on, the page joins with audio=pcm16: the edge speaks the answers and
  // sends them as 16 kHz PCM16 binary frames, paced at real time, with audio_mark frames after
  // each word. A second AudioWorklet (/static/audio-player.js) plays them; marks ride in its queue
  // in order with the audio, and each one played is reported ({type: "played", turn, mark}), so
  // the agent's history keeps the words the caller heard. pause/resume/clear go to the worklet at
  // once. With it off (or an edge that speaks no audio: `no_audio`), the text shown is what the
  // caller got, and each chunk is reported played as it is shown.

  const speaker = {
    node: null, // the player worklet, once audio runs
    wanted: true, // this connection asked for audio
    playing: false, // the worklet is making sound now
    paused: false,
    heard: new Map(), // turn -> {seq, chars}: how far the caller has heard it
    playedMs: 0,
    firstAudio: null, // turn whose first audio is awaited (for the answer latency)

    get on() {
      return this.wanted && this.node !== null;
    },

    async start(context) {
      if (!context.audioWorklet) return;
      await context.audioWorklet.addModule("/static/audio-player.js");
      const node = new AudioWorkletNode(context, "pcm16-player", { numberOfInputs: 0, outputChannelCount: [1] });
      node.port.onmessage = (event) => this.onWorklet(event.data);
      node.connect(context.destination);
      this.node = node;
      ui.audio.dataset.state = "on";
    },

    onWorklet(m) {
      if (m.reached) {
        const { turn, mark, seq, chars } = m.reached;
        if (turn > fencedUpto) sendJson({ type: "played", turn, mark });
        this.heard.set(turn, { seq, chars }); // marks are reached in order: the latest is furthest
      } else if ("playing" in m) {
        if (m.playing && !this.playing) this.onSound();
        this.playing = m.playing;
        if (m.playing) this.playedMs += 50;
        ui.audio.dataset.playedMs = String(Math.round(this.playedMs));
        indicate();
      }
    },

    onSound() {
      // the first sound of an answer: how long the caller waited for it
      const el = this.firstAudio !== null ? turns.get(this.firstAudio) : null;
      this.firstAudio = null;
      if (!el || el.dataset.firstAudioMs || answerDue === null) return;
      const ms = Math.round(performance.now() - answerDue);
      answerDue = null;
      el.dataset.firstAudioMs = String(ms);
      const latency = document.createElement("span");
      latency.className = "latency";
      latency.textContent = `answered in ${ms} ms`;
      el.append(latency);
    },

    audio(buffer) {
      if (this.node) this.node.port.postMessage({ audio: buffer }, [buffer]);
    },
    mark(frame) {
      if (this.node) this.node.port.postMessage({ mark: frame });
    },
    pause() {
      this.paused = true;
      if (this.node) this.node.port.postMessage({ pause: true });
    },
    resume() {
      this.paused = false;
      if (this.node) this.node.port.postMessage({ resume: true });
    },
    clear() {
      this.paused = false;
      this.playing = false;
      if (this.node) this.node.port.postMessage({ clear: true });
    },
    stop() {
      this.clear();
      if (this.node) this.node.disconnect();
      this.node = null;
      this.heard.clear();
      ui.audio.dataset.state = "off";
    },
  };

  // the agent is speaking while an answer streams or its voice plays (not while it is paused)
  function indicate() {
    const streaming = [...turns.values()].some((el) => el.dataset.state === "streaming");
    const speaking = streaming || (speaker.playing && !speaker.paused);
    ui.agent.dataset.speaking = String(speaking);
    ui.stop.disabled = !live || !speaking;
  }

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
      el.chunks = []; // seq -> text, to mark the word where a cut fell
      turns.set(turn, el);
      speaker.firstAudio = turn;
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
    el.chunks[frame.seq] = frame.text;
    el.dataset.chunks = String(Number(el.dataset.chunks) + 1);
    el.dataset.seq = String(frame.seq);
    el.scrollIntoView({ block: "end" });
    if (!speaker.on) played(frame.turn, frame.seq); // text only: what is shown is what the caller got
    indicate();
  }

  function onTurnComplete(frame) {
    const el = turns.get(frame.turn);
    if (el && el.dataset.state === "streaming") el.dataset.state = "complete";
    indicate();
  }

  // with the agent's voice on, a cut turn shows the words the caller heard, and the rest struck out
  function markHeard(el, turn) {
    const heard = speaker.heard.get(turn);
    if (!speaker.on || !el.chunks) return;
    const text = el.chunks.map((t) => t || "").join("");
    let upto = 0;
    if (heard) {
      for (let s = 0; s < heard.seq; s++) upto += (el.chunks[s] || "").length;
      upto += heard.chars;
    }
    const body = el.querySelector(".agent-text");
    body.textContent = text.slice(0, upto);
    if (upto < text.length) {
      const rest = document.createElement("span");
      rest.className = "unheard";
      rest.title = "not heard: the caller cut in before this";
      rest.textContent = text.slice(upto);
      el.querySelector(".agent-text").after(rest);
    }
    el.dataset.heardChars = String(upto);
  }

  function onClear(frame) {
    const now = performance.now();
    const audible = speaker.playing && !speaker.paused;
    speaker.clear(); // silence first: every millisecond of voice after clear is heard
    fencedUpto = Math.max(fencedUpto, frame.turn);
    const why = bargeInCause(now);
    cause = null;
    // the agent fell silent at the pause, if one came first (the soft barge-in)
    const silentAt = !audible && pausedAt !== null ? pausedAt : now;
    pausedAt = null;
    const ms = why ? Math.max(0, Math.round(silentAt - why.at)) : null;
    const cut = [...turns.entries()].filter(
      ([t, el]) => t <= frame.turn && (el.dataset.state === "streaming" || (speaker.on && t === frame.turn)),
    );
    if (!turns.has(frame.turn)) cut.push([frame.turn, agentTurn(frame.turn)]);
    for (const [t, el] of cut) {
      if (el.dataset.state === "cut") continue;
      el.dataset.state = "cut";
      markHeard(el, t);
      const mark = document.createElement("span");
      mark.className = "cut-mark";
      mark.dataset.ms = ms === null ? "" : String(ms);
      mark.dataset.from = why ? why.kind : "";
      mark.textContent = ms === null ? "✂ cut off" : `✂ cut off ${ms} ms after ${why.label}`;
      if (el.dataset.chunks === "0") mark.textContent += " (before it said anything)";
      el.querySelector(".agent-text").after(mark);
    }
    if (ms !== null) {
      ui.lastCut.dataset.ms = String(ms);
      ui.lastCut.textContent = `last barge-in: silent ${ms} ms after ${why.label}`;
    }
    indicate();
  }

  function onPause() {
    if (!speaker.on) return;
    pausedAt = speaker.playing ? performance.now() : null;
    speaker.pause();
    const why = bargeInCause(performance.now());
    if (pausedAt !== null && why) {
      const ms = Math.max(0, Math.round(pausedAt - why.at));
      ui.lastCut.dataset.ms = String(ms);
      ui.lastCut.textContent = `paused ${ms} ms after ${why.label}`;
    }
    indicate();
  }

  function onResume() {
    pausedAt = null;
    speaker.resume();
    const el = entry("resume-entry", "▶ not a barge-in: the agent goes on where it paused");
    el.dataset.kind = "resume";
    indicate();
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

  function finishUserTurn() {
    ui.user.dataset.speaking = "false";
    if (!userTurn) return;
    const seconds = (performance.now() - userTurn.at) / 1000;
    userTurn.el.dataset.state = "done";
    userTurn.el.textContent = userTurn.words
      ? `you: “${userTurn.words}”`
      : `you spoke (${seconds.toFixed(1)} s)`; // no speech-to-text on the server
    userTurn = null;
  }

  function onUserStopped(frame) {
    if (echoing) {
      echoing = false;
      textEchoes -= 1;
      return;
    }
    if (!frame.false_interruption) answerDue = performance.now(); // the answer's wait starts now
    finishUserTurn();
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

  function onError(frame) {
    if (frame.code === "no_audio") {
      // this edge speaks no audio (BARGEIN_TTS=none): text only, said once, not as a failure
      speaker.wanted = false;
      entry("notice-entry", "This edge has no voice for the agent (BARGEIN_TTS=none): text only.");
      return;
    }
    showError(frame.code || "error", frame.message || "");
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
      case "audio_mark":
        return speaker.mark(frame);
      case "pause":
        return onPause();
      case "resume":
        return onResume();
      case "audio_format":
        return;
      case "user_started_speaking":
        return onUserStarted();
      case "user_stopped_speaking":
        return onUserStopped(frame);
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
        return onError(frame);
      case "ended":
        ended = true;
        finishUserTurn();
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
      mic = { stream, node };
      ui.mic.dataset.state = "on";
      ui.mic.textContent = `microphone on (${context.sampleRate} Hz → 16 kHz)`;
    } catch (err) {
      ui.mic.dataset.state = "unavailable";
      ui.mic.textContent = `microphone unavailable (${err.name || err}): type your turns`;
    }
  }

  function stopAudio() {
    speaker.stop();
    if (mic) {
      mic.node.port.postMessage("stop");
      for (const track of mic.stream.getTracks()) track.stop();
      mic = null;
    }
    if (context) context.close().catch(() => {});
    context = null;
    ui.mic.dataset.state = "off";
    ui.mic.textContent = "microphone off";
  }

  // --- settings and what the edge offers -------------------------------------------------------

  async function loadInfo() {
    try {
      const response = await fetch("/v1/info");
      const info = await response.json();
      if (info.llm && info.llm.scripted) {
        ui.notice.hidden = false;
        ui.notice.textContent =
          "No language model is configured (BARGEIN_LLM_BASE_URL), so the agent's replies are scripted.";
      }
      for (const name of info.voices || []) {
        const option = document.createElement("option");
        option.value = option.textContent = name;
        if (name === info.voice) option.selected = true;
        ui.voice.append(option);
      }
      if (!(info.audio || []).length) {
        ui.speak.checked = false;
        ui.speak.disabled = true;
        ui.speak.parentElement.title = "this edge speaks no audio (BARGEIN_TTS=none)";
      }
    } catch {
      // an older edge: no settings to offer, the defaults hold
    }
  }

  function sessionBody() {
    const body = {};
    const prompt = ui.prompt.value.trim();
    if (prompt) body.agent_options = { system_prompt: prompt };
    if (ui.voice.value) body.voice = ui.voice.value;
    const turnTaking = {};
    for (const input of document.querySelectorAll("[data-turn-taking]")) {
      if (input.value.trim() !== "") turnTaking[input.dataset.turnTaking] = Number(input.value);
    }
    if (Object.keys(turnTaking).length) body.turn_taking = turnTaking;
    return body;
  }

  // --- the session ---------------------------------------------------------------------------

  function resetConversation() {
    // turn numbers start again with every session: nothing of the last one may fence the next
    if (turns.size || ui.transcript.childElementCount) entry("session-entry", "— new session —");
    turns.clear();
    fencedUpto = 0;
    cause = null;
    userTurn = null;
    answerDue = null;
    pausedAt = null;
    textEchoes = 0;
    echoing = false;
    voiceRun.start = voiceRun.last = null;
    ui.user.dataset.speaking = "false";
  }

  function setLive(on) {
    live = on;
    ui.start.disabled = on || (!ended && ws !== null) || joining !== null;
    ui.end.disabled = !on;
    ui.input.disabled = !on;
    ui.send.disabled = !on;
    ui.settings.disabled = on;
    indicate();
  }

  // join (or join again) the session's WebSocket; after an edge restart any edge serves it
  function join(attempt) {
    const url = new URL(joining.ws_url, location.href);
    if (location.protocol === "https:" && url.protocol === "ws:") url.protocol = "wss:";
    url.searchParams.set("token", joining.token);
    url.searchParams.set("role", "caller");
    url.searchParams.set("reports", "played");
    url.searchParams.set("audio", speaker.wanted ? "pcm16" : "none");
    const socket = new WebSocket(url.toString());
    ws = socket;
    socket.binaryType = "arraybuffer";
    socket.onopen = () => {
      attempt = 0;
      setStatus("live", `live — session ${sessionId}`);
      setLive(true);
      if (!mic && context) startMic(context);
    };
    socket.onmessage = (event) => {
      if (typeof event.data === "string") onFrame(event.data);
      else if (speaker.on) speaker.audio(event.data);
    };
    socket.onclose = (event) => {
      if (ws !== socket) return;
      ws = null;
      speaker.clear();
      finishUserTurn();
      setLive(false);
      // the edge went away (a restart, a deploy): the session lives on, join it again
      const retry = !ended && RECONNECT_CODES.has(event.code) && attempt < RECONNECT_ATTEMPTS;
      if (retry) {
        setStatus("reconnecting", `the edge went away (${event.code}); reconnecting…`);
        setTimeout(() => join(attempt + 1), Math.min(4000, 250 * 2 ** attempt));
        return;
      }
      stopAudio();
      joining = null;
      ui.start.disabled = false;
      if (ended || event.code === 1000) setStatus("ended", `session ${sessionId} ended`);
      else setStatus("error", `connection closed (${event.code}${event.reason ? ": " + event.reason : ""})`);
    };
  }

  async function start() {
    ui.start.disabled = true;
    ended = false;
    resetConversation();
    speaker.wanted = ui.speak.checked;
    // created inside the click, so the browser lets it run (and play)
    context = new (window.AudioContext || window.webkitAudioContext)();
    setStatus("connecting", "creating a session…");
    let session;
    try {
      const response = await fetch("/v1/sessions", {
        method: "POST",
        headers: { "content-type": "application/json" },
        body: JSON.stringify(sessionBody()),
      });
      const body = await response.json().catch(() => ({}));
      if (response.status !== 201) {
        const e = body.error || {};
        throw new Error(`HTTP ${response.status} ${e.code || ""} ${e.message || ""}`.trim());
      }
      session = body;
    } catch (err) {
      stopAudio();
      setStatus("error", `could not create a session: ${err.message || err}`);
      ui.start.disabled = false;
      return;
    }
    sessionId = session.session_id;
    ui.status.dataset.session = sessionId;
    if (speaker.wanted) {
      try {
        await speaker.start(context);
        await context.resume();
      } catch (err) {
        speaker.wanted = false;
        entry("notice-entry", `cannot play audio here (${err.name || err}): text only`);
      }
    }
    joining = session;
    join(0);
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
    answerDue = lastTextAt;
    sendJson({ type: "text", text });
    const el = entry("user-turn", `you: ${text}`);
    el.dataset.kind = "text";
    ui.input.value = "";
  });

  loadInfo();
})();
