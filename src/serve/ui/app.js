// drama.c playground: talks only to the server that served it (API.md). No build step, no
// dependencies. wav/pcm responses are played through Web Audio as their chunks arrive; every
// result also ends up in the <audio> element, the waveform and the download link.
'use strict';

const $ = (id) => document.getElementById(id);
const KEY_STORE = 'drama.apiKey'; // sessionStorage only: gone when the tab closes

const state = {
  key: sessionStorage.getItem(KEY_STORE) || '',
  info: null,        // the "drama" object of /v1/models (docs/serve.md)
  ctx: null,         // AudioContext, made on the first Generate (a user gesture)
  abort: null,       // AbortController of the request in flight
  player: null,      // PcmPlayer of the request in flight
  blobUrl: null,
  rawUrl: null,      // the pcm download (the player has a wav of it)
};

// ---- API helpers ----

function authHeaders(extra) {
  const h = Object.assign({}, extra || {});
  if (state.key) h.Authorization = 'Bearer ' + state.key;
  return h;
}

class ApiError extends Error {
  constructor(status, env) {
    super(env && env.message ? env.message : 'HTTP ' + status + ' without an error body');
    this.status = status;
    this.code = env ? env.code : null;
    this.param = env ? env.param : null;
  }
}

// fetch on this server; a non-2xx answer becomes an ApiError carrying the envelope (API.md 1.1)
async function api(path, opts) {
  const o = Object.assign({}, opts || {});
  o.headers = authHeaders(o.headers);
  const res = await fetch(path, o);
  if (res.ok) return res;
  let env = null;
  try { env = (await res.json()).error; } catch (_) { env = null; }
  throw new ApiError(res.status, env);
}

function showError(box, err) {
  box.replaceChildren();
  const msg = document.createElement('strong');
  msg.className = 'message';
  msg.textContent = err.message;
  box.append(msg);
  if (err instanceof ApiError) {
    const d = document.createElement('span');
    d.className = 'detail';
    d.textContent = (err.status ? 'HTTP ' + err.status : 'not sent') + (err.code ? ' · ' + err.code : '') +
      (err.param ? ' · field: ' + err.param : '');
    d.dataset.param = err.param || '';
    d.dataset.code = err.code || '';
    box.append(' ', d);
  }
  box.hidden = false;
}

function clearError(box) { box.hidden = true; box.replaceChildren(); }

function setStatus(text) { $('server-status').textContent = text; }

// ---- server, key, voices ----

const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

async function waitHealthy() {
  for (let i = 0; ; i++) {
    const res = await fetch('/health');
    if (res.ok) return;
    setStatus('server loading…');
    if (i > 600) throw new Error('the server did not become ready');
    await sleep(500);
  }
}

async function connect() {
  try {
    await waitHealthy();
    const models = await (await api('/v1/models')).json();
    const m = (models.data || [])[0] || {};
    state.info = m.drama || {};
    $('key-panel').hidden = true;
    clearError($('key-error'));
    if (state.key) sessionStorage.setItem(KEY_STORE, state.key); // kept once the server took it
    applyInfo();
    await loadVoices();
    setStatus('ready · model ' + (m.id || '?'));
    document.body.dataset.ready = '1';
  } catch (e) {
    if (e instanceof ApiError && e.status === 401) {
      sessionStorage.removeItem(KEY_STORE);
      $('key-panel').hidden = false;
      setStatus('API key needed');
      if (state.key) showError($('key-error'), e);
      $('api-key').focus();
      return;
    }
    setStatus('not connected');
    showError($('error'), e);
  }
}

function applyInfo() {
  const info = state.info;
  const allowed = info.cfg_allow_request_gamma === true;
  $('guidance-row').hidden = !allowed;
  $('guidance-hint').hidden = allowed;
  if (allowed && info.cfg_max_gamma !== undefined) $('cfg-gamma').max = String(info.cfg_max_gamma);
  if (info.max_frames) $('frames').max = String(info.max_frames);
}

async function loadVoices(select) {
  const body = await (await api('/v1/voices')).json();
  const sel = $('voice');
  const keep = select || sel.value;
  sel.replaceChildren(new Option('default', 'default'));
  for (const v of body.voices || []) {
    const label = v.id + ' (' + Number(v.duration_s).toFixed(1) + ' s)';
    sel.append(new Option(label, v.id));
  }
  if ([...sel.options].some((o) => o.value === keep)) sel.value = keep;
}

