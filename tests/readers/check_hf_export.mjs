#!/usr/bin/env node
// An independent reader of qwen3-train's Hugging Face exports (tests/test_hf_export.cpp runs it): Node's standard
// library only, written from the safetensors and ModelOpt NVFP4 conventions, not from qwen3-train's code.
//   node check_hf_export.mjs HF_DIR NVFP4_HF_DIR
// Checks each folder's files, every safetensors header (8-byte length, JSON, offsets that tile the data
// exactly, dtype sizes), the tensors against config.json (names, dtypes, shapes), the shard index, and that
// every NVFP4 projection dequantizes (E2M1 code x E4M3 block scale x weight_scale_2) to exactly the bf16 value of
// the hf export. Prints a JSON summary; exits 1 with a message on the first problem.
import fs from "node:fs";
import path from "node:path";

const fail = (msg) => { console.error(`check_hf_export: ${msg}`); process.exit(1); };
const sizes = { BF16: 2, F16: 2, F32: 4, U8: 1, F8_E4M3: 1, I64: 8 };

function readSafetensors(file) {
  const buf = fs.readFileSync(file);
  if (buf.length < 8) fail(`${file}: shorter than its length field`);
  const n = Number(buf.readBigUInt64LE(0));
  if (8 + n > buf.length) fail(`${file}: header length ${n} past the end`);
  const header = JSON.parse(buf.subarray(8, 8 + n).toString("utf8"));
  const data = buf.subarray(8 + n);
  const tensors = {};
  const spans = [];
  for (const [name, t] of Object.entries(header)) {
    if (name === "__metadata__") continue;
    const count = t.shape.reduce((a, b) => a * b, 1);
    const [b, e] = t.data_offsets;
    if (!(t.dtype in sizes)) fail(`${file}: ${name}: unexpected dtype ${t.dtype}`);
    if (e - b !== count * sizes[t.dtype]) fail(`${file}: ${name}: ${e - b} bytes for ${count} ${t.dtype}`);
    spans.push([b, e]);
    tensors[name] = { ...t, bytes: data.subarray(b, e) };
  }
  spans.sort((x, y) => x[0] - y[0]);
  let at = 0;
  for (const [b, e] of spans) { if (b !== at) fail(`${file}: a gap or overlap at ${at}`); at = e; }
  if (at !== data.length) fail(`${file}: the tensors cover ${at} of ${data.length} data bytes`);
  if (header.__metadata__?.format !== "pt") fail(`${file}: metadata.format is not "pt" (transformers refuses it)`);
  return tensors;
}

function readFolder(dir) {
  const config = JSON.parse(fs.readFileSync(path.join(dir, "config.json"), "utf8"));
  JSON.parse(fs.readFileSync(path.join(dir, "generation_config.json"), "utf8"));
  const indexPath = path.join(dir, "model.safetensors.index.json");
  const tensors = {};
  let shards = 0;
  if (fs.existsSync(indexPath)) {
    const index = JSON.parse(fs.readFileSync(indexPath, "utf8"));
    const files = [...new Set(Object.values(index.weight_map))];
    let total = 0;
    for (const f of files) {
      const t = readSafetensors(path.join(dir, f));
      for (const [name, v] of Object.entries(t)) {
        if (index.weight_map[name] !== f) fail(`${dir}: ${name} is in ${f}, the index says ${index.weight_map[name]}`);
        tensors[name] = v;
        total += v.bytes.length;
      }
    }
    if (Object.keys(index.weight_map).length !== Object.keys(tensors).length) fail(`${dir}: index and shards differ`);
    if (index.metadata.total_size !== total) fail(`${dir}: index total_size ${index.metadata.total_size}, shards ${total}`);
    shards = files.length;
  } else {
    Object.assign(tensors, readSafetensors(path.join(dir, "model.safetensors")));
    shards = 1;
  }
  return { config, tensors, shards };
}

function expectedShapes(c) {
  const h = c.hidden_size, q = c.num_attention_heads * c.head_dim, kv = c.num_key_value_heads * c.head_dim;
  const out = { "model.embed_tokens.weight": [c.vocab_size, h], "model.norm.weight": [h] };
  if (!c.tie_word_embeddings) out["lm_head.weight"] = [c.vocab_size, h];
  for (let l = 0; l < c.num_hidden_layers; ++l) {
    const p = `model.layers.${l}.`;
    Object.assign(out, {
      [p + "self_attn.q_proj.weight"]: [q, h], [p + "self_attn.k_proj.weight"]: [kv, h],
      [p + "self_attn.v_proj.weight"]: [kv, h], [p + "self_attn.o_proj.weight"]: [h, q],
      [p + "self_attn.q_norm.weight"]: [c.head_dim], [p + "self_attn.k_norm.weight"]: [c.head_dim],
      [p + "mlp.gate_proj.weight"]: [c.intermediate_size, h], [p + "mlp.up_proj.weight"]: [c.intermediate_size, h],
      [p + "mlp.down_proj.weight"]: [h, c.intermediate_size],
      [p + "input_layernorm.weight"]: [h], [p + "post_attention_layernorm.weight"]: [h],
    });
  }
  return out;
}

const bf16 = (bytes, i) => { const b = Buffer.alloc(4); b.writeUInt16LE(bytes.readUInt16LE(2 * i), 2); return b.readFloatLE(0); };
const E2M1 = [0, 0.5, 1, 1.5, 2, 3, 4, 6];
const e2m1 = (code) => (code & 8 ? -1 : 1) * E2M1[code & 7];
function e4m3(byte) {  // FN: no infinities; 0x7F/0xFF NaN
  const s = byte & 0x80 ? -1 : 1, e = (byte >> 3) & 15, m = byte & 7;
  if (e === 15 && m === 7) return NaN;
  return s * (e === 0 ? (m / 8) * 2 ** -6 : (1 + m / 8) * 2 ** (e - 7));
}

