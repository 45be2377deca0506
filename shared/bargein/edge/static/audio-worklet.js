// The microphone tap of the bargein page: an AudioWorkletProcessor that turns the context's
// float audio (usually 48 kHz, sometimes stereo) into what the protocol carries: 16 kHz mono
// PCM16 little-endian, posted to the page in ~20 ms frames (320 samples, 640 bytes) that the page
// sends as binary WebSocket messages.
//
// Resampling is linear interpolation between neighbouring input samples, carried across the
// 128-sample render blocks, so the output is continuous at block edges. That is not a
// band-limited resampler (some aliasing above 8 kHz folds down); for speech detection it is
// plenty, and it keeps the tap cheap on the audio thread.

class Pcm16Capture extends AudioWorkletProcessor {
  constructor(options) {
    super();
    const opts = (options && options.processorOptions) || {};
    this.targetRate = opts.targetRate || 16000;
    this.frameSamples = Math.round((this.targetRate * (opts.frameMs || 20)) / 1000);
    this.step = sampleRate / this.targetRate; // input samples per output sample
    this.pos = 0; // where the next output sample falls, in input samples from this block's start
    this.prev = 0; // the previous block's last sample (index -1 of the current block)
    this.frame = new Int16Array(this.frameSamples);
    this.filled = 0;
    this.running = true;
    this.port.onmessage = (event) => {
      if (event.data === "stop") this.running = false;
    };
  }

  push(x) {
    const clamped = x > 1 ? 1 : x < -1 ? -1 : x;
    this.frame[this.filled++] = clamped < 0 ? clamped * 0x8000 : clamped * 0x7fff;
    if (this.filled === this.frameSamples) {
      // Int16Array is little-endian on every platform browsers run on
      const buffer = this.frame.buffer;
      this.port.postMessage(buffer, [buffer]);
      this.frame = new Int16Array(this.frameSamples);
      this.filled = 0;
    }
  }

  process(inputs) {
    if (!this.running) return false;
    const input = inputs[0];
    if (!input || input.length === 0 || !input[0] || input[0].length === 0) return true;
    let data = input[0];
    if (input.length > 1) {
      // downmix to mono
      data = new Float32Array(data.length);
      for (const channel of input) {
        for (let i = 0; i < channel.length; i++) data[i] += channel[i] / input.length;
      }
    }
    const len = data.length;
    while (this.pos < len - 1) {
      const i = Math.floor(this.pos);
      const frac = this.pos - i;
      const a = i < 0 ? this.prev : data[i];
      const b = data[i + 1];
      this.push(a + (b - a) * frac);
      this.pos += this.step;
    }
    this.pos -= len;
    this.prev = data[len - 1];
    return true;
  }
}

registerProcessor("pcm16-capture", Pcm16Capture);