function useKey(ev) {
  ev.preventDefault();
  state.key = $('api-key').value.trim();
  connect();
}

async function createVoice(ev) {
  ev.preventDefault();
  const box = $('voice-error');
  clearError(box);
  $('voice-status').textContent = '';
  const fd = new FormData();
  fd.append('id', $('voice-id').value.trim());
  fd.append('text', $('voice-text').value);
  const file = $('voice-audio').files[0];
  if (file) fd.append('audio', file, file.name);
  $('voice-submit').disabled = true;
  try {
    const v = await (await api('/v1/voices', { method: 'POST', body: fd })).json();
    $('voice-status').textContent = 'Created voice ' + v.id + ': ' + v.frames + ' frames, ' +
      Number(v.duration_s).toFixed(2) + ' s.';
    await loadVoices(v.id);
  } catch (e) {
    showError(box, e);
  } finally {
    $('voice-submit').disabled = false;
  }
}

// ---- audio ----

// PCM16 LE mono bytes in, Float32 samples out; schedules each chunk right after the previous one
class PcmPlayer {
  constructor(ctx, rate) {
    this.ctx = ctx;
    this.rate = rate;
    this.carry = null;   // an odd byte left from the previous chunk
    this.chunks = [];
    this.samples = 0;
    this.next = 0;       // AudioContext time where the next chunk starts
    this.sources = [];
    this.startedAt = null; // performance.now() when the first chunk was scheduled
  }

  push(bytes) {
    let b = bytes;
    if (this.carry) {
      b = new Uint8Array(bytes.length + 1);
      b[0] = this.carry[0];
      b.set(bytes, 1);
      this.carry = null;
    }
    const n = b.length >> 1;
    if (b.length & 1) this.carry = b.slice(b.length - 1);
    if (n === 0) return 0;
    const dv = new DataView(b.buffer, b.byteOffset, n * 2);
    const f = new Float32Array(n);
    for (let i = 0; i < n; i++) f[i] = dv.getInt16(2 * i, true) / 32768;
    this.chunks.push(f);
    this.samples += n;
    if (this.ctx) this.schedule(f);
    return n;
  }

  schedule(f) {
    const buf = this.ctx.createBuffer(1, f.length, this.rate);
    buf.copyToChannel(f, 0);
    const src = this.ctx.createBufferSource();
    src.buffer = buf;
    src.connect(this.ctx.destination);
    const t = Math.max(this.next, this.ctx.currentTime + 0.05);
    src.start(t);
    this.next = t + buf.duration;
    this.sources.push(src);
    if (this.startedAt === null) this.startedAt = performance.now();
  }

  stop() { for (const s of this.sources) { try { s.stop(); } catch (_) { /* not started */ } } }

  all() {
    const out = new Float32Array(this.samples);
    let o = 0;
    for (const c of this.chunks) { out.set(c, o); o += c.length; }
    return out;
  }
}

// mp3 through Media Source Extensions: each chunk is appended to the <audio> element as it
// arrives, and the element plays as soon as it has enough (Ogg Opus has no MSE byte stream format).
class MseStream {
  constructor(el, t0) {
    this.el = el;
    this.t0 = t0;
    this.queue = [];
    this.ending = false;
    this.startedAt = null; // performance.now() of the first append
  }

  static supported() { return !!window.MediaSource && MediaSource.isTypeSupported('audio/mpeg'); }

  async open() {
    this.ms = new MediaSource();
    this.url = URL.createObjectURL(this.ms);
    this.el.src = this.url;
    await new Promise((r) => this.ms.addEventListener('sourceopen', r, { once: true }));
    this.sb = this.ms.addSourceBuffer('audio/mpeg');
    this.sb.mode = 'sequence';
    this.sb.addEventListener('updateend', () => this.pump());
    this.el.addEventListener('playing', () => {
      document.body.dataset.playingMs = String(performance.now() - this.t0);
    }, { once: true });
  }

  push(bytes) {
    this.queue.push(bytes);
    this.pump();
    if (this.startedAt === null) {
      this.startedAt = performance.now();
      this.el.play().catch(() => { /* paused by Stop or a new request */ });
    }
  }

  pump() {
    if (this.sb.updating) return;
    if (this.queue.length) this.sb.appendBuffer(this.queue.shift());
    else if (this.ending && this.ms.readyState === 'open') this.ms.endOfStream();
  }

  end() { this.ending = true; this.pump(); }

  stop() { this.el.pause(); }
}

