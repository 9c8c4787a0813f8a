// End-to-end: the WebSocket mode of /v1/responses on the bundled kiln-tiny, driven by the
// official `openai` package's Responses WebSocket client (ResponsesWSBase) over node's
// built-in WebSocket (the package's own transport needs the `ws` package): two sequential
// turns on one socket, the dictionary function call then its output continued by
// previous_response_id with store: false; the same turns over HTTP give the same answer;
// after a reconnect the store: false id is previous_response_not_found. A raw socket (`net`)
// checks the handshake and that a protocol violation is closed with 1002, not a crash.
//   node --experimental-websocket --test tests/e2e/responses_websocket_test.mjs
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import net from 'node:net';
import crypto from 'node:crypto';
import OpenAI from 'openai';
import { startKiln, stopKiln } from './lib/kiln_server.mjs';
import { DICTIONARY_TOOL, RIVER } from './lib/kiln_tiny.mjs';
import { ResponsesWSBase } from 'openai/resources/responses/ws-base';

const DICTIONARY = { type: 'function', ...DICTIONARY_TOOL, strict: false };

let server;
let port;
let client;

before(async () => {
  assert.equal(typeof WebSocket, 'function', 'run node with --experimental-websocket');
  const started = await startKiln(['-t', '2', '--ctx', '2048', '--max-seqs', '4']);
  server = started.server;
  port = Number(new URL(started.base).port);
  client = new OpenAI({ baseURL: `http://127.0.0.1:${port}/v1`, apiKey: 'unused', maxRetries: 0 });
});

after(async () => {
  await stopKiln(server);
});

// The SDK's socket interface over node's global (WHATWG) WebSocket.
class GlobalWebSocket {
  constructor(url) {
    this._ws = new WebSocket(url);
    this._ws.binaryType = 'arraybuffer';
    this._wrapped = new Map();
  }
  get readyState() { return this._ws.readyState; }
  send(data) { this._ws.send(data); }
  close(code, reason) { this._ws.close(code, reason); }
  on(event, listener) {
    const wrapped = {
      message: (e) => listener(e.data, typeof e.data !== 'string'),
      close: (e) => listener(e.code, e.reason),
      error: () => listener(new Error('WebSocket error')),
      open: () => listener(),
    }[event];
    this._wrapped.set(listener, wrapped);
    this._ws.addEventListener(event, wrapped);
  }
  off(event, listener) {
    const wrapped = this._wrapped.get(listener);
    if (wrapped) this._ws.removeEventListener(event, wrapped);
  }
  once(event, listener) {
    const once = (...args) => { this.off(event, once); listener(...args); };
    this.on(event, once);
  }
}

class ResponsesSocket extends ResponsesWSBase {
  constructor(c) {
    super(c, {});
    this._connectInitial();
  }
  _createSocket(url) { return new GlobalWebSocket(url.toString()); }
}

// Connects; turn() sends one response.create and resolves with the events up to the
// terminal one (or the error event).
async function connect() {
  const rws = new ResponsesSocket(client);
  const events = [];
  const waiting = [];
  const deliver = (e) => {
    events.push(e);
    const w = waiting[0];
    if (w && w.done(e)) {
      waiting.shift();
      w.resolve(events.splice(0));
    }
  };
  rws.on('event', (e) => { if (e.type !== 'error') deliver(e); });
  rws.on('error', (err) => deliver({ type: 'error', ...err.error }));
  await new Promise((resolve, reject) => {
    rws.socket.once('open', resolve);
    rws.socket.once('close', (code) => reject(new Error(`closed ${code}`)));
  });
  const terminal = new Set(['response.completed', 'response.incomplete', 'response.failed', 'error']);
  return {
    rws,
    turn(body) {
      const p = new Promise((resolve) => waiting.push({ done: (e) => terminal.has(e.type), resolve }));
      rws.send({ type: 'response.create', ...body });
      return p;
    },
    close: () => rws.close({ code: 1000, reason: 'done' }),
  };
}

const base = { model: 'kiln', temperature: 0, max_output_tokens: 32, tools: [DICTIONARY], store: false };