const [hfDir, fp4Dir] = process.argv.slice(2);
if (!hfDir || !fp4Dir) fail("usage: check_hf_export.mjs HF_DIR NVFP4_HF_DIR");
const hf = readFolder(hfDir), fp4 = readFolder(fp4Dir);
if (hf.config.model_type !== "qwen3" || hf.config.architectures?.[0] !== "Qwen3ForCausalLM") fail("hf config: not Qwen3ForCausalLM");
if (hf.config.quantization_config) fail("hf config: has a quantization_config");
const shapes = expectedShapes(hf.config);
for (const [name, shape] of Object.entries(shapes)) {
  const t = hf.tensors[name];
  if (!t) fail(`hf: no ${name}`);
  if (t.dtype !== "BF16" || JSON.stringify(t.shape) !== JSON.stringify(shape)) fail(`hf: ${name} is ${t.dtype} ${t.shape}`);
}
if (Object.keys(hf.tensors).length !== Object.keys(shapes).length) fail("hf: tensors the config does not name");

// ModelOpt's weight-only W4A16_NVFP4 (no input_scale) or W4A4 NVFP4 (an input_scale per projection), the same
// in config.json and hf_quant_config.json.
const q = fp4.config.quantization_config;
const algo = q?.quant_algo;
if (q?.quant_method !== "modelopt" || !["W4A16_NVFP4", "NVFP4"].includes(algo) || q.group_size !== 16)
  fail("nvfp4-hf: quantization_config");
const hq = JSON.parse(fs.readFileSync(path.join(fp4Dir, "hf_quant_config.json"), "utf8")).quantization;
if (hq.quant_algo !== algo || hq.group_size !== 16 || !hq.exclude_modules.includes("lm_head")) fail("hf_quant_config.json");
if (typeof fp4.config.transformers_version !== "string") fail("nvfp4-hf config: no transformers_version");
// weight_scale_2: a power of two other than 1 (older vLLM's FP4 Marlin path garbled 1), one per fused group
// (vLLM loads q/k/v and gate/up as one layer with one global scale).
const groupScale = {};
const fusedGroup = (base) => base.replace(/\.self_attn\.[qkv]_proj$/, ".self_attn.qkv").replace(/\.mlp\.(gate|up)_proj$/, ".mlp.gate_up");
let projections = 0, values = 0;
for (const [name, shape] of Object.entries(shapes)) {
  const base = name.replace(/\.weight$/, "");
  const w = fp4.tensors[name];
  if (!w) fail(`nvfp4-hf: no ${name}`);
  if (w.dtype === "BF16") {  // embeddings, norms, lm_head: as in hf
    if (!w.bytes.equals(hf.tensors[name].bytes)) fail(`nvfp4-hf: ${name} differs from hf`);
    continue;
  }
  const [rows, cols] = shape;
  const scale = fp4.tensors[base + ".weight_scale"], scale2 = fp4.tensors[base + ".weight_scale_2"];
  const input = fp4.tensors[base + ".input_scale"];
  if (w.dtype !== "U8" || JSON.stringify(w.shape) !== JSON.stringify([rows, cols / 2])) fail(`nvfp4-hf: ${name} ${w.dtype} ${w.shape}`);
  if (scale?.dtype !== "F8_E4M3" || JSON.stringify(scale.shape) !== JSON.stringify([rows, cols / 16])) fail(`nvfp4-hf: ${base}.weight_scale`);
  if (scale2?.dtype !== "F32" || scale2.shape.length !== 0) fail(`nvfp4-hf: ${base}.weight_scale_2`);
  if (algo === "NVFP4" ? input?.dtype !== "F32" || input.shape.length !== 0 : input !== undefined)
    fail(`nvfp4-hf: ${base}.input_scale ${algo === "NVFP4" ? "missing" : "present in a weight-only export"}`);
  const s2 = scale2.bytes.readFloatLE(0);
  if (!(s2 > 0 && s2 !== 1 && Math.log2(s2) === Math.round(Math.log2(s2)))) fail(`nvfp4-hf: ${base}.weight_scale_2 is ${s2}`);
  const group = fusedGroup(base);
  if (group in groupScale && groupScale[group] !== s2) fail(`nvfp4-hf: ${base}.weight_scale_2 ${s2} differs in ${group}`);
  groupScale[group] = s2;
  const ref = hf.tensors[name].bytes;
  for (let r = 0; r < rows; ++r)
    for (let c = 0; c < cols; ++c) {
      const byte = w.bytes[(r * cols + c) >> 1];
      const code = c % 2 === 0 ? byte & 15 : byte >> 4;  // element 2j in the low nibble
      const v = e2m1(code) * e4m3(scale.bytes[r * (cols / 16) + (c >> 4)]) * s2;
      const want = bf16(ref, r * cols + c);
      if (!(v === want || (v === 0 && want === 0))) fail(`${name}[${r}, ${c}]: nvfp4-hf dequantizes to ${v}, hf holds ${want}`);
      ++values;
    }
  ++projections;
}
console.log(JSON.stringify({ hf_tensors: Object.keys(hf.tensors).length, hf_shards: hf.shards,
                             nvfp4_tensors: Object.keys(fp4.tensors).length, nvfp4_shards: fp4.shards, projections, values,
                             quant_algo: algo, global_scales: [...new Set(Object.values(groupScale))].length,
                             fused_groups: Object.keys(groupScale).length }));
