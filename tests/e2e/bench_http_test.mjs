// `kiln bench http` against fake servers (raw TCP, so each one controls exactly when its
// connection closes): a server that closes after every response without saying so (as
// llama-server does), one that says `Connection: close`, and one whose failures have each
// cause bench http reports (HTTP status, error frame, malformed stream, transport).
//   node --test tests/e2e/bench_http_test.mjs   (KILN_BIN set by CTest)
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { execFile } from 'node:child_process';
import net from 'node:net';

const KILN = process.env.KILN_BIN;

const CHUNK = (text) => `data: ${JSON.stringify({ choices: [{ index: 0, delta: { content: text } }] })}\n\n`;
const USAGE = `data: ${JSON.stringify({ choices: [], usage: { prompt_tokens: 3, completion_tokens: 2 } })}\n\n`;
const GOOD_STREAM = CHUNK('a') + CHUNK('b') + USAGE + 'data: [DONE]\n\n';

function chunked(body) {
  return `${Buffer.byteLength(body).toString(16)}\r\n${body}\r\n0\r\n\r\n`;
}

// A raw HTTP/1.1 server: `respond(n, socket)` answers the n-th request (0-based, in arrival
// order) and returns true to keep the connection open. Counts connections and requests.
async function fakeServer(respond) {
  const stats = { connections: 0, requests: 0 };
  const server = net.createServer((socket) => {
    ++stats.connections;
    let pending = Buffer.alloc(0);
    let open = true;
    socket.on('error', () => {});
    socket.on('data', (d) => {
      pending = Buffer.concat([pending, d]);
      for (;;) {
        if (!open) return;
        const end = pending.indexOf('\r\n\r\n');
        if (end < 0) return;
        const head = pending.subarray(0, end).toString();
        const m = head.match(/content-length:\s*(\d+)/i);
        const total = end + 4 + (m ? Number(m[1]) : 0);
        if (pending.length < total) return;
        pending = pending.subarray(total);
        open = respond(stats.requests++, socket);
      }
    });
  });
  await new Promise((resolve) => server.listen(0, '127.0.0.1', resolve));
  return { server, stats, url: `http://127.0.0.1:${server.address().port}` };
}

function bench(url, args) {
  return new Promise((resolve) => execFile(KILN, ['bench', 'http', '--url', url, '--no-warmup',
    '--max-tokens', '2', '--prompt-tokens', '4', ...args], { timeout: 60000 },
  (e, stdout, stderr) => resolve({ code: e ? e.code : 0, stdout, stderr })));
}

// llama-server's behaviour: a keep-alive response (no Connection: close), then the server
// closes the connection. The next request on it fails before any byte of its response: the
// client must send it again on a fresh connection and count no failure.
test('bench http: a server that closes after each response is not blamed for it', async () => {
  const { server, stats, url } = await fakeServer((n, socket) => {
    socket.write('HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n');
    socket.end(chunked(GOOD_STREAM));
    return false;
  });
  try {
    const r = await bench(url, ['--concurrency', '1,2', '--requests', '6', '--json']);
    assert.equal(r.code, 0, r.stdout + r.stderr);
    const levels = JSON.parse(r.stdout).levels;
    for (const l of levels) {
      assert.equal(l.num_ok, 6, JSON.stringify(l));
      assert.equal(l.num_errors, 0);
      assert.deepEqual(l.errors_by_cause, { http_status: 0, error_frame: 0, stream: 0, transport: 0 });
      assert.equal(l.num_output_tokens, 12);
    }
    // Every request after a client's first found its kept-alive connection closed (at
    // concurrency 2, one client may have taken all six before the other started).
    assert.equal(levels[0].num_resent, 5);
    assert.ok(levels[1].num_resent === 4 || levels[1].num_resent === 5, `${levels[1].num_resent}`);
    assert.equal(stats.requests, 12);  // each request processed exactly once
  } finally {
    server.close();
  }
});

