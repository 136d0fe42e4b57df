// An independent reader of TensorBoard event files (Node's standard library only), written from the format's
// description, not from qwen3-train's writer: TFRecord framing (length, masked CRC-32C of the length, data,
// masked CRC-32C of the data; the CRC computed bit by bit here), tensorflow.Event decoded as generic protocol
// buffers. Prints {"file_version", "events": [{"step", "wall_time", "scalars": {tag: value}}], "session_starts":
// [step, ...]} as JSON (SessionLog START events, by which TensorBoard drops earlier events at or past their step);
// exits 1 naming the first problem.
import fs from "node:fs";

function fail(message) {
  console.error(`read_tfevents: ${message}`);
  process.exit(1);
}

function crc32c(bytes) {
  let c = 0xffffffff;
  for (const b of bytes) {
    c ^= b;
    for (let k = 0; k < 8; ++k) c = c & 1 ? (c >>> 1) ^ 0x82f63b78 : c >>> 1;
  }
  return (c ^ 0xffffffff) >>> 0;
}
const masked = (crc) => ((((crc >>> 15) | (crc << 17)) >>> 0) + 0xa282ead8) >>> 0;

// Protocol-buffer fields of a message: [{field, wire, value}] (varints as BigInt, fixed64 and fixed32 as Buffers,
// length-delimited as Buffers).
function fields(buf) {
  const out = [];
  let i = 0;
  const varint = () => {
    let v = 0n, shift = 0n;
    for (;;) {
      if (i >= buf.length) fail("a varint runs past its message");
      const b = buf[i++];
      v |= BigInt(b & 0x7f) << shift;
      if (!(b & 0x80)) return v;
      shift += 7n;
    }
  };
  while (i < buf.length) {
    const key = Number(varint());
    const field = key >> 3, wire = key & 7;
    let value;
    if (wire === 0) value = varint();
    else if (wire === 1) { value = buf.subarray(i, i + 8); i += 8; }
    else if (wire === 5) { value = buf.subarray(i, i + 4); i += 4; }
    else if (wire === 2) { const n = Number(varint()); value = buf.subarray(i, i + n); i += n; }
    else fail(`wire type ${wire}`);
    if (i > buf.length) fail("a field runs past its message");
    out.push({ field, wire, value });
  }
  return out;
}

const file = process.argv[2];
if (!file) fail("usage: read_tfevents.mjs EVENTS_FILE");
const data = fs.readFileSync(file);
let pos = 0, fileVersion = null;
const events = [], sessionStarts = [];
while (pos < data.length) {
  if (pos + 12 > data.length) fail(`a record header is cut at byte ${pos}`);
  const lengthBytes = data.subarray(pos, pos + 8);
  const length = Number(lengthBytes.readBigUInt64LE(0));
  if (data.readUInt32LE(pos + 8) !== masked(crc32c(lengthBytes))) fail(`the length's CRC at byte ${pos}`);
  const body = data.subarray(pos + 12, pos + 12 + length);
  if (body.length !== length || pos + 16 + length > data.length) fail(`a record is cut at byte ${pos}`);
  if (data.readUInt32LE(pos + 12 + length) !== masked(crc32c(body))) fail(`the data's CRC at byte ${pos}`);
  pos += 16 + length;
  const event = { step: 0, wall_time: 0, scalars: {} };
  for (const f of fields(body)) {
    if (f.field === 1 && f.wire === 1) event.wall_time = f.value.readDoubleLE(0);
    else if (f.field === 2 && f.wire === 0) event.step = Number(f.value);
    else if (f.field === 3 && f.wire === 2) fileVersion = f.value.toString("utf8");
    else if (f.field === 7 && f.wire === 2) {  // session_log: status = 1 (START = 1)
      for (const x of fields(f.value)) if (x.field === 1 && x.wire === 0 && x.value === 1n) event.start = true;
    }
    else if (f.field === 5 && f.wire === 2)
      for (const v of fields(f.value)) {
        if (v.field !== 1 || v.wire !== 2) continue;
        let tag = null, simple = null;
        for (const x of fields(v.value)) {
          if (x.field === 1 && x.wire === 2) tag = x.value.toString("utf8");
          if (x.field === 2 && x.wire === 5) simple = x.value.readFloatLE(0);
        }
        if (tag === null || simple === null) fail(`a summary value without a tag or a simple_value at step ${event.step}`);
        event.scalars[tag] = simple;
      }
  }
  if (event.start) sessionStarts.push(event.step);
  if (Object.keys(event.scalars).length) events.push(event);
}
if (fileVersion !== "brain.Event:2") fail(`file_version is ${fileVersion}`);
console.log(JSON.stringify({ file_version: fileVersion, events, session_starts: sessionStarts }));
