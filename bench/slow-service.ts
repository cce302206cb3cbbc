/**
 * The other company's API of the realistic handler (scenario 9): a tiny
 * node:http server on loopback that answers every POST after
 * `BENCH_SERVICE_DELAY_MS`. It runs in a process of its own, so its CPU is
 * neither the app's nor the load generator's. Started by `SlowService` in
 * app-process.ts, which reads its port from the `ready` message.
 */
import { randomUUID } from 'node:crypto';
import { createServer } from 'node:http';
import type { AddressInfo } from 'node:net';

const delayMs = Number(process.env.BENCH_SERVICE_DELAY_MS ?? 5);

const server = createServer((request, response) => {
  // Drained before answering, as a real service reads the whole request.
  request.resume();
  request.on('end', () => {
    setTimeout(() => {
      const body = JSON.stringify({ id: `auth_${randomUUID()}`, status: 'authorized' });
      response.writeHead(200, { 'content-type': 'application/json', 'content-length': Buffer.byteLength(body) });
      response.end(body);
    }, delayMs);
  });
});
// Longer than any pause between two requests of a run, so the app's keep-alive connections stay open.
server.keepAliveTimeout = 60_000;

server.listen(0, '127.0.0.1', () => {
  process.send!({ type: 'ready', port: (server.address() as AddressInfo).port });
});
// The runner going away (even by a crash) ends the service too.
process.on('disconnect', () => process.exit(0));
