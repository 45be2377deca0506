// The loudspeaker of the bargein page: an AudioWorkletProcessor that plays the agent's voice as
// the edge sends it (16 kHz mono PCM16, docs/protocol.md) at the context's own rate.
//
// The page posts, in the order they arrived: {audio: ArrayBuffer} (PCM16 samples) and {mark:
// {turn, mark}} (the edge's audio_mark frames), so a mark sits in the queue exactly where the
// audio before it ends. When playback passes a mark the processor posts {reached: {turn, mark}},
// which the page reports as `played`. {pause}, {resume} and {clear} do what the protocol says:
// stop and keep the queue, go on, stop and drop the queue. Every ~50 ms it posts {playing,
// buffered}: whether the agent's voice is audible now, and how many samples wait.
//
// Resampling is linear interpolation between neighbouring 16 kHz samples, carried across render
// blocks; plenty for a voice, and cheap on the audio thread.

class Pcm16Player extends AudioWorkletProcessor {
  constructor() {
    super();
    this.queue = []; // Float32Array chunks and {turn, mark} items, in order
    this.offset = 0; // position in queue[0] (in 16 kHz samples, fractional)
    this.step = 16000 / sampleRate; // 16 kHz samples per output sample
    this.buffered = 0;
    this.paused = false;
    this.wasPlaying = false;
    this.blocks = 0;
    this.port.onmessage = (event) => {
      const m = event.data;
      if (m.audio) {
        const ints = new Int16Array(m.audio);
        const floats = new Float32Array(ints.length);
        for (let i = 0; i < ints.length; i++) floats[i] = ints[i] / 32768;
        this.queue.push(floats);
        this.buffered += floats.length;
      } else if (m.mark) {
        this.queue.push(m.mark);
        this.passMarks();
      } else if (m.pause) {
        this.paused = true;
      } else if (m.resume) {
        this.paused = false;
      } else if (m.clear) {
        this.queue = [];
        this.offset = 0;
        this.buffered = 0;
        this.paused = false;
      }
    };
  }

  // marks at the head of the queue have been reached: everything before them has played
  passMarks() {
    while (this.queue.length && !(this.queue[0] instanceof Float32Array)) {
      this.port.postMessage({ reached: this.queue.shift() });
    }
  }

  next() {
    this.passMarks();
    const head = this.queue[0];
    if (!head) return null;
    const i = Math.floor(this.offset);
    const frac = this.offset - i;
    const a = head[i];
    const b = i + 1 < head.length ? head[i + 1] : a;
    this.offset += this.step;
    if (this.offset >= head.length) {
      this.offset -= head.length;
      this.buffered -= head.length;
      this.queue.shift();
      this.passMarks();
    }
    return a + (b - a) * frac;
  }

  process(_inputs, outputs) {
    const out = outputs[0];
    const first = out[0];
    let audible = false;
    for (let n = 0; n < first.length; n++) {
      const x = this.paused ? null : this.next();
      if (x !== null) audible = true;
      for (const channel of out) channel[n] = x === null ? 0 : x;
    }
    this.blocks += 1;
    if (audible !== this.wasPlaying || this.blocks % 18 === 0) {
      this.wasPlaying = audible;
      this.port.postMessage({ playing: audible, buffered: Math.max(0, this.buffered) });
    }
    return true;
  }
}

registerProcessor("pcm16-player", Pcm16Player);