// Offset of the PCM data in a RIFF/WAVE prefix, or -1 while more bytes are needed; throws on a
// header that is not 16-bit mono PCM.
function wavDataOffset(b) {
  if (b.length < 12) return -1;
  const tag = (o) => String.fromCharCode(b[o], b[o + 1], b[o + 2], b[o + 3]);
  if (tag(0) !== 'RIFF' || tag(8) !== 'WAVE') throw new Error('the wav stream does not start with RIFF/WAVE');
  const dv = new DataView(b.buffer, b.byteOffset, b.length);
  for (let o = 12; o + 8 <= b.length;) {
    const size = dv.getUint32(o + 4, true);
    if (tag(o) === 'fmt ') {
      if (o + 24 > b.length) return -1;
      if (dv.getUint16(o + 8, true) !== 1 || dv.getUint16(o + 10, true) !== 1 || dv.getUint16(o + 22, true) !== 16)
        throw new Error('the wav stream is not 16-bit mono PCM');
    }
    if (tag(o) === 'data') return o + 8;
    o += 8 + size + (size & 1);
  }
  return -1;
}

// A WAV file (exact sizes) around PCM16 mono bytes, for the <audio> element and the download.
function wavBlob(pcm, rate) {
  const h = new DataView(new ArrayBuffer(44));
  const str = (o, s) => { for (let i = 0; i < 4; i++) h.setUint8(o + i, s.charCodeAt(i)); };
  str(0, 'RIFF'); h.setUint32(4, 36 + pcm.length, true); str(8, 'WAVE'); str(12, 'fmt ');
  h.setUint32(16, 16, true); h.setUint16(20, 1, true); h.setUint16(22, 1, true);
  h.setUint32(24, rate, true); h.setUint32(28, rate * 2, true); h.setUint16(32, 2, true);
  h.setUint16(34, 16, true); str(36, 'data'); h.setUint32(40, pcm.length, true);
  return new Blob([h.buffer, pcm], { type: 'audio/wav' });
}

function concat(parts, total) {
  const out = new Uint8Array(total);
  let o = 0;
  for (const p of parts) { out.set(p, o); o += p.length; }
  return out;
}

function drawWave(samples) {
  const cv = $('wave');
  const g = cv.getContext('2d');
  const w = cv.width, h = cv.height, mid = h / 2;
  g.clearRect(0, 0, w, h);
  g.fillStyle = '#c9d1e6';
  g.fillRect(0, mid, w, 1);
  if (!samples.length) return;
  g.fillStyle = '#2f5fd0';
  const per = Math.max(1, Math.floor(samples.length / w));
  for (let x = 0; x < w; x++) {
    const a = x * per;
    if (a >= samples.length) break;
    let lo = 1, hi = -1;
    for (let i = a; i < Math.min(a + per, samples.length); i++) {
      const s = samples[i];
      if (s < lo) lo = s;
      if (s > hi) hi = s;
    }
    const y0 = mid - hi * mid, y1 = mid - lo * mid;
    g.fillRect(x, y0, 1, Math.max(1, y1 - y0));
  }
}

// ---- figures ----

function fmtS(x) { return x === null || !isFinite(x) ? '–' : x.toFixed(3) + ' s'; }

function figures(f) {
  $('fig-ttfa').textContent = fmtS(f.ttfa);
  $('fig-rtf').textContent = f.audio > 0 ? (f.elapsed / f.audio).toFixed(3) + ' (wall s per audio s)' : '–';
  $('fig-frames').textContent = f.frames === null ? '–' : String(f.frames) + (f.framesNote || '');
  $('fig-audio').textContent = fmtS(f.audio);
  $('fig-bytes').textContent = String(f.bytes);
  $('fig-bytes').dataset.bytes = String(f.bytes);
}

// Prometheus text -> {name{labels}: value}
function parseMetrics(text) {
  const m = {};
  for (const line of text.split('\n')) {
    if (!line || line[0] === '#') continue;
    const sp = line.lastIndexOf(' ');
    m[line.slice(0, sp)] = Number(line.slice(sp + 1));
  }
  return m;
}

function sumOf(m, prefix) {
  let s = 0;
  for (const k in m) if (k === prefix || k.startsWith(prefix + '{')) s += m[k];
  return s;
}

