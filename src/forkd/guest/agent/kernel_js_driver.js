'use strict';
// forkd's JavaScript kernel, the node side: one persistent `vm` context that every cell runs in.
//
// kernel_js.py (a Jupyter wrapper kernel) starts `node --experimental-vm-modules` on this file in its
// own session, and writes it one JSON request a line on the pipe named by FORKD_JS_FD:
// {"op": "run", "code", "env"} or {"op": "restored", "env", "seed"}. A cell's console output goes to
// this process's own stdout and stderr as it is written; when a request is done, a line that starts
// with FORKD_JS_MARK ends each of them, the stdout one carrying the answer as JSON:
// {"value": util.inspect of the last expression's value, or null} or {"error": {name, value, traceback}}.
//
// A cell is a classic script in the context, so its top-level let/const/class/function declarations
// persist for the next cells (and a second `let x` is a SyntaxError, as in a browser console). A
// cell that uses top-level `await` runs as the body of an async function instead (see asyncCell):
// its value is its last expression's, and its top-level declarations become globals of the context.
// Static `import` statements become require() calls resolved from the working directory (builtins
// and CommonJS packages); `import()` works too. SIGINT (the kernel passes the interrupt on) stops a
// running cell: vm's breakOnSigint ends a busy loop, and a pending await is abandoned.

const vm = require('vm');
const util = require('util');
const net = require('net');
const path = require('path');
const { createRequire } = require('module');
const { pathToFileURL } = require('url');

const MARK = process.env.FORKD_JS_MARK || '\x1eforkd-js';
const FD = Number(process.env.FORKD_JS_FD);
delete process.env.FORKD_JS_MARK;
delete process.env.FORKD_JS_FD;
const CELL = '<cell>';

const cellRequire = createRequire(path.join(process.cwd(), CELL));
const context = vm.createContext({});
const contextGlobal = vm.runInContext('globalThis', context);
{
  // Node's globals (process, Buffer, timers, fetch, ...) that a bare context lacks, as node's REPL has
  // them; console is node's (V8 gives a context a console of its own that prints nothing).
  const own = new Set(Object.getOwnPropertyNames(contextGlobal));
  for (const name of Object.getOwnPropertyNames(globalThis)) {
    if (!own.has(name)) Object.defineProperty(contextGlobal, name, Object.getOwnPropertyDescriptor(globalThis, name));
  }
  Object.assign(contextGlobal, { global: contextGlobal, console, require: cellRequire, __dirname: process.cwd() });
}

async function importFromCwd(specifier) {
  try {
    return await import(pathToFileURL(cellRequire.resolve(specifier)).href);
  } catch {
    return import(specifier); // a builtin, or what only ESM resolution finds
  }
}

