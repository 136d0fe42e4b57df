#!/usr/bin/env node
// Times the reference tokenizer (@huggingface/tokenizers, pure JS) on the corpus that bench_tokenizer uses, on
// the same machine, so docs/tokenizer.md can compare like with like. Writes the corpus first when it is
// missing: .deps/bench/tokenizer-corpus.json, a JSON array of documents, half of them fixture strings glued
// together (code, CJK, emoji, special tokens, whitespace runs), half the text of random vocabulary ids (many
// distinct words, so caches miss). Prints MB/s, tokens/s and a checksum of the ids that bench_tokenizer
// prints too: equal checksums mean both produced the same ids for the whole corpus.
//   node scripts/bench-tokenizer-reference.mjs [passes]
import fs from "node:fs";
import path from "node:path";
import { fileURLToPath } from "node:url";
import { fixtureStrings, loadReference } from "./make-tokenizer-fixture.mjs";

const root = path.resolve(path.dirname(fileURLToPath(import.meta.url)), "..");
const corpusPath = process.env.QWEN3_TOKENIZER_CORPUS ?? path.join(root, ".deps", "bench", "tokenizer-corpus.json");
const passes = Number(process.argv[2] ?? 5);

function mulberry32(seed) {
  return () => {
    seed = (seed + 0x6d2b79f5) | 0;
    let t = Math.imul(seed ^ (seed >>> 15), 1 | seed);
    t = (t + Math.imul(t ^ (t >>> 7), 61 | t)) ^ t;
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

function makeCorpus(tokenizer) {
  const random = mulberry32(42);
  const strings = fixtureStrings();
  const docs = [];
  let bytes = 0;
  for (let k = 0; bytes < 4 << 20; ++k) {
    let doc;
    if (k % 2 === 0) {
      const parts = [];
      for (let i = 0; i < 24; ++i) parts.push(strings[Math.floor(random() * strings.length)]);
      doc = parts.join(random() < 0.5 ? "\n" : " ");
    } else {
      const ids = [];
      for (let i = 0; i < 400; ++i) ids.push(Math.floor(random() * 151643));
      doc = tokenizer.decode(ids);
    }
    docs.push(doc);
    bytes += Buffer.byteLength(doc, "utf8");
  }
  fs.mkdirSync(path.dirname(corpusPath), { recursive: true });
  fs.writeFileSync(corpusPath, JSON.stringify(docs));
  console.error(`wrote ${corpusPath}: ${docs.length} documents, ${bytes} bytes`);
}

const { tokenizer } = await loadReference();
if (!fs.existsSync(corpusPath)) makeCorpus(tokenizer);
const docs = JSON.parse(fs.readFileSync(corpusPath, "utf8"));
const bytes = docs.reduce((n, d) => n + Buffer.byteLength(d, "utf8"), 0);

const seconds = [];
let tokens = 0, checksum = 0;
for (let pass = 0; pass <= passes; ++pass) {  // pass 0 warms the JIT and the cache, untimed
  tokens = 0;
  checksum = 0;
  const t0 = process.hrtime.bigint();
  for (const doc of docs) {
    const ids = tokenizer.encode(doc, { add_special_tokens: false }).ids;
    tokens += ids.length;
    for (const id of ids) checksum = (checksum * 31 + id) % 1000000007;
  }
  if (pass > 0) seconds.push(Number(process.hrtime.bigint() - t0) / 1e9);
}
seconds.sort((a, b) => a - b);
const median = seconds[Math.floor(seconds.length / 2)];
console.log(JSON.stringify({
  implementation: "@huggingface/tokenizers 0.2.0 on node " + process.version,
  documents: docs.length, bytes, tokens, checksum, passes,
  median_s: +median.toFixed(3), best_s: +seconds[0].toFixed(3),
  median_MB_per_s: +(bytes / median / 1e6).toFixed(2), median_tokens_per_s: Math.round(tokens / median),
}));
