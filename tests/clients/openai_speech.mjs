// openai_speech.mjs BASE_URL API_KEY OUT_DIR - the real `openai` npm client against drama serve:
// audio.speech.create whole (arrayBuffer) and streamed (the response body read chunk by chunk),
// wav and mp3, plus SSE (stream_format "sse") parsed by hand. Writes whole.<fmt>, stream.<fmt>,
// sse.wav; exits non-zero on any failure. Extension fields (seed, frames) go in the body as the
// OpenAI API allows for unknown parameters.
import OpenAI from "openai";
import { writeFileSync } from "node:fs";

const [base, key, out] = process.argv.slice(2);
const client = new OpenAI({ baseURL: `${base}/v1`, apiKey: key, maxRetries: 0, timeout: 60000 });
const params = (fmt, extra = {}) => ({
  model: "tts-1", voice: "default", input: "Hello from the OpenAI client.", response_format: fmt,
  seed: 11, frames: 20, ...extra,
});

for (const fmt of ["wav", "mp3"]) {
  const whole = await client.audio.speech.create(params(fmt));
  const a = Buffer.from(await whole.arrayBuffer());
  if (whole.headers.get("x-seed") !== "11") throw new Error(`x-seed ${whole.headers.get("x-seed")}`);
  writeFileSync(`${out}/whole.${fmt}`, a);
  const streamed = await client.audio.speech.create(params(fmt));
  const parts = [];
  for await (const chunk of streamed.body) parts.push(Buffer.from(chunk));
  writeFileSync(`${out}/stream.${fmt}`, Buffer.concat(parts));
  console.log(`${fmt}: whole ${a.length} bytes, streamed ${parts.length} reads`);
}

const sse = await client.audio.speech.create(params("wav", { stream_format: "sse" }));
if (!String(sse.headers.get("content-type")).startsWith("text/event-stream")) throw new Error("sse content type");
const text = await sse.text();
const audio = [];
let done = null;
for (const block of text.split("\n\n")) {
  const line = block.split("\n").find((l) => l.startsWith("data: "));
  if (!line) continue;
  const ev = JSON.parse(line.slice(6));
  if (ev.type === "speech.audio.delta") audio.push(Buffer.from(ev.audio, "base64"));
  else if (ev.type === "speech.audio.done") done = ev;
  else throw new Error(`unexpected event ${line}`);
}
if (!done || done.usage.output_tokens !== 20) throw new Error(`done event ${JSON.stringify(done)}`);
writeFileSync(`${out}/sse.wav`, Buffer.concat(audio));
console.log(`sse: ${audio.length} deltas, usage ${JSON.stringify(done.usage)}`);

// an error is a thrown APIError carrying the envelope
try {
  await client.audio.speech.create(params("aac"));
  throw new Error("aac accepted");
} catch (e) {
  if (!(e instanceof OpenAI.APIError) || e.status !== 400 || e.error?.code !== "unsupported_format")
    throw new Error(`aac: ${e}`);
  console.log(`error: ${e.status} ${e.error.code} param=${e.error.param}`);
}