// A server that says `Connection: close`: the client closes too and never resends.
test('bench http: Connection: close is honoured', async () => {
  const { server, stats, url } = await fakeServer((n, socket) => {
    socket.write('HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nConnection: close\r\n' +
                 'Transfer-Encoding: chunked\r\n\r\n');
    socket.end(chunked(GOOD_STREAM));
    return false;
  });
  try {
    const r = await bench(url, ['--concurrency', '1', '--requests', '4', '--json']);
    assert.equal(r.code, 0, r.stdout + r.stderr);
    const l = JSON.parse(r.stdout).levels[0];
    assert.equal(l.num_ok, 4);
    assert.equal(l.num_resent, 0);
    assert.equal(stats.connections, 4);
    assert.equal(stats.requests, 4);
  } finally {
    server.close();
  }
});

// A server that stops answering on a kept-alive connection: the timeout is a transport
// failure, and the request is not sent again (the server may have been working on it).
test('bench http: a timeout on a kept-alive connection is a failure, not resent', async () => {
  const { server, stats, url } = await fakeServer((n, socket) => {
    if (n === 0) {
      socket.write('HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n' +
                   chunked(GOOD_STREAM));
    }
    return true;  // the second request is never answered
  });
  try {
    const r = await bench(url, ['--concurrency', '1', '--requests', '2', '--timeout', '1', '--json']);
    assert.equal(r.code, 1, r.stdout + r.stderr);
    const l = JSON.parse(r.stdout).levels[0];
    assert.equal(l.num_ok, 1);
    assert.deepEqual(l.errors_by_cause, { http_status: 0, error_frame: 0, stream: 0, transport: 1 });
    assert.equal(l.num_resent, 0);
    assert.match(l.errors[0], /^read header: /);
    assert.equal(stats.requests, 2);
  } finally {
    server.close();
  }
});

// One request of each failure cause, then a good one (the connection is kept alive where the
// response allows it).
test('bench http: failures are counted by cause', async () => {
  const sse = (body) => 'HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n' +
    chunked(body);
  const { server, url } = await fakeServer((n, socket) => {
    switch (n % 5) {
      case 0: {
        const body = JSON.stringify({ error: { message: 'busy', type: 'unavailable_error' } });
        socket.write(`HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\n` +
                     `Content-Length: ${body.length}\r\n\r\n${body}`);
        return true;
      }
      case 1:
        socket.write(sse(CHUNK('a') + `data: ${JSON.stringify({ error: { message: 'out of memory' } })}\n\n` +
                         'data: [DONE]\n\n'));
        return true;
      case 2:
        socket.write(sse('data: {"choices": [garbled\n\ndata: [DONE]\n\n'));
        return true;
      case 3:  // headers and half a stream, then the connection drops
        socket.write('HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n' +
                     `${Buffer.byteLength(CHUNK('a')).toString(16)}\r\n${CHUNK('a')}\r\n`);
        setTimeout(() => socket.destroy(), 50);
        return false;
      default:
        socket.write(sse(GOOD_STREAM));
        return true;
    }
  });
  try {
    const r = await bench(url, ['--concurrency', '1', '--requests', '5', '--json']);
    assert.equal(r.code, 1, r.stdout + r.stderr);
    const l = JSON.parse(r.stdout).levels[0];
    assert.equal(l.num_ok, 1, JSON.stringify(l));
    assert.equal(l.num_errors, 4);
    assert.deepEqual(l.errors_by_cause, { http_status: 1, error_frame: 1, stream: 1, transport: 1 });
    assert.deepEqual(l.errors_by_http_status, { 503: 1 });
    assert.equal(l.num_resent, 0);
    assert.match(l.errors[0], /^HTTP 503: .*busy/);
    assert.match(l.errors[1], /^error frame: .*out of memory/);
    assert.match(l.errors[2], /not JSON/);
    assert.match(l.errors[3], /^read body: /);

    // The table shows the same counts in its cause columns.
    const t = await bench(url, ['--concurrency', '1', '--requests', '5']);
    assert.equal(t.code, 1);
    assert.match(t.stdout, /\| conc \| +ok \| http \| frame \| stream \| +net \| resent \|/);
    assert.match(t.stdout, /\| +1 \| +1 \| +1 \| +1 \| +1 \| +1 \| +0 \|/);
    assert.match(t.stdout, /1 requests answered HTTP 503/);
  } finally {
    server.close();
  }
});
