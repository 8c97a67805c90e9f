// msgpack_tts.mjs BASE_URL API_KEY WAV OUT_DIR - msgpack bodies built with @msgpack/msgpack:
// a /v1/tts request with an inline reference as a `bin` value (and the same as a base64 string),
// and a voice upload (audio as bin). Writes bin.wav, b64.wav; the voice is "mp-voice".
import { encode } from "@msgpack/msgpack";
import { readFileSync, writeFileSync } from "node:fs";

const [base, key, wavPath, out] = process.argv.slice(2);
const clip = new Uint8Array(readFileSync(wavPath));
const headers = { "Content-Type": "application/msgpack", Authorization: `Bearer ${key}` };
const post = async (path, body) => {
  const r = await fetch(`${base}${path}`, { method: "POST", headers, body: encode(body) });
  return { status: r.status, bytes: Buffer.from(await r.arrayBuffer()), headers: r.headers };
};

const tts = (audio) => ({
  text: "Hello from msgpack.", format: "wav", seed: 21, frames: 16,
  references: [{ audio, text: "Reference words." }],
});
const a = await post("/v1/tts", tts(clip));
if (a.status !== 200) throw new Error(`bin: ${a.status} ${a.bytes}`);
writeFileSync(`${out}/bin.wav`, a.bytes);
const b = await post("/v1/tts", tts(Buffer.from(clip).toString("base64")));
if (b.status !== 200) throw new Error(`base64: ${b.status} ${b.bytes}`);
writeFileSync(`${out}/b64.wav`, b.bytes);
console.log(`tts: bin ${a.bytes.length} bytes, base64 ${b.bytes.length} bytes, seed ${a.headers.get("x-seed")}`);

const v = await post("/v1/voices", { id: "mp-voice", text: "Reference words.", audio: clip });
if (v.status !== 201) throw new Error(`voice: ${v.status} ${v.bytes}`);
console.log(`voice: ${v.bytes}`);
const bad = await post("/v1/tts", { text: "x", temperature: NaN });
const env = JSON.parse(bad.bytes);
if (bad.status !== 400 || env.error.code !== "invalid_number" || env.error.param !== "temperature")
  throw new Error(`NaN: ${bad.status} ${bad.bytes}`);
console.log(`NaN temperature: ${bad.status} ${env.error.code}`);
