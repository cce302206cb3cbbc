import { execFile } from 'node:child_process';
import { join } from 'node:path';
import { promisify } from 'node:util';

// Jest loads global setup through require() without its module mapper, so
// the base setup is named without the `.js` that ESM source needs.
const BASE_SETUP = '../../support/global-setup';

/**
 * The default run's setup (a database: DATABASE_URL or an embedded server),
 * then one compilation of the sample app, which the scenarios start as real
 * processes (`node dist-sample/sample-app/main.js`).
 */
export default async function reliabilityGlobalSetup(_globalConfig: unknown, projectConfig: { rootDir: string }): Promise<void> {
  const { default: baseSetup } = (await import(BASE_SETUP)) as typeof import('../../support/global-setup.js');
  await baseSetup();
  const root = projectConfig.rootDir;
  const started = Date.now();
  try {
    await promisify(execFile)(
      process.execPath,
      [join(root, 'node_modules', 'typescript', 'bin', 'tsc'), '-p', 'tsconfig.sample.json'],
      {
        cwd: root,
        maxBuffer: 16 * 1024 * 1024,
      },
    );
  } catch (error) {
    const { stdout, stderr } = error as { stdout?: string; stderr?: string };
    throw new Error(`Compiling the sample app (tsc -p tsconfig.sample.json) failed:\n${stdout ?? ''}${stderr ?? ''}`, {
      cause: error,
    });
  }
  console.log(`Compiled the sample app into dist-sample/ in ${Date.now() - started} ms.`);
}
