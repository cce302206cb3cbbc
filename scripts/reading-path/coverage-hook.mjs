// Preloaded into the bench app (BENCH_APP_NODE_ARGS=--import=<this file>) by scripts/reading-path.mjs: precise
// V8 coverage of the whole process, taken on SIGUSR2 into READING_PATH_COVERAGE_FILE.<n>.json. Taking coverage
// resets the counters, so each file holds what ran since the previous signal.
import { writeFileSync } from 'node:fs';
import { Session } from 'node:inspector';

const session = new Session();
session.connect();
const post = (method, params) =>
  new Promise((resolve, reject) => session.post(method, params, (error, result) => (error ? reject(error) : resolve(result))));
await post('Profiler.enable');
await post('Profiler.startPreciseCoverage', { callCount: true, detailed: true });
let taken = 0;
process.on('SIGUSR2', () => {
  post('Profiler.takePreciseCoverage').then(({ result }) => {
    writeFileSync(`${process.env.READING_PATH_COVERAGE_FILE}.${taken++}.json`, JSON.stringify(result));
  });
});
