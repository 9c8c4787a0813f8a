// `kiln serve` for the e2e suites: started on a free port (`--port 0`; the port is read from
// its "listening on" line), waited for until /health answers, and stopped with SIGTERM.
// KILN_BIN (set by CTest) is the binary; KILN_MODEL is left out of its environment, so a
// suite that passes no -m gets the bundled default model.
import { spawn } from 'node:child_process';

export async function waitHealthy(base, ms = 30000) {
  const end = Date.now() + ms;
  for (;;) {
    try {
      if ((await fetch(`${base}/health`)).status === 200) return;
    } catch {}
    if (Date.now() > end) throw new Error('server did not become healthy');
    await new Promise((r) => setTimeout(r, 100));
  }
}

// Resolves to { server, base, log() } once the server is healthy; rejects with its stderr if it
// exits first.
export async function startKiln(args, { healthMs = 30000 } = {}) {
  const env = { ...process.env };
  delete env.KILN_MODEL;
  const server = spawn(process.env.KILN_BIN, ['serve', '--port', '0', ...args],
                       { stdio: ['ignore', 'ignore', 'pipe'], env });
  let log = '';
  const port = await new Promise((resolve, reject) => {
    server.stderr.on('data', (d) => {
      log += d.toString();
      const m = log.match(/listening on http:\/\/[^:]+:(\d+)/);
      if (m) resolve(Number(m[1]));
    });
    server.on('exit', (code) => reject(new Error(`kiln serve exited ${code}: ${log}`)));
  });
  const base = `http://127.0.0.1:${port}`;
  try {
    await waitHealthy(base, healthMs);
  } catch (e) {
    server.kill('SIGKILL');
    throw new Error(`${e.message}: ${log}`);
  }
  return { server, base, log: () => log };
}

export async function stopKiln(server) {
  if (server === undefined || server.exitCode !== null) return;
  const exited = new Promise((r) => server.on('exit', r));
  server.kill('SIGTERM');
  await exited;
}
