// Llama 3's reference tokenizer for the tests: the npm package llama3-tokenizer-js (scripts/deps.sh), which
// bakes Llama 3's vocabulary and merges into its JavaScript. Nothing derived from it is committed: the tests
// run this script at test time.
// Usage:
//   node llama3_reference.js dump OUT_DIR            writes OUT_DIR/tokenizer.json (Hugging Face's format)
//                                                    and OUT_DIR/tokenizer.model (tiktoken's) from its data
//   node llama3_reference.js encode INPUT OUTPUT     ids of the UTF-8 text INPUT as a JSON array, without
//                                                    BOS/EOS, with special-token spellings encoded as text
//   node llama3_reference.js encode-each INPUT OUTPUT  the same for each string of the JSON array INPUT
// The package is found through NODE_PATH or npm's global folder.
const fs = require('fs');
const path = require('path');
const { execSync } = require('child_process');

function load() {
  const bundle = 'llama3-tokenizer-js/bundle/commonjs-llama3-tokenizer-with-baked-data.cjs';
  try {
    return require(bundle).llama3Tokenizer;
  } catch (e) {
    const root = execSync('npm root -g').toString().trim();
    return require(path.join(root, bundle)).llama3Tokenizer;
  }
}

// GPT-2's bytes_to_unicode, inverted: a vocabulary string -> its raw bytes.
const u2b = (() => {
  const m = new Map();
  let n = 0;
  for (let b = 0; b < 256; ++b) {
    const direct = (b >= 0x21 && b <= 0x7e) || (b >= 0xa1 && b <= 0xac) || (b >= 0xae && b <= 0xff);
    m.set(String.fromCharCode(direct ? b : 256 + n++), b);
  }
  return m;
})();
const toBytes = (s) => Buffer.from([...s].map((c) => {
  if (!u2b.has(c)) throw new Error(`token ${JSON.stringify(s)} is outside the byte-level alphabet`);
  return u2b.get(c);
}));

const PATTERN = "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";

const [mode, a, b] = process.argv.slice(2);
const tok = load();
if (mode === 'dump') {
  const regular = 128000;
  if (tok.vocabById.length !== regular + 256) throw new Error(`expected 128256 tokens, found ${tok.vocabById.length}`);
  const vocab = {};
  const lines = [];
  for (let id = 0; id < regular; ++id) {
    vocab[tok.vocabById[id]] = id;
    lines.push(toBytes(tok.vocabById[id]).toString('base64') + ' ' + id);
  }
  const added = [];
  for (let id = regular; id < tok.vocabById.length; ++id) {
    added.push({ id, content: tok.vocabById[id], single_word: false, lstrip: false, rstrip: false,
                 normalized: false, special: true });
  }
  const json = {
    version: '1.0', truncation: null, padding: null, added_tokens: added, normalizer: null,
    pre_tokenizer: { type: 'Sequence', pretokenizers: [
      { type: 'Split', pattern: { Regex: PATTERN }, behavior: 'Isolated', invert: false },
      { type: 'ByteLevel', add_prefix_space: false, trim_offsets: true, use_regex: false } ] },
    post_processor: null, decoder: { type: 'ByteLevel', add_prefix_space: true, trim_offsets: true, use_regex: true },
    model: { type: 'BPE', dropout: null, unk_token: null, continuing_subword_prefix: null, end_of_word_suffix: null,
             fuse_unk: false, byte_fallback: false, ignore_merges: true, vocab, merges: [...tok.merges.keys()] },
  };
  fs.mkdirSync(a, { recursive: true });
  fs.writeFileSync(path.join(a, 'tokenizer.json'), JSON.stringify(json));
  fs.writeFileSync(path.join(a, 'tokenizer.model'), lines.join('\n') + '\n');
} else if (mode === 'encode' || mode === 'encode-each') {
  const options = { bos: false, eos: false, specialTokenRegex: /(?!)/g };  // a regex that never matches
  const input = fs.readFileSync(a, 'utf-8');
  const out = mode === 'encode' ? tok.encode(input, options)
                                : JSON.parse(input).map((text) => tok.encode(text, options));
  fs.writeFileSync(b, JSON.stringify(out));
} else {
  throw new Error('usage: node llama3_reference.js dump OUT_DIR | encode INPUT OUTPUT | encode-each INPUT OUTPUT');
}