test('two turns on one socket: a function call, then its output by previous_response_id (store: false)', async () => {
  const conn = await connect();
  const first = await conn.turn({ ...base, input: 'What does river mean?' });
  assert.deepEqual(first.slice(0, 2).map((e) => e.type), ['response.created', 'response.in_progress']);
  first.forEach((e, i) => assert.equal(e.sequence_number, i));
  const done1 = first.at(-1);
  assert.equal(done1.type, 'response.completed', JSON.stringify(done1));
  assert.equal(done1.response.store, false);
  const call = done1.response.output.find((o) => o.type === 'function_call');
  assert.ok(call, JSON.stringify(done1.response.output));
  assert.deepEqual(JSON.parse(call.arguments), { word: 'river' });
  assert.ok(first.some((e) => e.type === 'response.function_call_arguments.done'));
  // Not in the shared store: only this connection knows it.
  await assert.rejects(client.responses.retrieve(done1.response.id), (e) => e.status === 404);

  const second = await conn.turn({
    ...base, previous_response_id: done1.response.id,
    input: [{ type: 'function_call_output', call_id: call.call_id, output: RIVER }],
  });
  const done2 = second.at(-1);
  assert.equal(done2.type, 'response.completed', JSON.stringify(done2));
  assert.equal(done2.sequence_number, second.length - 1);
  assert.equal(done2.response.previous_response_id, done1.response.id);
  const text = second.filter((e) => e.type === 'response.output_text.delta').map((e) => e.delta).join('');
  const message = done2.response.output.find((o) => o.type === 'message');
  assert.equal(text, message.content[0].text);
  assert.match(text, /stream of water/, text);

  // Over HTTP, the whole conversation sent statelessly gives the same answer.
  const http = await client.responses.create({
    ...base,
    input: [{ role: 'user', content: 'What does river mean?' }, ...done1.response.output,
            { type: 'function_call_output', call_id: call.call_id, output: RIVER }],
  });
  assert.equal(http.output_text, text);
  conn.close();

  // After a reconnect the store: false response is gone: a clear error, the socket stays open.
  const again = await connect();
  const miss = await again.turn({ ...base, previous_response_id: done2.response.id, input: 'And creek?' });
  assert.equal(miss.length, 1);
  assert.equal(miss[0].type, 'error');
  assert.equal(miss[0].status, 404);
  assert.equal(miss[0].error.code, 'previous_response_not_found');
  assert.equal(miss[0].error.param, 'previous_response_id');
  const fresh = await again.turn({ ...base, input: 'What does apple mean?' });
  assert.equal(fresh.at(-1).type, 'response.completed');
  again.close();
});

// A raw client: the handshake's accept key, then an unmasked frame, which a server must
// answer with a close frame 1002 (RFC 6455 5.1).
test('raw socket: Sec-WebSocket-Accept, and an unmasked frame closes with 1002', async () => {
  const key = crypto.randomBytes(16).toString('base64');
  const expected = crypto.createHash('sha1').update(key + '258EAFA5-E914-47DA-95CA-C5AB0DC85B11').digest('base64');
  const sock = net.connect(port, '127.0.0.1');
  let buf = Buffer.alloc(0);
  const closed = new Promise((r) => sock.on('close', r));
  sock.on('data', (d) => { buf = Buffer.concat([buf, d]); });
  await new Promise((r) => sock.on('connect', r));
  sock.write(`GET /v1/responses HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n` +
             `Sec-WebSocket-Version: 13\r\nSec-WebSocket-Key: ${key}\r\n\r\n`);
  const until = async (pred) => {
    for (let i = 0; i < 200 && !pred(); i++) await new Promise((r) => setTimeout(r, 25));
  };
  await until(() => buf.includes('\r\n\r\n'));
  const head = buf.subarray(0, buf.indexOf('\r\n\r\n') + 4).toString();
  assert.match(head, /^HTTP\/1\.1 101 /);
  assert.ok(head.includes(`Sec-WebSocket-Accept: ${expected}\r\n`), head);
  buf = buf.subarray(head.length);
  sock.write(Buffer.from([0x81, 0x02, 0x7b, 0x7d]));  // text "{}" without a mask
  await until(() => buf.length >= 4);
  assert.equal(buf[0], 0x88);  // a close frame
  assert.equal(buf.readUInt16BE(2), 1002);
  sock.end();
  await closed;
  // The server is fine.
  assert.equal((await fetch(`http://127.0.0.1:${port}/health`)).status, 200);
});