async function serverFigures() {
  const el = $('fig-server');
  try {
    const m = parseMetrics(await (await api('/metrics')).text());
    const n = sumOf(m, 'drama_time_to_first_audio_seconds_count');
    const ttfa = n ? sumOf(m, 'drama_time_to_first_audio_seconds_sum') / n : NaN;
    const rn = sumOf(m, 'drama_real_time_factor_count');
    const rtf = rn ? sumOf(m, 'drama_real_time_factor_sum') / rn : NaN;
    el.textContent = 'mean time to first audio ' + (n ? ttfa.toFixed(3) + ' s' : '–') + ' over ' + n +
      ' syntheses · mean RTF ' + (rn ? rtf.toFixed(3) : '–') + ' · ' +
      sumOf(m, 'drama_frames_per_second').toFixed(1) + ' frames/s · ' +
      sumOf(m, 'drama_frames_generated_total') + ' frames generated';
  } catch (e) {
    el.textContent = 'metrics unavailable: ' + e.message;
  }
}

// ---- generate ----

function numberField(id, name, body, integer) {
  const raw = $(id).value.trim();
  if (raw === '') return;
  // seeds are 64-bit: send the digits as they are (JSON numbers past 2^53 lose precision in JS)
  if (id === 'seed') {
    if (!/^-?\d+$/.test(raw)) throw new ApiError(0, { message: 'seed must be an integer', param: 'seed' });
    body[name] = { raw };
    return;
  }
  const x = Number(raw);
  if (!isFinite(x) || (integer && !Number.isInteger(x)))
    throw new ApiError(0, { message: name + ' must be ' + (integer ? 'an integer' : 'a number'), param: name });
  body[name] = x;
}

function requestBody() {
  const body = { text: $('text').value, format: $('format').value, streaming: true, latency: 'balanced' };
  const voice = $('voice').value;
  if (voice !== 'default') body.reference_id = voice;
  numberField('seed', 'seed', body, true);
  numberField('temperature', 'temperature', body, false);
  numberField('top-p', 'top_p', body, false);
  numberField('frames', 'frames', body, true);
  if (!$('guidance-row').hidden) numberField('cfg-gamma', 'cfg_gamma', body, false);
  // the seed's digits go in verbatim
  return JSON.stringify(body).replace(/\{"raw":"(-?\d+)"\}/, '$1');
}

function audioContext() {
  const rate = state.info && state.info.sample_rate ? state.info.sample_rate : 44100;
  if (!state.ctx || state.ctx.sampleRate !== rate) state.ctx = new AudioContext({ sampleRate: rate });
  if (state.ctx.state === 'suspended') state.ctx.resume();
  return state.ctx;
}

// the result: in the player (unless it already plays it through MSE) and as the download
function setResult(blob, filename, inPlayer) {
  if (state.blobUrl) URL.revokeObjectURL(state.blobUrl);
  state.blobUrl = URL.createObjectURL(blob);
  if (inPlayer) $('player').src = state.blobUrl;
  const dl = $('download');
  dl.href = state.blobUrl;
  dl.download = filename;
  dl.textContent = 'Download ' + filename;
  dl.hidden = false;
}