const IMPORT = /^([ \t]*)import\s+(?:([\w$]+)\s*,?\s*)?(?:\*\s+as\s+([\w$]+)|(\{[^}]*\}))?\s*(?:from\s*)?(['"])([^'"\n]+)\5[ \t]*;?/gm;

// `import x, {a as b} from 'm'` -> `const x = <default of>(require('m')), {a: b} = require('m');`
function rewriteImports(code) {
  return code.replace(IMPORT, (all, indent, name, star, names, _q, spec) => {
    const req = `require(${JSON.stringify(spec)})`;
    const parts = [];
    if (name) parts.push(`${name} = ((m) => m && m.__esModule ? m.default : m)(${req})`);
    if (star) parts.push(`${star} = ${req}`);
    if (names) parts.push(`${names.replace(/([\w$]+)\s+as\s+([\w$]+)/g, '$1: $2')} = ${req}`);
    return parts.length ? `${indent}const ${parts.join(', ')};` : `${indent}${req};`;
  });
}

// Which characters of the code are outside strings, comments, templates and brackets: where a
// top-level statement may start. Regex literals are told from division by the character before.
function topLevel(code) {
  const top = new Uint8Array(code.length);
  const templates = []; // the bracket depth at each open `${`
  let depth = 0, prev = '', i = 0;
  const skipQuoted = (end, from) => {
    let j = from;
    while (j < code.length && code[j] !== end && code[j] !== '\n') j += code[j] === '\\' ? 2 : 1;
    return j + 1;
  };
  const skipTemplate = (from) => { // up to the closing backtick, or into a `${`
    let j = from;
    while (j < code.length && code[j] !== '`') {
      if (code[j] === '\\') j += 2;
      else if (code[j] === '$' && code[j + 1] === '{') { templates.push(depth); depth += 1; return j + 2; }
      else j += 1;
    }
    return j + 1;
  };
  while (i < code.length) {
    const c = code[i], n = code[i + 1];
    if (c === '/' && n === '/') { i = code.indexOf('\n', i); if (i < 0) break; continue; }
    if (c === '/' && n === '*') { i = code.indexOf('*/', i + 2); if (i < 0) break; i += 2; continue; }
    if (c === '"' || c === "'") { i = skipQuoted(c, i + 1); prev = c; continue; }
    if (c === '`') { i = skipTemplate(i + 1); prev = c; continue; }
    if (c === '/' && (prev === '' || '(,=:[!&|?{};+-*%<>~^\n'.includes(prev))) { i = skipQuoted('/', i + 1); prev = 'x'; continue; }
    if (c === '(' || c === '[' || c === '{') depth += 1;
    else if (c === ')' || c === ']' || c === '}') {
      depth -= 1;
      if (c === '}' && templates.length && templates[templates.length - 1] === depth) {
        templates.pop(); i = skipTemplate(i + 1); prev = '`'; continue;
      }
    } else if (depth === 0) top[i] = 1;
    if (c === '\n' || !/\s/.test(c)) prev = c;
    i += 1;
  }
  return top;
}

// A cell with top-level await, as the body of an async function. Its top-level declarations become
// assignments to globals of the context (sloppy mode), so later cells see them: `let x = ...` ->
// `x = ...` (x declared first if new), `const {a} = ...` -> `0, {a} = ...`, `class C` -> `C = class C`,
// and each `function f` is also stored as a global. The last expression is returned: the shortest
// run of last lines that compiles as `return (...)` is taken for it, unless it is a declaration.
const DECLARATION = /^\s*(let|const|var|class|function|async\s+function)\b/;

function asyncCell(code) {
  const top = topLevel(code);
  const declarations = code.split('\n'); // the lines as written: the rewrites below keep their count
  const declared = [], functions = [];
  const STATEMENT = /(^[ \t]*|;[ \t]*)(?:(?:let|const|var)\s+([\w$]+|[{[])|class\s+([\w$]+)|(?:async\s+)?function\s*\*?\s*([\w$]+))/gm;
  code = code.replace(STATEMENT, (all, lead, binding, cls, fn, at) => {
    if (!top[at + lead.length]) return all; // inside a block, a string, a comment
    if (fn) { functions.push(fn); return all; }
    if (cls) return `${lead}${cls} = class ${cls}`;
    if (binding === '{') return `${lead}0, {`;
    if (binding === '[') return `${lead};[`;
    declared.push(binding);
    return lead + binding;
  });
  for (const name of declared) {
    try { vm.runInContext(`var ${name};`, context); } catch { /* declared already: assign to it */ }
  }
  const head = functions.map((name) => `globalThis[${JSON.stringify(name)}] = ${name};`).join(' ');
  const lines = code.replace(/\s+$/, '').split('\n');
  const compile = (body) => new vm.Script(`(async () => { ${head}\n${body}\n})()`, {
    filename: CELL, lineOffset: -1, importModuleDynamically: importFromCwd });
  for (let k = lines.length - 1; k >= 0; k -= 1) {
    const tail = lines.slice(k).join('\n').replace(/[\s;]+$/, '');
    const before = lines.slice(0, k).filter((line) => line.trim()).pop() || '';
    // Not a line that closes a block, nor the body of an `if`/`while`/... on the line before.
    if (!tail || /^\s*(\/\/|\})/.test(lines[k]) || /^\s*(\}\s*)?(if|for|while|else|do|with)\b/.test(before)) continue;
    let script;
    try { script = compile(`${lines.slice(0, k).join('\n')}\nreturn (\n${tail}\n);`); } catch { continue; }
    return DECLARATION.test(declarations[k]) ? compile(code) : script; // a declaration has no value
  }
  return compile(code);
}

function compileCell(code) {
  code = rewriteImports(code);
  try {
    return { script: new vm.Script(code, { filename: CELL, importModuleDynamically: importFromCwd }), awaits: false };
  } catch (err) {
    if (!(err instanceof SyntaxError) || !/await/.test(err.message)) throw err;
    return { script: asyncCell(code), awaits: true };
  }
}

let interrupt = null; // rejects the await of the cell that runs, on SIGINT
process.on('SIGINT', () => { if (interrupt) interrupt(new Error('Script execution was interrupted by `SIGINT`')); });
process.on('uncaughtException', (err) => process.stderr.write(`Uncaught ${util.inspect(err)}\n`));
process.on('unhandledRejection', (err) => process.stderr.write(`Uncaught (in promise) ${util.inspect(err)}\n`));

function errorOf(err) {
  if (err === null || typeof err !== 'object') {
    return { name: 'Error', value: `Uncaught ${util.inspect(err)}`, traceback: [`Uncaught ${util.inspect(err)}`] };
  }
  const stack = String(err.stack || `${err.name}: ${err.message}`).split('\n');
  const ours = stack.findIndex((line) => line.includes('node:vm') || line.includes(__filename));
  return { name: String(err.name || 'Error'), value: String(err.message ?? ''), traceback: ours < 0 ? stack : stack.slice(0, ours) };
}

async function run(code) {
  if (!code.trim()) return {};
  const { script, awaits } = compileCell(code);
  let value = script.runInContext(context, { breakOnSigint: true, displayErrors: true });
  if (awaits) {
    value = await new Promise((resolve, reject) => { interrupt = reject; value.then(resolve, reject); });
  }
  return value === undefined ? { value: null } : { value: util.inspect(value) };
}

// Math.random seeded anew in a restored copy: siblings forked from one snapshot share V8's state.
function reseed(hex) {
  const s = Uint32Array.from([0, 1, 2, 3], (k) => parseInt(hex.slice(k * 8, k * 8 + 8), 16) || k + 1);
  const rotl = (x, k) => (x << k) | (x >>> (32 - k));
  vm.runInContext('Math', context).random = function random() { // xoshiro128**
    const out = Math.imul(rotl(Math.imul(s[1], 5), 7), 9) >>> 0, t = s[1] << 9;
    s[2] ^= s[0]; s[3] ^= s[1]; s[1] ^= s[2]; s[0] ^= s[3]; s[2] ^= t; s[3] = rotl(s[3], 11);
    return out / 4294967296;
  };
}

async function handle(req) {
  const env = req.env && typeof req.env === 'object' ? req.env : {};
  if (req.op === 'restored') {
    Object.assign(process.env, env);
    if (typeof req.seed === 'string') reseed(req.seed);
    return {};
  }
  const saved = Object.fromEntries(Object.keys(env).map((k) => [k, process.env[k]]));
  Object.assign(process.env, env);
  try {
    return await run(String(req.code ?? ''));
  } catch (err) {
    return { error: errorOf(err) };
  } finally {
    interrupt = null;
    for (const [k, v] of Object.entries(saved)) {
      if (v === undefined) delete process.env[k]; else process.env[k] = v;
    }
  }
}

function done(answer) {
  process.stdout.write(`${MARK}${JSON.stringify(answer)}\n`);
  process.stderr.write(`${MARK}\n`);
}

let queue = Promise.resolve();
let pending = '';
const requests = new net.Socket({ fd: FD, readable: true, writable: false });
requests.setEncoding('utf8');
requests.on('data', (chunk) => {
  pending += chunk;
  let at;
  while ((at = pending.indexOf('\n')) >= 0) {
    const line = pending.slice(0, at);
    pending = pending.slice(at + 1);
    queue = queue.then(() => handle(JSON.parse(line))).then(done, (err) => done({ error: errorOf(err) }));
  }
});
requests.on('end', () => process.exit(0)); // the kernel went away
done({});
