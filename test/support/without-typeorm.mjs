// `node --import ./test/support/without-typeorm.mjs ...`: the process runs as if typeorm, @nestjs/typeorm,
// typeorm-transactional and @nestjs-cls/transactional-adapter-typeorm were not installed (see
// without-typeorm-hooks.mjs). Every attempt to import one is kept in `globalThis.typeormImportAttempts`.
import { register } from 'node:module';
import { MessageChannel } from 'node:worker_threads';

const attempts = [];
globalThis.typeormImportAttempts = attempts;
const { port1, port2 } = new MessageChannel();
port1.on('message', (specifier) => attempts.push(specifier));
// Messages only: the port must not keep the process alive.
port1.unref();
register('./without-typeorm-hooks.mjs', import.meta.url, { data: { port: port2 }, transferList: [port2] });