async function generate() {
  const box = $('error');
  clearError(box);
  stop();
  document.body.dataset.state = 'running';
  const fmt = $('format').value;
  const rate = state.info && state.info.sample_rate ? state.info.sample_rate : 44100;
  const spf = state.info && state.info.samples_per_frame ? state.info.samples_per_frame : 0;
  const live = fmt === 'wav' || fmt === 'pcm';
  let body;
  try {
    body = requestBody();
  } catch (e) {
    showError(box, e);
    document.body.dataset.state = 'error';
    return;
  }
  const ctx = audioContext();
  delete document.body.dataset.audioState;
  delete document.body.dataset.playingMs;
  const abort = new AbortController();
  state.abort = abort;
  $('generate').disabled = true;
  $('stop').disabled = false;
  $('download').hidden = true;
  $('player').removeAttribute('src');
  const f = { ttfa: null, elapsed: 0, audio: 0, frames: null, bytes: 0, framesNote: '' };
  figures(f);
  $('fig-seed').textContent = '–';
  $('fig-request').textContent = '–';
  const t0 = performance.now();
  const player = live ? new PcmPlayer(ctx, rate) : null;
  const mse = fmt === 'mp3' && MseStream.supported() ? new MseStream($('player'), t0) : null;
  state.player = player || mse;
  const parts = [];
  let head = fmt === 'wav' ? new Uint8Array(0) : null; // wav bytes until the data offset is known
  let chunks = 0;
  try {
    if (mse) await mse.open();
    const res = await api('/v1/tts', {
      method: 'POST', headers: { 'Content-Type': 'application/json' }, body, signal: abort.signal,
    });
    $('fig-seed').textContent = res.headers.get('X-Seed') || '–';
    $('fig-request').textContent = res.headers.get('X-Request-Id') || '–';
    const reader = res.body.getReader();
    for (;;) {
      const { done, value } = await reader.read();
      if (done) break;
      chunks++;
      f.bytes += value.length;
      f.elapsed = (performance.now() - t0) / 1000;
      let pcm = value;
      if (head) { // strip the wav header; what follows it is PCM
        const b = concat([head, value], head.length + value.length);
        const off = wavDataOffset(b);
        if (off < 0 || off > b.length) { head = b; continue; }
        head = null;
        pcm = b.subarray(off);
      }
      parts.push(pcm);
      if (player) {
        if (player.push(pcm) > 0 && f.ttfa === null) {
          f.ttfa = f.elapsed;
          document.body.dataset.audioState = ctx.state; // 'running': the first chunk is audible now
        }
        f.audio = player.samples / rate;
        if (spf) f.frames = Math.floor(player.samples / spf);
        drawWave(player.all());
      } else {
        if (mse) mse.push(value);
        if (f.ttfa === null) f.ttfa = f.elapsed;
      }
      figures(f);
    }
    f.elapsed = (performance.now() - t0) / 1000;
    const total = parts.reduce((n, p) => n + p.length, 0);
    const bytes = concat(parts, total);
    if (live) {
      setResult(wavBlob(bytes, rate), 'audio.' + fmt, true);
      if (fmt === 'pcm') setDownloadRaw(bytes);
      drawWave(player.all());
    } else {
      const type = fmt === 'mp3' ? 'audio/mpeg' : 'audio/ogg';
      if (mse) mse.end();
      setResult(new Blob([bytes], { type }), 'audio.' + fmt, !mse);
      try {
        const buf = await ctx.decodeAudioData(bytes.slice().buffer);
        const s = buf.getChannelData(0);
        f.audio = buf.duration;
        if (spf) { f.frames = '≈' + Math.round(buf.duration * rate / spf); f.framesNote = ' (from the decoded length)'; }
        drawWave(s);
      } catch (e) {
        f.framesNote = ' (the browser could not decode ' + fmt + ': ' + e.message + ')';
      }
    }
    figures(f);
    document.body.dataset.chunks = String(chunks);
    const p = player || mse;
    document.body.dataset.liveStartMs = p && p.startedAt !== null ? String(p.startedAt - t0) : '';
    document.body.dataset.endMs = String(f.elapsed * 1000);
    document.body.dataset.state = 'done';
    serverFigures();
  } catch (e) {
    if (abort.signal.aborted) {
      document.body.dataset.state = 'stopped';
    } else {
      // a stream cut after the status line is a server-side failure (API.md 3.3): say so
      const err = e instanceof ApiError ? e
        : new Error(f.bytes ? 'the audio stream ended early (' + f.bytes + ' bytes): the server failed after it started; see its log'
          : 'request failed: ' + e.message);
      showError(box, err);
      document.body.dataset.state = 'error';
    }
  } finally {
    if (state.abort === abort) state.abort = null;
    $('generate').disabled = false;
    $('stop').disabled = true;
  }
}

// pcm: the download is the raw bytes the server sent; the player keeps its wav wrapper
function setDownloadRaw(bytes) {
  if (state.rawUrl) URL.revokeObjectURL(state.rawUrl);
  state.rawUrl = URL.createObjectURL(new Blob([bytes], { type: 'application/octet-stream' }));
  const dl = $('download');
  dl.href = state.rawUrl;
  dl.download = 'audio.pcm';
}

function stop() {
  if (state.abort) state.abort.abort();
  if (state.player) state.player.stop();
  state.player = null;
}

// ---- start ----

function start() {
  $('text').value = '<|speaker:0|>Hello from drama.c. [whisper] This part is whispered.';
  $('generate').addEventListener('click', generate);
  $('stop').addEventListener('click', stop);
  $('key-form').addEventListener('submit', useKey);
  $('voice-form').addEventListener('submit', createVoice);
  drawWave(new Float32Array(0));
  if (MseStream.supported()) $('format').querySelector('option[value=mp3]').textContent = 'mp3 (plays while streaming)';
  connect();
}

start();
